"""Regenerate screenshots/study-report.png: a study report's HTML in Chromium.

    python scripts/report_screenshot.py                 # the test suite's synthetic five-topology study
    python scripts/report_screenshot.py STUDY           # a real study (id or directory)
    python scripts/report_screenshot.py --height 6000   # more of the page

Writes the report (report.md with its charts, report.html) into a temporary
directory for the synthetic study, or into the study's own report/ for a real
one, then has headless Chromium (`apt-get install chromium`) open the HTML
file offline and save a 1280-pixel-wide screenshot.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparktop.study import report  # noqa: E402
from sparktop.study.state import load_study  # noqa: E402

OUT = ROOT / "screenshots" / "study-report.png"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", nargs="?", help="a study id or directory (default: the synthetic test study)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=2400)
    args = ap.parse_args()
    browser = next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)
    if browser is None:
        print("no Chromium found: apt-get install chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        if args.study:
            study = load_study(args.study)
            out_dir = study.report_dir
        else:
            from tests.unit.test_study_report import make_study

            study = make_study(Path(tmp) / "studies")
            out_dir = Path(tmp) / "report"
        md, page = report.write_all(study, out_dir)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", f"--user-data-dir={Path(tmp) / 'profile'}",
                               f"--screenshot={args.out.resolve()}", f"--window-size={args.width},{args.height}",
                               page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
        if done.returncode != 0 or not args.out.exists():
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
    print(f"wrote {args.out} from {page if args.study else 'the synthetic study'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
