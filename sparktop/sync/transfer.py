"""`sparktop sync`: copy a Hugging Face snapshot or a Docker image from the node that has it to those that lack it.

A model goes with the real rsync, run on the source node, over SSH to the
target's fabric address (its `host` where the inventory gives none), into
a staging folder beside the target's cache (`<hf_cache>/.sparktop-sync/`,
on the same filesystem, so moving it in is a rename). `--partial` keeps an
interrupted file there and the next sync resumes from it. Only when every
file is there with the source's size, and the source did not change while
it was copied (its listing, sizes and mtimes, taken again at the end), is
the folder moved into `hub/` (blobs first, then the snapshot's symlinks,
then refs: a reader never finds a symlink to a blob that is not there yet).
The target's rsync and that move run under `flock -n` on a file beside the
staging folder, so a second sync of the same model to the same node is
refused rather than mixed in.

An image goes as `docker save | dd | ssh target docker load`, streamed from
the source (dd counts the bytes through the pipe), and the target's image
ID must then equal the source's.

Nodes reach each other with `$RSYNC_RSH` where set on the source (rsync's
own variable: an ssh with its options), else `ssh`, always with
`BatchMode=yes` (`remote.peers`, which `sparktop setup` checks the nodes
with): a host key the source does not know fails the copy, with the
reason; nothing here accepts a key.

Every value that reaches a shell is quoted with `shlex.quote`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from sparktop.errors import SparktopError
from sparktop.events import emitting
from sparktop.remote import Transport, TransportError, peers
from sparktop.settings import Inventory, Node
from sparktop.sync import hfcache
from sparktop.sync.events import (
    CommandShown,
    Found,
    Refused,
    Skipped,
    SyncEvent,
    TransferDone,
    TransferProgress,
    TransferStarted,
)
from sparktop.sync.progress import exit_words, parse_dd, parse_progress2, parse_stats, rsync_reason

STAGING = ".sparktop-sync"  # beside hub/ in the cache: same filesystem, and not a folder `hf cache scan` reads
PID_MARK, EXIT_MARK = "@sparktop-pid ", "@sparktop-exit "
KIB = 1024


class SyncError(SparktopError):
    """A sync that cannot start: nothing to copy from, an unknown node."""


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


@dataclass
class SyncRequest:
    what: str  # a repo id or an image
    kind: str  # model | image
    source: str | None = None
    targets: list[str] = field(default_factory=list)  # none: every other node
    dry_run: bool = False
    bwlimit: str | None = None  # rsync's --bwlimit (a model's copy only)


def ssh_command(target: Node) -> str:
    """The ssh the source runs to reach `target`, as shell words (`$RSYNC_RSH` expanded on the source): the one
    `sparktop setup` checks the nodes with (`remote.peers`)."""
    return peers.ssh_command(target.port)


def address_of(target: Node, source: Node | None = None) -> str:
    """Where the source sends the bytes: the fabric address where there is one, else the target's host. A target
    the inventory names `localhost` (this machine) has no address another node could use: an error."""
    if not target.fabric_ip and target.is_local and source is not None and not source.is_local:
        raise SyncError(f"{source.name} cannot reach {target.name}: the inventory gives {target.name} no fabric_ip "
                        f"and its host is {target.host or 'localhost'} (add `fabric_ip:` to {target.name})")
    host = target.fabric_ip or target.host
    return f"{target.user}@{host}" if target.user else host


def streamed(script: str) -> str:
    """Run `script` under bash in the background, in a process group of its own (`set -m`), say that group's id
    and then its exit status, and turn the progress lines' carriage returns into newlines as they come (stdbuf:
    tr would otherwise hold them in a 4 kB buffer). The group is what a cancel kills: rsync and its ssh, or
    every command of the docker pipeline."""
    inner = "set -o pipefail; " + script
    # The job's stderr joins its stdout; the shell's own (job control's "[1]+ Exit 3 ..." notices) goes nowhere.
    # The exit status on a line of its own: a process killed mid-line left its last progress line unfinished.
    outer = (f"{{ set -m; bash -c {shlex.quote(inner)} 2>&1 & echo \"{PID_MARK}$!\"; wait $!; s=$?; "
             f"echo; echo \"{EXIT_MARK}$s\"; }} 2>/dev/null | stdbuf -o0 tr '\\r' '\\n'")
    return "bash -c " + shlex.quote(outer)


@dataclass
class _Paths:
    cache: str  # the node's HF cache, absolute
    hub: str
    staging: str


class Syncer:
    """Copies one model or image; `events(request)` is the work and its reports."""

    def __init__(self, inventory: Inventory, transports: dict[str, Transport]):
        self.inventory = inventory
        self.transports = transports
        self._homes: dict[str, str] = {}
        self.failed = False

    def events(self, request: SyncRequest) -> AsyncIterator[SyncEvent]:
        return emitting(lambda emit: self._run(request, emit))

    async def _run(self, request: SyncRequest, emit: Callable[[SyncEvent], None]) -> None:
        names = [n.name for n in self.inventory.nodes]
        # A node named by its name or its host; an unknown one is a ConfigError naming the known ones.
        request = dataclasses.replace(
            request, source=self.inventory.node(request.source).name if request.source else None,
            targets=[self.inventory.node(t).name for t in request.targets or []])
        if request.kind == "model":
            await self._model(request, names, emit)
        else:
            await self._image(request, names, emit)

    # -- helpers ---------------------------------------------------------------------

    async def _run_on(self, node: str, cmd: str, timeout: float | None = 60.0):
        return await self.transports[node].run(cmd, timeout=timeout)

    async def paths(self, node: str) -> _Paths:
        cache = self.inventory.defaults.hf_cache.rstrip("/") or "/"
        if cache.startswith("~/") or cache == "~":
            if node not in self._homes:
                r = await self._run_on(node, 'printf %s "$HOME"')
                if not r.ok or not r.stdout.startswith("/"):
                    raise TransportError(node, f"cannot read $HOME: {r.first_error_line()}")
                self._homes[node] = r.stdout
            cache = self._homes[node] + cache[1:]
        return _Paths(cache, f"{cache}/hub", f"{cache}/{STAGING}")

    async def _listing(self, node: str, hub: str, repo: str) -> hfcache.CachedModel | None:
        r = await self._run_on(node, hfcache.listing_script(shlex.quote(hub), repo), timeout=120)
        if not r.ok:
            raise TransportError(node, f"cannot list {hub}: {r.first_error_line()}")
        return hfcache.parse_listing(r.stdout, repo).get(repo)

    async def free_bytes(self, node: str, path: str) -> int:
        """Free bytes on the filesystem `path` is (or would be) on: df of its nearest existing ancestor."""
        cmd = (f"p={shlex.quote(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
               "df -Pk \"$p\" | tail -n 1")
        r = await self._run_on(node, cmd)
        fields = r.stdout.split()
        if not r.ok or len(fields) < 4 or not fields[3].isdigit():
            raise TransportError(node, f"cannot read the free space of {path} (df -Pk): {r.first_error_line()}")
        return int(fields[3]) * KIB

    async def _link_bps(self, node: Node) -> float | None:
        """The source's fabric link rate in bytes per second, from its interface's speed (Mb/s)."""
        if not node.eth_if:
            return None
        cmd = f'cat "${{SPARKTOP_SYS_ROOT:-/sys}}"/class/net/{shlex.quote(node.eth_if)}/speed 2>/dev/null'
        with contextlib.suppress(TransportError):
            r = await self._run_on(node.name, cmd)
            if r.ok and r.stdout.strip().isdigit() and int(r.stdout) > 0:
                return int(r.stdout) * 1e6 / 8
        return None

    async def _stream(self, source: str, script: str, on_line: Callable[[str], None]) -> tuple[int, list[str]]:
        """Run `streamed(script)` on the source; every line to `on_line`; (exit status, the lines). A cancel kills
        the process on the source (TERM: rsync --partial keeps what arrived) before it goes on."""
        pid: list[str] = []
        lines: list[str] = []
        status = 255
        try:
            async for line in self.transports[source].stream(streamed(script)):
                for mark in (PID_MARK, EXIT_MARK):  # a marker the job's output ran into, without a newline
                    at = line.find(mark)
                    if at > 0:
                        lines.append(line[:at])
                        on_line(line[:at])
                        line = line[at:]
                if line.startswith(PID_MARK):
                    pid.append(line[len(PID_MARK):].strip())
                elif line.startswith(EXIT_MARK):
                    value = line[len(EXIT_MARK):].strip()
                    status = int(value) if value.isdigit() else 255
                else:
                    lines.append(line)
                    on_line(line)
        except BaseException:
            if pid and pid[0].isdigit():
                with contextlib.suppress(Exception):
                    # The group (a negative pid): rsync and the ssh it started, or the whole pipeline.
                    await asyncio.shield(self._run_on(source, f"kill -TERM -{int(pid[0])} 2>/dev/null", timeout=10))
            raise
        return status, lines

    # -- a model ----------------------------------------------------------------------

    async def _model(self, req: SyncRequest, names: list[str], emit) -> None:
        repo = req.what
        found: dict[str, hfcache.CachedModel | None] = {}
        states: list[tuple[str, str]] = []
        paths: dict[str, _Paths] = {}

        async def look(name: str) -> None:
            try:
                paths[name] = await self.paths(name)
                found[name] = await self._listing(name, paths[name].hub, repo)
            except TransportError as exc:
                found[name] = None
                states.append((name, f"unreachable: {exc.message}"))

        await asyncio.gather(*(look(n) for n in names))
        for name in names:
            model = found.get(name)
            if name in paths and model is None:
                states.append((name, "not cached"))
            elif model is not None:
                problems = model.problems()
                states.append((name, f"has it ({human_bytes(model.size)}, revision {(model.revision or '?')[:12]})"
                               if not problems else f"incomplete: {problems[0]}"))
        states.sort(key=lambda s: names.index(s[0]))
        source = req.source
        if source is None:
            source = next((n for n in names if (m := found.get(n)) is not None and m.complete), None)
            if source is None:
                raise SyncError(f"no node has a complete snapshot of {repo} ("
                                + "; ".join(f"{n}: {s}" for n, s in states) + "); an image? add --image")
        src = found.get(source)
        if src is None or not src.complete:
            why = dict(states).get(source, "not cached")
            raise SyncError(f"{source} has no complete snapshot of {repo} to copy ({why})")
        emit(Found(repo, "model", source, tuple(states)))
        link = await self._link_bps(self.inventory.node(source))

        def has_it(target: str) -> str | None:
            have = found.get(target)
            if have is not None and not hfcache.missing_or_short(src, have):
                return f"{target} already has {repo} (every file, same sizes)"
            return None

        await self._each_target(req, names, source, dict(states), set(paths), has_it, lambda target: self._model_to(
            req, source, target, src, paths[source], paths[target], found.get(target), link, emit), emit)

    async def _model_to(self, req: SyncRequest, source: str, target: str, src: hfcache.CachedModel,
                        sp: _Paths, tp: _Paths, have: hfcache.CachedModel | None, link: float | None, emit) -> None:
        repo, folder = req.what, src.folder
        stage, dest = f"{tp.staging}/{folder}", f"{tp.hub}/{folder}"
        staged = await self._listing(target, tp.staging, repo) if not req.dry_run else None
        already = staged.size if staged is not None else 0
        needed = max(0, src.size - already)
        free = await self.free_bytes(target, tp.cache)
        if free < needed:
            self.failed = True
            emit(Refused(target, f"{target}: not enough space in {tp.cache} for {repo}: needs {human_bytes(needed)}, "
                                 f"{human_bytes(free)} free"))
            return
        node = self.inventory.node(target)
        via = address_of(node, self.inventory.node(source))
        # Refs are not left to rsync: a rewritten ref has the same 40 bytes, and rsync's quick check (size and mtime
        # to the second, against the staging folder or --link-dest's) can take it for the old one. They are
        # written from the source's listing once the copy is whole (`_refs_script`); an older attempt's go first.
        prepare = f"mkdir -p {shlex.quote(stage)} && rm -rf {shlex.quote(stage + '/refs')}"
        # --delete: the staging folder mirrors the source, so a file an older attempt staged that the source no
        # longer has is not moved into the cache with the rest.
        # -s (--protect-args): the remote path reaches the target's rsync as one argument, spaces and all, with
        # rsync before 3.2.4 too (later ones protect it by default).
        rsync = ["rsync", "-a", "-s", "--partial", "--delete", "--info=progress2", "--stats",
                 "--exclude=*" + hfcache.INCOMPLETE, "--exclude=/refs/"]
        if req.bwlimit:
            rsync.append(f"--bwlimit={req.bwlimit}")
        if have is not None:
            rsync.append(f"--link-dest={dest}")  # the blobs the target already has are linked, not sent
        # One sync at a time into a staging folder: the target's rsync runs under flock on a file beside it (the
        # lock goes with the process, so a sync that died holds nothing); a second one is refused, in words.
        lock = f"{stage}.lock"
        busy = f"another sparktop sync is copying {repo} into {stage} (it holds {lock})"
        rsync.append("--rsync-path=" + self._locked(lock, busy, 'rsync "$@"'))
        words = " ".join(shlex.quote(w) for w in rsync)
        rsync_line = (f'{words} -e "{ssh_command(node)}" {shlex.quote(sp.hub + "/" + folder + "/")} '
                      f"{shlex.quote(via + ':' + stage + '/')}")
        # Every step on the target runs under the staging folder's lock, and the move writes the refs again just
        # before it, in the same locked step: a second sync of the same model that cleared the staged refs between
        # this one's check and its move cannot leave a model without them in the cache.
        mkdir = f"mkdir -p {shlex.quote(tp.staging)} && " + self._locked(lock, busy, "sh -c " + shlex.quote(prepare))
        refs = self._refs_script(stage, src.refs)
        finish = self._locked(lock, busy, "sh -c " + shlex.quote(
            f"{refs}; {self._finish_script(tp.hub, stage, dest)}"))
        emit(CommandShown(target, mkdir))
        emit(CommandShown(source, rsync_line))
        emit(CommandShown(target, refs))
        emit(CommandShown(target, finish))
        if req.dry_run:
            return
        r = await self._run_on(target, mkdir)
        if not r.ok:
            self.failed = True
            emit(Refused(target, f"{target}: preparing {stage}: {r.first_error_line()}"))
            return
        emit(TransferStarted(target, source, src.size, via, link, already))

        def progress(line: str) -> None:
            p = parse_progress2(line)
            if p is not None:
                emit(TransferProgress(target, min(p.bytes, src.size), src.size, p.rate))

        status, lines = await self._stream(source, rsync_line, progress)
        if status != 0:
            self.failed = True
            why = rsync_reason(lines)
            emit(Refused(target, f"{target}: rsync on {source} failed ({exit_words(status)}): {why}; nothing was moved "
                                 f"into the cache, and the next sync resumes from {stage}"))
            return
        after = await self._listing(source, sp.hub, repo)
        changed = hfcache.changed_files(src, after)
        if changed:
            self.failed = True
            emit(Refused(target, f"{target}: {repo} changed on {source} while it was copied ({changed[0]}); "
                                 "nothing was moved into the cache"))
            return
        r = await self._run_on(target, refs)
        if not r.ok:
            self.failed = True
            emit(Refused(target, f"{target}: writing the refs in {stage} failed: {r.first_error_line()}"))
            return
        arrived = await self._listing(target, tp.staging, repo)
        short = hfcache.missing_or_short(src, arrived)
        if short:
            self.failed = True
            emit(Refused(target, f"{target}: the copy in {stage} is not whole ({short[0]}); nothing was moved into "
                                 "the cache"))
            return
        r = await self._run_on(target, finish, timeout=600)
        if not r.ok:
            self.failed = True
            emit(Refused(target, f"{target}: moving {stage} into {tp.hub} failed: {r.first_error_line()}"))
            return
        placed = await self._listing(target, tp.hub, repo)
        short = hfcache.missing_or_short(src, placed)
        if short:
            self.failed = True
            emit(Refused(target, f"{target}: {dest} is not whole after the move ({short[0]})"))
            return
        stats = parse_stats("\n".join(lines))
        files = sum(1 for e in src.entries.values() if e.kind == "f")
        links = sum(1 for e in src.entries.values() if e.kind == "l")
        emit(TransferDone(target, src.size, stats.get("Literal data"),
                          f"{files} files with the source's sizes, {links} snapshot links, in {dest}"))

    @staticmethod
    def _locked(lock: str, busy: str, command: str) -> str:
        """`command` run under `flock -n` on `lock` (its arguments, rsync's own when rsync runs it as its remote
        program, follow as "$@"); the lock held elsewhere prints `busy` and exits 75 (flock -E)."""
        inner = (f'flock -n -E 75 {shlex.quote(lock)} {command}; s=$?; '
                 f'if [ "$s" = 75 ]; then echo {shlex.quote(busy)} >&2; fi; exit "$s"')
        return f"sh -c {shlex.quote(inner)} sh"

    @staticmethod
    def _refs_script(stage: str, refs: dict[str, str]) -> str:
        """The source's refs, written into the staging folder as the hub writes them (the revision, no newline)."""
        lines = ["set -e"]
        for ref, rev in sorted(refs.items()):
            path = f"{stage}/refs/{ref}"
            lines.append(f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}; printf %s {shlex.quote(rev)} > "
                         f"{shlex.quote(path)}")
        return "; ".join(lines)

    @staticmethod
    def _finish_script(hub: str, stage: str, dest: str) -> str:
        """Move the staging folder into the cache: one rename when the model is not there at all; else merged
        (hard links, no bytes copied) blobs first, then snapshots, then the rest (refs, copied whatever their
        mtimes say: a rewritten ref has the same size)."""
        h, s, d = shlex.quote(hub), shlex.quote(stage), shlex.quote(dest)
        return (f"set -e; mkdir -p {h}; if [ ! -e {d} ]; then mv -T {s} {d}; else "
                f"for sub in blobs snapshots; do if [ -d {s}/$sub ]; then "
                f"rsync -a --link-dest={s}/$sub {s}/$sub/ {d}/$sub/; fi; done; "
                f"rsync -a --ignore-times --exclude=/blobs --exclude=/snapshots {s}/ {d}/; rm -rf {s}; fi")

    # -- an image ---------------------------------------------------------------------

    async def _inspect(self, node: str, image: str) -> tuple[str, int | None] | None:
        r = await self._run_on(node, f"docker image inspect --format '{{{{.Id}}}} {{{{.Size}}}}' {shlex.quote(image)}")
        if not r.ok:
            if r.exit_status == 127:
                raise TransportError(node, "docker is not installed")
            return None
        parts = r.stdout.split()
        if not parts:
            return None
        return parts[0], int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None

    async def _image(self, req: SyncRequest, names: list[str], emit) -> None:
        image = req.what
        ids: dict[str, tuple[str, int | None] | None] = {}
        states: dict[str, str] = {}

        async def look(name: str) -> None:
            try:
                ids[name] = await self._inspect(name, image)
                states[name] = f"has it ({ids[name][0][:19]})" if ids[name] else "not there"  # type: ignore[index]
            except TransportError as exc:
                states[name] = f"unreachable: {exc.message}"

        await asyncio.gather(*(look(n) for n in names))
        source = req.source or next((n for n in names if ids.get(n)), None)
        if source is None or not ids.get(source):
            where = "; ".join(f"{n}: {states.get(n, '?')}" for n in names)
            raise SyncError(f"{source or 'no node'} has no image {image} to copy ({where})")
        src_id, src_size = ids[source]  # type: ignore[misc]
        emit(Found(image, "image", source, tuple((n, states.get(n, "?")) for n in names)))
        link = await self._link_bps(self.inventory.node(source))

        def has_it(target: str) -> str | None:
            have = ids.get(target)
            return f"{target} already has {image} ({src_id[:19]})" if have and have[0] == src_id else None

        await self._each_target(req, names, source, states, set(ids), has_it, lambda target: self._image_to(
            req, source, target, src_id, src_size, link, emit), emit)

    async def _each_target(self, req: SyncRequest, names: list[str], source: str, states: dict[str, str],
                           read: set[str], has_it: Callable[[str], str | None],
                           copy: Callable[[str], Awaitable[None]], emit) -> None:
        """Copy to each target (those asked for, else every node but the source) in turn: the source itself
        skipped, a node that could not be read refused, one that has it already skipped; one target's trouble
        is a FAIL for it, and the others are still copied."""
        for target in req.targets or [n for n in names if n != source]:
            if target == source:
                emit(Skipped(target, f"{target} is the node it is copied from"))
                continue
            if target not in read:
                self.failed = True
                emit(Refused(target, f"{target}: {states.get(target, 'unreachable')}"))
                continue
            if (already := has_it(target)) is not None:
                emit(Skipped(target, already))
                continue
            try:
                await copy(target)
            except (TransportError, SyncError) as exc:
                self.failed = True
                emit(Refused(target, f"{target}: {exc.message if isinstance(exc, TransportError) else exc}"))

    async def _image_to(self, req: SyncRequest, source: str, target: str, src_id: str, size: int | None,
                        link: float | None, emit) -> None:
        image = req.what
        node = self.inventory.node(target)
        via = address_of(node, self.inventory.node(source))
        if size is not None and not req.dry_run:
            root = ("d=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null); "
                    "[ -d \"$d\" ] || d=/var/lib/docker; [ -d \"$d\" ] || d=/; printf %s \"$d\"")
            r = await self._run_on(target, root)
            where = r.stdout.strip() or "/"
            free = await self.free_bytes(target, where)
            if free < size:
                self.failed = True
                emit(Refused(target, f"{target}: not enough space in {where} for {image}: needs {human_bytes(size)}, "
                                     f"{human_bytes(free)} free"))
                return
        # `docker load` as two words: ssh hands the remote shell its arguments joined by spaces.
        script = (f"docker save {shlex.quote(image)} | dd bs=1M iflag=fullblock status=progress | "
                  f"{ssh_command(node)} {shlex.quote(via)} docker load")
        emit(CommandShown(source, script))
        if req.dry_run:
            return
        total = size or 0
        emit(TransferStarted(target, source, total, via, link))
        moved = [0]

        def progress(line: str) -> None:
            p = parse_dd(line)
            if p is not None:
                moved[0] = p[0]
                emit(TransferProgress(target, p[0], max(total, p[0]), p[1]))

        status, lines = await self._stream(source, script, progress)
        if status != 0:
            self.failed = True
            errors = [ln.strip() for ln in lines if ln.strip() and parse_dd(ln) is None
                      and "records in" not in ln and "records out" not in ln]
            emit(Refused(target, f"{target}: docker save | docker load from {source} failed (exit {status}): "
                                 f"{errors[-1] if errors else 'no message'}"))
            return
        got = await self._inspect(target, image)
        if not got or got[0] != src_id:
            self.failed = True
            emit(Refused(target, f"{target}: {image} loaded with ID {got[0][:19] if got else 'none'}, "
                                 f"{source} has {src_id[:19]}"))
            return
        emit(TransferDone(target, total or moved[0], moved[0], f"image ID {src_id[:19]} on both"))
