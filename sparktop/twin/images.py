"""The twin's image store: an image's size, and `docker save` / `docker load` as tar streams that keep its ID.

An image is an entry of the host's config (`name`, optional `id`, `env`,
`entrypoint`, `size` in bytes; 20 GB, an engine image's size, when none is
given). `docker save IMAGE` writes a tar as Docker's does in spirit:
`manifest.json` naming the image's config blob and its layer, each under
`blobs/sha256/<digest>`, the layer `size` bytes of data generated from the
image's name. `docker load` reads such a stream, checks every blob against
its digest (a stream cut short or damaged is an error, nothing is added),
and adds the image with the ID the config carries, so the ID on the loading
host equals the saving host's, as Docker's content-addressed IDs do.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import sys
import tarfile
from typing import BinaryIO

from sparktop.twin.containers import DockerError, image_entrypoint, image_env, image_id
from sparktop.twin.host import TwinHost, write_json

DEFAULT_SIZE = 20_000_000_000  # an engine image's order of size, what `docker images` says when no size is given
CHUNK = 1 << 20


def entry_of(host: TwinHost, ref: str) -> dict | None:
    for entry in host.images:
        name = entry["name"] if isinstance(entry, dict) else entry
        if name == ref or (":" not in ref and name == f"{ref}:latest"):
            return entry if isinstance(entry, dict) else {"name": entry}
    return None


def image_size(host: TwinHost, ref: str) -> int:
    entry = entry_of(host, ref) or {}
    return int(entry.get("size") or DEFAULT_SIZE)


def human_size(size: int) -> str:
    """As the Docker CLI prints an image's size (powers of 1000, three significant figures)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.3g}{unit}"
        value /= 1000
    return f"{value:.3g}TB"


class _Layer(io.RawIOBase):
    """`size` bytes generated from a seed, read in chunks (never all in memory)."""

    def __init__(self, seed: str, size: int):
        self._random = random.Random(seed)
        self._left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        self._left -= n
        return self._random.randbytes(n)


def _layer_digest(seed: str, size: int) -> str:
    digest, layer = hashlib.sha256(), _Layer(seed, size)
    while chunk := layer.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes | BinaryIO, size: int | None = None) -> None:
    info = tarfile.TarInfo(name)
    if isinstance(data, bytes):
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        info.size = size or 0
        tar.addfile(info, data)


def cmd_save(host: TwinHost, argv: list[str]) -> int:
    out_path, refs = None, []
    it = iter(argv)
    for arg in it:
        if arg in ("-o", "--output"):
            out_path = next(it, None)
        elif arg.startswith("--output="):
            out_path = arg.split("=", 1)[1]
        else:
            refs.append(arg)
    if len(refs) != 1:
        raise DockerError('"docker save" requires 1 image here (the twin saves one at a time).', 1)
    ref = refs[0]
    entry = entry_of(host, ref)
    if entry is None:
        raise DockerError(f"Error response from daemon: reference does not exist: {ref}", 1)
    if out_path is None and sys.stdout.isatty():
        raise DockerError("cowardly refusing to save to a terminal. Use the -o flag or redirect", 1)
    size = image_size(host, ref)
    name = entry["name"]
    config = json.dumps({"id": image_id(host, ref), "name": name, "env": image_env(host, name),
                         "entrypoint": image_entrypoint(host, name), "size": size}, sort_keys=True).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    layer_digest = _layer_digest(name, size)
    manifest = json.dumps([{"Config": f"blobs/sha256/{config_digest}", "RepoTags": [name],
                            "Layers": [f"blobs/sha256/{layer_digest}"]}]).encode()
    sink = open(out_path, "wb") if out_path else sys.stdout.buffer  # noqa: SIM115
    try:
        with tarfile.open(fileobj=sink, mode="w|") as tar:
            _add(tar, f"blobs/sha256/{layer_digest}", _Layer(name, size), size)  # type: ignore[arg-type]
            _add(tar, f"blobs/sha256/{config_digest}", config)
            _add(tar, "manifest.json", manifest)
    finally:
        if out_path:
            sink.close()
        else:
            sink.flush()
    return 0


def cmd_load(host: TwinHost, argv: list[str]) -> int:
    in_path, quiet = None, False
    it = iter(argv)
    for arg in it:
        if arg in ("-i", "--input"):
            in_path = next(it, None)
        elif arg.startswith("--input="):
            in_path = arg.split("=", 1)[1]
        elif arg in ("-q", "--quiet"):
            quiet = True
        else:
            raise DockerError(f"unknown flag: {arg}", 125)
    if in_path is None and sys.stdin.isatty():
        raise DockerError("requested load from stdin, but stdin is empty", 1)
    source = open(in_path, "rb") if in_path else sys.stdin.buffer  # noqa: SIM115
    blobs: dict[str, bytes | None] = {}  # digest -> the blob when small (a config), None for a layer checked
    manifest = None
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                f = tar.extractfile(member)
                if f is None:
                    continue
                digest, kept = hashlib.sha256(), bytearray()
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    if member.size <= CHUNK:
                        kept += chunk
                if member.name == "manifest.json":
                    manifest = json.loads(kept)
                elif member.name.startswith("blobs/sha256/"):
                    want = member.name.rsplit("/", 1)[-1]
                    if digest.hexdigest() != want:
                        raise DockerError(f"Error response from daemon: invalid diffID for {member.name}", 1)
                    blobs[member.name] = bytes(kept) if member.size <= CHUNK else None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DockerError(f"Error response from daemon: unexpected EOF ({exc})", 1) from None
    finally:
        if in_path:
            source.close()
    if not isinstance(manifest, list) or not manifest:
        raise DockerError("Error response from daemon: open manifest.json: no such file or directory", 1)
    loaded = []
    for item in manifest:
        missing = [b for b in [item.get("Config"), *item.get("Layers", [])] if b not in blobs]
        config_blob = blobs.get(item.get("Config"))
        if missing or config_blob is None:
            raise DockerError(f"Error response from daemon: {missing[0] if missing else 'config'} is missing", 1)
        config = json.loads(config_blob)
        entry = {"name": config["name"], "id": config["id"], "size": config["size"]}
        if config.get("env"):
            entry["env"] = config["env"]
        if config.get("entrypoint"):
            entry["entrypoint"] = config["entrypoint"]
        put_image(host, entry)
        loaded.append(config["name"])
    if not quiet:
        for name in loaded:
            print(f"Loaded image: {name}")
    return 0


def put_image(host: TwinHost, entry: dict) -> None:
    """Add (or replace) an image in the host's config."""
    config = host.config
    images = [e for e in config.get("images", []) if (e["name"] if isinstance(e, dict) else e) != entry["name"]]
    config["images"] = [*images, entry]
    write_json(host.home / "config.json", config)
