"""A small generated model in a Hugging Face cache, laid out as the hub lays one out: blobs named by their
sha256, a snapshot folder of relative symlinks to them, `refs/main` naming the revision."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_snapshot(hub: Path, repo_id: str, files: dict[str, int], revision: str = REVISION) -> dict[str, int]:
    """`files` (name: bytes) of generated data plus a `config.json`, under `hub/models--org--name`. Returns every
    snapshot file's size by name."""
    folder = hub / ("models--" + repo_id.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snap = folder / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    contents = {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                           "num_hidden_layers": 2, "model_type": "llama"}).encode()}
    sizes = {"config.json": len(contents["config.json"])}
    for name, size in files.items():
        sizes[name] = size
    for name, size in sizes.items():
        data = contents.get(name) or random.Random(f"{repo_id}/{name}").randbytes(size)
        sha = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / sha).write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(folder / "blobs" / sha, link.parent), link)
    (folder / "refs" / "main").write_text(revision)
    return sizes
