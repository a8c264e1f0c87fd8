"""`sparktop sync` and `sparktop cache` between the lab's real OpenSSH hosts, with Debian's real rsync.

A generated snapshot (blobs, snapshot symlinks, refs/main) is copied from
spark-a's cache to spark-b's, node to node: sparktop runs rsync on spark-a,
which reaches spark-b over ssh with spark-a's own key and known_hosts
(`Lab.ssh_mesh`). An interrupted copy leaves nothing in spark-b's cache and
the next one resumes, which rsync's own `--stats` shows (fewer literal bytes
than the snapshot). The twin's docker saves and loads an image through the
same ssh, and the ID on spark-b must equal spark-a's.

Interruptions are made by polling the staging folder's size (a copy slowed
with --bwlimit so there is something to interrupt), never by sleeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparktop.twin.images import put_image
from tests.helpers.hfsnapshot import REVISION, write_snapshot
from tests.helpers.signals import ctrl_c_as_in_a_terminal
from tests.helpers.small_disk import small_tmpfs

pytestmark = [pytest.mark.lab, pytest.mark.slow]

if not __import__("shutil").which("rsync"):
    pytest.skip("rsync is not installed (scripts/test installs it)", allow_module_level=True)


def sparktop(lab, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True,
                          env=lab.env(), timeout=timeout)


def start_sparktop(lab, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sparktop", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=lab.env(), preexec_fn=ctrl_c_as_in_a_terminal)


@pytest.fixture(scope="module")
def inventory(lab) -> Path:
    """The lab's nodes, each with the RSYNC_RSH that points its ssh at its own keys and known_hosts."""
    rsh = lab.ssh_mesh()
    lines = ["nodes:"]
    for host in lab.hosts:
        lines += [f"  - name: {host.name}", f"    host: lab-{host.name}", f"    fabric_ip: {host.address}",
                  "    eth_if: enp1s0f1np1", "    env:", f"      RSYNC_RSH: {rsh[host.name]}"]
    path = lab.root / "sync-cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def hub(host) -> Path:
    return host.home / ".cache/huggingface/hub"


def staging(host) -> Path:
    return host.home / ".cache/huggingface/.sparktop-sync"


def tree(folder: Path) -> dict[str, tuple[str, int | str]]:
    """Every file (its size) and symlink (its target) under `folder`."""
    out: dict[str, tuple[str, int | str]] = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = ("l", os.readlink(path))
        elif path.is_file():
            out[rel] = ("f", path.stat().st_size)
    return out


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                with contextlib.suppress(FileNotFoundError):  # rsync renamed its temporary file meanwhile
                    total += p.stat().st_size
    return total


def wait_for(predicate, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:g}s")
        time.sleep(step)


def rsync_sending(host, folder: str):
    """The rsync that `host`'s sshd (which the lab started) runs to send `folder` from its cache, or None."""
    import psutil

    for child in psutil.Process(host.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if cmd and cmd[0].endswith("rsync") and "--server" not in cmd and any(folder in c for c in cmd):
                return child
    return None


def sent_bytes(out: str) -> int:
    m = re.search(r"sent \(([\d,]+) bytes\)", out)
    assert m, out
    return int(m.group(1).replace(",", ""))


def test_sync_copies_a_snapshot_node_to_node(lab, inventory):
    """spark-a's snapshot arrives whole in spark-b's cache (files, sizes, symlinks, refs), a second sync has
    nothing to do, and `cache` shows it complete on both."""
    a, b = lab.hosts[:2]
    repo = "lab-org/tiny-model"
    write_snapshot(hub(a), repo, {"model-00001-of-00002.safetensors": 3_000_000,
                                  "model-00002-of-00002.safetensors": 1_500_000, "tokenizer.json": 20_000})
    r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "spark-b" in r.stdout and "done" in r.stdout
    folder = "models--lab-org--tiny-model"
    assert tree(hub(b) / folder) == tree(hub(a) / folder)
    link = hub(b) / folder / "snapshots" / REVISION / "model-00001-of-00002.safetensors"
    assert link.is_symlink() and link.resolve().stat().st_size == 3_000_000
    assert (hub(b) / folder / "refs/main").read_text() == REVISION
    assert not (staging(b) / folder).exists()
    # A second sync has nothing to do.
    again = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    assert again.returncode == 0 and "already has" in again.stdout, again.stdout + again.stderr
    # ... and `cache` shows it complete on both nodes, as a table and as JSON.
    table = sparktop(lab, "cache", "--inventory", str(inventory))
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines() if repo in line]
    assert [r[:3] for r in rows] == [["spark-a", "model", repo], ["spark-b", "model", repo]], table.stdout
    assert all(f"complete, revision {REVISION[:12]}" in line for line in table.stdout.splitlines() if repo in line)
    shown = sparktop(lab, "cache", "--inventory", str(inventory), "--json")
    assert shown.returncode == 0, shown.stderr
    nodes = {n["node"]: n for n in json.loads(shown.stdout)}
    for name in ("spark-a", "spark-b"):
        model = next(m for m in nodes[name]["models"] if m["repo_id"] == repo)
        assert model["complete"] and model["revision"] == REVISION
        assert model["bytes"] == sum(s for _, s in tree(hub(a) / folder).values() if isinstance(s, int))


