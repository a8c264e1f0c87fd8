"""The Hugging Face cache as a node holds it, read with one `find`.

The hub lays a model out as::

    hub/models--org--name/
        blobs/<sha>                     the files' bytes (`<sha>.incomplete` while downloading)
        snapshots/<rev>/config.json  -> ../../blobs/<sha>    one relative symlink per file
        refs/main                       the revision `main` points to

`listing_script(hub, repo)` prints every file and symlink under the cache
(or one model's folder), its kind, size, mtime and link target, then each
ref's revision; `parse_listing` turns that into `CachedModel`s. The same
listing, taken before and after a copy, says whether a snapshot changed
while it was copied (`changed_files`), and taken of the target's staging
folder, whether every file arrived whole (`missing_or_short`).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

INCOMPLETE = ".incomplete"  # huggingface_hub's suffix for a blob still being downloaded
REFS_MARK = "@refs"  # the line between the files and the refs in a listing


def repo_folder(repo_id: str) -> str:
    """`org/name` -> `models--org--name`, as huggingface_hub names it."""
    return "models--" + repo_id.replace("/", "--")


def repo_id_of(folder: str) -> str | None:
    """`models--org--name` -> `org/name` (the hub forbids `--` in names, so the first one is the slash)."""
    if not folder.startswith("models--"):
        return None
    rest = folder[len("models--"):]
    org, sep, name = rest.partition("--")
    return f"{org}/{name}" if sep else rest


def looks_like_repo_id(text: str) -> bool:
    """`org/name`: one slash, no tag or digest (an image has `:tag`, `@sha256:` or a registry's second slash)."""
    return text.count("/") == 1 and ":" not in text and "@" not in text and all(text.split("/"))


@dataclass(frozen=True)
class Entry:
    """One file or symlink under a model's folder, its path relative to that folder."""

    kind: str  # f (a file) or l (a symlink)
    size: int
    mtime: float
    path: str
    target: str = ""  # a symlink's target, as written (relative)


@dataclass
class CachedModel:
    repo_id: str
    folder: str
    entries: dict[str, Entry] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # ref name -> revision

    @property
    def size(self) -> int:
        """The bytes of its files, what a copy of the folder moves (refs included; a blob still downloading is
        not counted)."""
        return sum(e.size for e in self.entries.values() if e.kind == "f" and not e.path.endswith(INCOMPLETE))

    @property
    def revisions(self) -> list[str]:
        return sorted({p.split("/")[1] for p in self.entries if p.startswith("snapshots/") and p.count("/") >= 2})

    @property
    def revision(self) -> str | None:
        """The revision `main` points to, else the only snapshot's."""
        if "main" in self.refs:
            return self.refs["main"]
        revs = self.revisions
        return revs[0] if len(revs) == 1 else None

    def problems(self) -> list[str]:
        """Why the snapshot is not complete: a blob still downloading, a symlink to a blob that is not there,
        no snapshot at all."""
        out = [f"{p} is still downloading" for p in self.entries if p.startswith("blobs/") and p.endswith(INCOMPLETE)]
        rev = self.revision
        files = [e for p, e in self.entries.items() if p.startswith("snapshots/")
                 and (rev is None or p.split("/")[1] == rev)]
        if not files:
            out.append("no snapshot" if rev is None else f"no snapshot of revision {rev}")
        for e in files:
            if e.kind != "l":
                continue
            blob = posixpath.normpath(posixpath.join(posixpath.dirname(e.path), e.target))
            if blob not in self.entries or self.entries[blob].kind != "f":
                out.append(f"{e.path} points to {e.target}, which is missing")
        return out

    @property
    def complete(self) -> bool:
        return not self.problems()


def listing_script(hub: str, repo_id: str | None = None) -> str:
    """A shell command listing the cache under `hub` (an absolute path, or `"$HOME"/...` already rendered), or
    one model's folder. Lines: `f|l <TAB> size <TAB> mtime <TAB> path <TAB> link target`, then `@refs`, then
    `path <TAB> revision` for each ref. A cache that does not exist lists nothing."""
    root = f"{hub}/{shlex.quote(repo_folder(repo_id))}" if repo_id else hub
    depth = "-mindepth 1" if repo_id else "-mindepth 2"
    name = "" if repo_id else " -path '*/models--*'"
    return (
        f"if [ -d {root} ]; then cd {root} && "
        f"find . {depth}{name} \\( -type f -o -type l \\) -printf '%y\\t%s\\t%T@\\t%P\\t%l\\n'; fi; "
        f"echo {REFS_MARK}; "
        f"if [ -d {root} ]; then cd {root} && "
        f"find . {depth}{name} -path '*refs/*' -type f -exec sh -c "
        "'for f; do printf \"%s\\t%s\\n\" \"${f#./}\" \"$(head -c 100 \"$f\")\"; done' sh {} +; fi"
    )


def parse_listing(text: str, repo_id: str | None = None) -> dict[str, CachedModel]:
    """The models a listing names, by repo id. With `repo_id`, the listing was of that model's folder."""
    models: dict[str, CachedModel] = {}

    def model_for(path: str) -> tuple[CachedModel, str] | None:
        if repo_id is not None:
            folder, rest = repo_folder(repo_id), path
        else:
            folder, _, rest = path.partition("/")
        rid = repo_id or repo_id_of(folder)
        if rid is None or not rest:
            return None
        if rid not in models:
            models[rid] = CachedModel(rid, folder)
        return models[rid], rest

    in_refs = False
    for line in text.splitlines():
        if line == REFS_MARK:
            in_refs = True
            continue
        if not line.strip():
            continue
        if in_refs:
            path, _, rev = line.partition("\t")
            found = model_for(path)
            if found and found[1].startswith("refs/"):
                found[0].refs[found[1][len("refs/"):]] = rev.strip()
            continue
        parts = line.split("\t")
        if len(parts) < 4 or parts[0] not in ("f", "l"):
            continue
        found = model_for(parts[3])
        if found is None:
            continue
        model, rest = found
        try:
            size, mtime = int(parts[1]), float(parts[2])
        except ValueError:
            continue
        model.entries[rest] = Entry(parts[0], size, mtime, rest, parts[4] if len(parts) > 4 else "")
    return models


def changed_files(before: CachedModel, after: CachedModel | None) -> list[str]:
    """What differs between two listings of a model (size, mtime, a link's target, a file come or gone)."""
    if after is None:
        return ["the whole folder is gone"]
    out = []
    for path, a in before.entries.items():
        b = after.entries.get(path)
        if b is None:
            out.append(f"{path} is gone")
        elif (a.kind, a.size, a.target) != (b.kind, b.size, b.target) or (a.kind == "f" and a.mtime != b.mtime):
            out.append(f"{path} changed")
    out += [f"{p} appeared" for p in after.entries if p not in before.entries and not p.endswith(INCOMPLETE)]
    return out


def missing_or_short(source: CachedModel, copy: CachedModel | None) -> list[str]:
    """What the copy lacks of the source: a file missing or of another size, a symlink missing or elsewhere."""
    if copy is None:
        return ["nothing arrived"]
    out = []
    for path, e in source.entries.items():
        if path.endswith(INCOMPLETE):
            continue
        c = copy.entries.get(path)
        if c is None:
            out.append(f"{path} is missing")
        elif c.kind != e.kind or (e.kind == "f" and c.size != e.size) or (e.kind == "l" and c.target != e.target):
            out.append(f"{path} differs ({c.size} bytes, {e.size} expected)" if e.kind == "f"
                       else f"{path} differs")
    out += [f"refs/{ref} names {copy.refs.get(ref) or 'nothing'}, the source's {rev}"
            for ref, rev in source.refs.items() if copy.refs.get(ref) != rev]
    return out
