"""The study report's HTML in a real browser: Chromium, headless, offline.

The page must render from the file alone (no network), with its tables and
charts: the screenshot must exist and be a picture, not a blank page. Without
Chromium this fails (it is how the report is checked to open in a browser);
on Debian: `apt-get install chromium`."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from sparktop.study import report
from tests.unit.test_study_report import make_study


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium on this machine (looked for chromium, chromium-browser, google-chrome): the study "
                "report's HTML cannot be checked in a browser; install it (Debian: `apt-get install chromium`)")


def screenshot(page: Path, png: Path, tmp: Path, size: tuple[int, int] = (1280, 2400)) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         f"--user-data-dir={tmp / 'profile'}", f"--screenshot={png}", f"--window-size={size[0]},{size[1]}",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)


def pixels(png: Path) -> tuple[int, int, list[tuple[int, ...]]]:
    """Width, height and RGB(A) pixels of a PNG (PIL when installed, else zlib)."""
    try:
        from PIL import Image
    except ImportError:
        return _decode(png.read_bytes())
    im = Image.open(png).convert("RGB")
    raw = im.tobytes()
    return im.width, im.height, [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]


def _decode(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """An 8-bit RGB/RGBA non-interlaced PNG, as Chromium writes them."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = depth = ctype = 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            depth, ctype = body[8], body[9]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), f"unexpected PNG format (depth {depth}, colour type {ctype})"
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    out: list[tuple[int, ...]] = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += [tuple(line[i:i + 3]) for i in range(0, stride, bpp)]
        prev = line
    return width, height, out


def test_the_html_report_renders_offline_in_chromium(tmp_path):
    study = make_study(tmp_path / "studies")
    page = report.write(study, "html", tmp_path / "out")
    png = tmp_path / "report.png"
    done = screenshot(page, png, tmp_path)
    assert png.exists(), f"Chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-2000:]}"
    width, height, px = pixels(png)
    assert (width, height) == (1280, 2400)
    colours = set(px[::7])
    assert len(colours) > 200, f"only {len(colours)} colours: the page looks blank"
    ink = sum(1 for p in px[::7] if min(p) < 160) / len(px[::7])
    assert ink > 0.02, f"only {ink:.1%} of the page has ink on it: nothing rendered"
    # The topologies' line colours are there: the charts were drawn, not just the tables.
    from sparktop.study.charts import COLOURS

    near = {name: any(sum(abs(a - b) for a, b in zip(p, bytes.fromhex(c[1:]), strict=False)) < 30 for p in px[::3])
            for name, c in COLOURS.items()}
    assert all(near.values()), f"chart colours missing from the screenshot: {near}"


def test_the_png_reader_matches_pil(tmp_path):
    """The zlib fallback reads what PIL reads (checked where PIL is installed)."""
    pil = pytest.importorskip("PIL.Image")
    img = pil.new("RGB", (7, 5))
    for x in range(7):
        for y in range(5):
            img.putpixel((x, y), (x * 30, y * 50, (x * y * 13) % 256))
    img.save(tmp_path / "p.png")
    raw = img.tobytes()
    assert _decode((tmp_path / "p.png").read_bytes()) == (7, 5, [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)])