def test_a_new_revision_is_merged_beside_the_one_the_target_has(lab, inventory):
    """spark-b has an older revision; the new one's shared blob is linked from what spark-b has, not sent, and the
    staging folder is merged into the model's folder (both revisions, refs/main the new one)."""
    a, b = lab.hosts[:2]
    repo = "lab-org/two-revisions"
    folder = "models--lab-org--two-revisions"
    old, new = "1" * 40, "2" * 40
    shared = {"model-00001-of-00002.safetensors": 4_000_000}
    write_snapshot(hub(a), repo, shared, revision=old)
    write_snapshot(hub(a), repo, {**shared, "model-00002-of-00002.safetensors": 1_000_000}, revision=new)
    write_snapshot(hub(b), repo, shared, revision=old)
    r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree(hub(b) / folder) == tree(hub(a) / folder)
    assert (hub(b) / folder / "refs/main").read_text() == new
    assert sent_bytes(r.stdout) < 2_000_000  # the 4 MB shard spark-b had was linked, not sent
    assert not (staging(b) / folder).exists()


def test_dry_run_shows_the_commands_and_copies_nothing(lab, inventory):
    """--dry-run prints the mkdir, the rsync and the move, and runs none of them."""
    a, b = lab.hosts[:2]
    repo = "lab-org/dry-model"
    write_snapshot(hub(a), repo, {"model.safetensors": 100_000})
    # Nodes named by their inventory names or their hosts alike.
    r = sparktop(lab, "sync", repo, "--inventory", str(inventory), "--dry-run", "--from", "spark-a",
                 "--to", "lab-spark-b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "+ spark-b: mkdir -p" in r.stdout and "flock -n -E 75" in r.stdout  # the staging folder's, under its lock
    assert "rsync -a -s --partial" in r.stdout and "BatchMode=yes" in r.stdout and "mv -T" in r.stdout
    assert not (hub(b) / "models--lab-org--dry-model").exists()
    assert not (staging(b) / "models--lab-org--dry-model").exists()


def test_an_interrupted_copy_leaves_nothing_in_the_cache_and_resumes(lab, inventory):
    """Ctrl-C (SIGINT to sparktop) mid-copy: exit 130, nothing in spark-b's cache, spark-a's rsync stopped; the
    next sync sends only what was not staged."""
    a, b = lab.hosts[:2]
    repo = "lab-org/big-model"
    folder = "models--lab-org--big-model"
    sizes = write_snapshot(hub(a), repo, {"model.safetensors": 48_000_000})
    total = sum(sizes.values()) + len(REVISION)
    proc = start_sparktop(lab, "sync", repo, "--inventory", str(inventory), "--bwlimit", "4M")
    try:
        # Interrupted once a quarter of it is in spark-b's staging folder (rsync's temporary file counts).
        wait_for(lambda: folder_bytes(staging(b) / folder) > total // 4 or proc.poll() is not None, 120,
                 "a quarter of the snapshot staged")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and "Traceback" not in err
    assert not (hub(b) / folder).exists()
    # sparktop stopped the rsync it ran on spark-a (its process group, by the id the command reported).
    wait_for(lambda: rsync_sending(a, folder) is None, 30, "spark-a's rsync to end")
    # The staging folder stops growing, its partial data kept.
    kept = wait_for(lambda: (lambda s: s if s == folder_bytes(staging(b) / folder) else 0)(
        folder_bytes(staging(b) / folder)), 30, "the staging folder to stop changing", step=0.5)
    assert 0 < kept < total
    # `cache` shows the interrupted copy as staged on spark-b, not as a model.
    shown = json.loads(sparktop(lab, "cache", "--inventory", str(inventory), "--json").stdout)
    node_b = next(n for n in shown if n["node"] == "spark-b")
    assert repo not in [m["repo_id"] for m in node_b["models"]]
    assert [s["bytes"] for s in node_b["staged"] if s["repo_id"] == repo] == [kept]
    r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already staged" in r.stdout
    sent = sent_bytes(r.stdout)
    print(f"snapshot {total} bytes; {kept} staged before the interruption; the resumed copy sent {sent} bytes")
    # rsync sent only what was not there yet (its own Literal data count): the snapshot less what was staged, give
    # or take a delta block (rsync matches the partial file block by block).
    assert sent < total - kept + 1_000_000
    assert tree(hub(b) / folder) == tree(hub(a) / folder)
    assert not (staging(b) / folder).exists()


def test_rsync_killed_on_the_source_leaves_nothing_in_the_cache_and_resumes(lab, inventory):
    """The transfer itself dies (rsync on spark-a killed, as a dropped link or an OOM kill would): sparktop says so
    in one line and the next sync resumes from what spark-b's staging folder kept."""
    a, b = lab.hosts[:2]
    repo = "lab-org/killed-model"
    folder = "models--lab-org--killed-model"
    sizes = write_snapshot(hub(a), repo, {"model.safetensors": 32_000_000})
    total = sum(sizes.values()) + len(REVISION)
    proc = start_sparktop(lab, "sync", repo, "--inventory", str(inventory), "--bwlimit", "4M")
    try:
        wait_for(lambda: folder_bytes(staging(b) / folder) > total // 4 or proc.poll() is not None, 120,
                 "a quarter of the snapshot staged")
        wait_for(lambda: rsync_sending(a, folder), 30, "spark-a's rsync").kill()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    fail = [line for line in out.splitlines() if "FAIL" in line]
    assert len(fail) == 1 and "spark-b: rsync on spark-a failed (exit 137: killed by signal 9)" in fail[0], out
    assert "the next sync resumes from" in fail[0] and "Traceback" not in err
    assert not (hub(b) / folder).exists()
    kept = folder_bytes(staging(b) / folder)
    assert kept > 0
    r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    assert r.returncode == 0, r.stdout + r.stderr
    sent = sent_bytes(r.stdout)
    print(f"snapshot {total} bytes; {kept} kept after rsync was killed; the resumed copy sent {sent} bytes")
    assert sent < total - kept + 1_000_000
    assert tree(hub(b) / folder) == tree(hub(a) / folder)


def test_a_second_sync_into_the_same_staging_folder_is_refused(lab, inventory):
    """Two syncs of one model to one node at once: the second is refused in words (the target's rsync runs under
    flock on a file beside the staging folder) and the first finishes whole."""
    a, b = lab.hosts[:2]
    repo = "lab-org/twice-model"
    folder = "models--lab-org--twice-model"
    write_snapshot(hub(a), repo, {"model.safetensors": 16_000_000})
    first = start_sparktop(lab, "sync", repo, "--inventory", str(inventory), "--bwlimit", "4M")
    try:
        wait_for(lambda: folder_bytes(staging(b) / folder) > 1_000_000 or first.poll() is not None, 120,
                 "the first copy to start")
        second = sparktop(lab, "sync", repo, "--inventory", str(inventory))
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 1, second.stdout + second.stderr
    fail = [line for line in second.stdout.splitlines() if "FAIL" in line]
    assert len(fail) == 1 and "another sparktop sync is copying lab-org/twice-model into" in fail[0], second.stdout
    assert first.returncode == 0, out + err
    assert tree(hub(b) / folder) == tree(hub(a) / folder)


def test_a_snapshot_that_changes_while_copied_is_not_moved_in(lab, inventory):
    """A file of the snapshot rewritten on spark-a during the copy: one FAIL line, nothing moved into the cache."""
    a, b = lab.hosts[:2]
    repo = "lab-org/moving-model"
    folder = "models--lab-org--moving-model"
    write_snapshot(hub(a), repo, {"model.safetensors": 24_000_000})
    proc = start_sparktop(lab, "sync", repo, "--inventory", str(inventory), "--bwlimit", "4M")
    try:
        wait_for(lambda: folder_bytes(staging(b) / folder) > 1_000_000 or proc.poll() is not None, 120,
                 "the copy to start")
        # The download on spark-a goes on meanwhile: its revision's ref is rewritten.
        ref = hub(a) / folder / "refs/main"
        ref.write_text("fedcba9876543210fedcba9876543210fedcba98")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    fail = [line for line in out.splitlines() if "FAIL" in line]
    assert fail and "changed on spark-a while it was copied" in fail[0], out
    assert not (hub(b) / folder).exists()


def test_no_space_on_the_target_is_refused_before_copying(lab, inventory):
    """The free space is what the twin's `df` says for spark-b's disk (TwinHost.set_disk): the stand-in df
    answers for every path of a lab host, so the test sets it."""
    a, b = lab.hosts[:2]
    repo = "lab-org/roomy-model"
    write_snapshot(hub(a), repo, {"model.safetensors": 2_000_000})
    before = b.twin.disk()
    b.twin.set_disk(500_000)
    try:
        r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    finally:
        b.twin.set_disk(before[1], before[0])
    assert r.returncode == 1
    fail = [line for line in r.stdout.splitlines() if "FAIL" in line]
    assert len(fail) == 1, r.stdout
    assert "spark-b: not enough space in" in fail[0] and ".cache/huggingface" in fail[0]
    assert re.search(r"needs 2\.0 MB, [\d.]+ kB free", fail[0]), fail[0]
    assert not (hub(b) / "models--lab-org--roomy-model").exists()
    assert not (staging(b) / "models--lab-org--roomy-model").exists()
    assert "Traceback" not in r.stderr


def test_a_disk_that_fills_during_the_copy_leaves_the_cache_untouched(lab, inventory, tmp_path):
    """A real small filesystem (a 1 MB tmpfs over spark-b's cache): rsync itself runs out of space."""
    a, b = lab.hosts[:2]
    repo = "lab-org/full-model"
    write_snapshot(hub(a), repo, {"model.safetensors": 3_000_000})
    cache = b.home / ".cache/huggingface"
    saved = tmp_path / "saved-cache"
    cache.mkdir(parents=True, exist_ok=True)
    cache.rename(saved)
    try:
        with small_tmpfs(cache, "1m"):
            r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
            assert r.returncode == 1, r.stdout + r.stderr
            fail = [line for line in r.stdout.splitlines() if "FAIL" in line]
            # rsync over ssh passes the receiver's exit status on, not always its message: exit 11 is file I/O.
            assert fail and "rsync on spark-a failed (exit 11: error in file I/O" in fail[0], r.stdout
            assert not (cache / "hub/models--lab-org--full-model").exists()
    finally:
        if cache.exists():
            cache.rmdir()
        saved.rename(cache)


def test_an_image_is_saved_and_loaded_with_the_same_id(lab, inventory):
    """docker save | dd | ssh spark-b docker load: the same image ID on both, the bytes counted through the pipe."""
    a, b = lab.hosts[:2]
    image = "lab/sync-test:1"
    put_image(a.twin, {"name": image, "size": 12_000_000})
    dry = sparktop(lab, "sync", image, "--inventory", str(inventory), "--dry-run")
    assert dry.returncode == 0 and "docker save lab/sync-test:1 | dd" in dry.stdout, dry.stdout + dry.stderr
    # Docker's disk on spark-b as the twin's df says it (TwinHost.set_disk): too small, refused before anything.
    before = b.twin.disk()
    b.twin.set_disk(5_000_000)
    try:
        small = sparktop(lab, "sync", image, "--inventory", str(inventory))
    finally:
        b.twin.set_disk(before[1], before[0])
    fail = [line for line in small.stdout.splitlines() if "FAIL" in line]
    assert small.returncode == 1 and len(fail) == 1, small.stdout + small.stderr
    assert re.search(r"spark-b: not enough space in \S+ for lab/sync-test:1: needs 12\.0 MB, [\d.]+ MB free", fail[0])
    assert lab.sh(b, f"docker image inspect {image}").returncode != 0
    r = sparktop(lab, "sync", image, "--inventory", str(inventory))
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [lab.sh(h, f"docker image inspect --format '{{{{.Id}}}}' {image}").stdout.strip() for h in (a, b)]
    assert ids[0].startswith("sha256:") and ids[0] == ids[1]
    assert "image ID" in r.stdout and "done" in r.stdout
    assert sent_bytes(r.stdout) >= 12_000_000  # dd's count of the bytes through the pipe
    shown = sparktop(lab, "cache", "--inventory", str(inventory), "--json")
    images = {i["name"]: i for i in next(n for n in json.loads(shown.stdout) if n["node"] == "spark-b")["images"]}
    assert images[image]["bytes"] == 12_000_000


def test_a_host_key_the_source_does_not_know_is_refused(lab, inventory):
    """spark-a does not know spark-b's host key: ssh in batch mode refuses, sparktop says so, nothing copied."""
    a, b = lab.hosts[:2]
    repo = "lab-org/trust-model"
    write_snapshot(hub(a), repo, {"model.safetensors": 10_000})
    known = a.home / ".ssh/known_hosts"
    saved = known.read_text()
    known.write_text("")
    try:
        r = sparktop(lab, "sync", repo, "--inventory", str(inventory))
    finally:
        known.write_text(saved)
    assert r.returncode == 1
    fail = [line for line in r.stdout.splitlines() if "FAIL" in line]
    assert fail and "Host key verification failed" in fail[0], r.stdout
    assert not (hub(b) / "models--lab-org--trust-model").exists()


async def test_preflight_offers_sync_and_passes_after_it(lab, inventory, monkeypatch):
    """Preflight on spark-b names `sparktop sync` for the missing weights and image; after both syncs the weights
    and image checks pass on both nodes."""
    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.preflight import run_preflight
    from sparktop.launch.topology import make_plan
    from sparktop.remote import transport_for
    from sparktop.settings import load_inventory

    a, b = lab.hosts[:2]
    model, image = "nvidia/Llama-3.1-8B-Instruct-FP8", "lab/vllm-synced:1"
    write_snapshot(hub(a), model, {"model-00001-of-00001.safetensors": 1_000_000})
    put_image(a.twin, {"name": image, "size": 3_000_000})
    path = lab.root / "sync-preflight.yaml"
    path.write_text(f"defaults:\n  image: {image}\n" + inventory.read_text())
    monkeypatch.setenv("HOME", str(lab.client_home))  # the lab's ssh config and known_hosts, as the CLI's
    inv = load_inventory(path)
    recipe = find_recipe("llama-3.1-8b")
    plan = make_plan(recipe, "shuffle", inv)

    async def checks() -> dict[tuple[str, str], object]:
        transports = {n.name: transport_for(n) for n in inv.nodes}
        try:
            result = await run_preflight(plan, recipe, inv, transports)
        finally:
            for t in transports.values():
                await t.close()
        return {(c.name, c.node): c for c in result.checks}

    before = await checks()
    assert before[("weights", "spark-b")].status == "warn"
    assert f"sparktop sync {model} --to spark-b" in before[("weights", "spark-b")].message
    assert before[("image", "spark-b")].status == "fail"
    assert f"sparktop sync {image} --to spark-b" in before[("image", "spark-b")].message
    for what in (model, image):
        r = sparktop(lab, "sync", what, "--inventory", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
    after = await checks()
    for node in ("spark-a", "spark-b"):
        assert after[("weights", node)].status == "pass", after[("weights", node)]
        assert after[("image", node)].status == "pass", after[("image", node)]
    assert ("image", "all") not in after  # the same ID on both


def test_bad_input_is_one_line(lab, inventory):
    """Nothing to copy, or a node the inventory does not have: one line on stderr, non-zero exit."""
    for args, said in (
        (["sync", "lab-org/nowhere"], "no node has a complete snapshot of lab-org/nowhere (spark-a: not cached; "
                                      "spark-b: not cached)"),
        (["sync", "lab/no-such-image:1"], "has no image lab/no-such-image:1 to copy"),
        (["sync", "lab-org/tiny-model", "--to", "spark-z"], "no node named 'spark-z'"),
    ):
        r = sparktop(lab, *args, "--inventory", str(inventory))
        assert r.returncode != 0, r.stdout
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0] and lines[0].startswith("sparktop: "), r.stderr


def test_a_cache_path_with_a_space_and_a_quote(lab, inventory):
    """`hf_cache: ~/hf cache's/huggingface`: every path reaches every shell (and the target's rsync) whole."""
    a, b = lab.hosts[:2]
    repo = "lab-org/spaced-model"
    odd = "hf cache's/huggingface"
    write_snapshot(a.home / odd / "hub", repo, {"model.safetensors": 200_000})
    path = lab.root / "sync-spaced.yaml"
    path.write_text(f'defaults:\n  hf_cache: "~/{odd}"\n' + inventory.read_text())
    r = sparktop(lab, "sync", repo, "--inventory", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    folder = "models--lab-org--spaced-model"
    assert tree(b.home / odd / "hub" / folder) == tree(a.home / odd / "hub" / folder)
    shown = sparktop(lab, "cache", "--inventory", str(path), "--json")
    models = next(n for n in json.loads(shown.stdout) if n["node"] == "spark-b")["models"]
    assert [m["repo_id"] for m in models] == [repo] and models[0]["complete"]


class Terminal:
    """A command on a pseudo-terminal (its stdin, stdout and stderr), read until what a user waits for."""

    def __init__(self, lab, *args: str):
        import pty

        self.main, child = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "sparktop", *args], stdin=child, stdout=child,
                                     stderr=child, env={**lab.env(), "COLUMNS": "160", "TERM": "xterm-256color"})
        os.close(child)
        self.text = ""

    def until(self, wanted: str, timeout: float = 120) -> str:
        import select

        deadline = time.monotonic() + timeout
        while wanted not in self.text:
            assert time.monotonic() < deadline, f"{wanted!r} not shown: {self.text[-3000:]}"
            ready, _, _ = select.select([self.main], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(self.main, 65536)
                except OSError:  # the command ended
                    chunk = b""
                if not chunk:
                    assert wanted in self.text, f"{wanted!r} not shown before the end: {self.text[-3000:]}"
                self.text += re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", chunk.decode(errors="replace"))
        return self.text

    def type(self, line: str) -> None:
        os.write(self.main, (line + "\n").encode())

    def close(self) -> int:
        with contextlib.suppress(OSError):
            while os.read(self.main, 65536):
                pass
        os.close(self.main)
        return self.proc.wait(timeout=60)


def test_launch_offers_the_copies_preflight_names_and_runs_them(lab, inventory):
    """`launch` at a terminal, the weights and the image only on spark-a: it lists the `sparktop sync` commands
    preflight named, asks, runs them (each with its bar), and preflight then passes on both nodes."""
    a, b = lab.hosts[:2]
    model, image = "nvidia/Llama-3.1-8B-Instruct-FP8", "lab/vllm-offered:1"
    folder = "models--nvidia--Llama-3.1-8B-Instruct-FP8"
    write_snapshot(hub(a), model, {"model-00001-of-00001.safetensors": 2_000_000})
    __import__("shutil").rmtree(hub(b) / folder, ignore_errors=True)
    put_image(a.twin, {"name": image, "size": 2_000_000})
    path = lab.root / "offered.yaml"
    path.write_text(f"defaults:\n  image: {image}\n" + inventory.read_text())
    term = Terminal(lab, "launch", "llama-3.1-8b", "--layout", "2x solo", "--inventory", str(path))
    try:
        term.until("Copy it now? [y/N]")
        assert f"sparktop sync {model} --model --to spark-b --inventory {path}" in term.text
        assert f"sparktop sync {image} --image --to spark-b --inventory {path}" in term.text
        term.type("y")
        shown = term.until("Launch? [y/N]")
        term.type("n")
        term.until("Not launched.")
    finally:
        code = term.close()
    assert code == 1
    after = shown.split("Copy it now?", 1)[1]
    assert after.count("done spark-b") == 2 and "━" in after, after  # both copies, each with its bar
    assert "[FAIL]" not in after.split("done spark-b")[-1]  # preflight again: nothing fails
    assert tree(hub(b) / folder) == tree(hub(a) / folder)
    ids = [lab.sh(h, f"docker image inspect --format '{{{{.Id}}}}' {image}").stdout.strip() for h in (a, b)]
    assert ids[0].startswith("sha256:") and ids[0] == ids[1]
    assert lab.containers(a) == [] and lab.containers(b) == []  # and, told no, nothing launched
