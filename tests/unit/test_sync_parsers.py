"""`sparktop sync`'s parsers on real output: rsync's progress2 lines and --stats, rsync's failure lines, dd's
progress, `docker images --format '{{json .}}'`, and the Hugging Face cache as GNU find lists it (checked against
huggingface_hub's own scan of the same folder)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from sparktop.sync import hfcache
from sparktop.sync.commands import kind_of
from sparktop.sync.images import parse_images, parse_size
from sparktop.sync.progress import exit_words, parse_dd, parse_progress2, parse_stats, rsync_reason
from sparktop.sync.transfer import human_bytes
from tests.helpers.hfsnapshot import REVISION, write_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sync"


def lines(name: str) -> list[str]:
    # As the node's command hands them over: carriage returns turned into newlines.
    return (FIXTURES / name).read_text().replace("\r", "\n").splitlines()


def test_rsync_progress2_lines_and_stats():
    found = [p for p in map(parse_progress2, lines("rsync-progress2-stats.txt")) if p is not None]
    assert len(found) == 11
    assert [p.bytes for p in found[:4]] == [32_768, 1_081_344, 2_129_920, 3_000_000]
    assert all(a.bytes <= b.bytes for a, b in zip(found, found[1:], strict=False))
    assert found[-1].bytes == 3_000_703 and found[-1].percent == 99
    assert found[1].rate == pytest.approx(1000.98 * 1024)
    assert found[3].rate == pytest.approx(1.01 * 1024**2)
    stats = parse_stats((FIXTURES / "rsync-progress2-stats.txt").read_text())
    assert stats["Literal data"] == 3_000_703
    assert stats["Total file size"] == 3_000_733
    assert stats["Total transferred file size"] == 3_000_703
    assert stats["Matched data"] == 0
    assert parse_progress2("Number of files: 10 (reg: 3, dir: 5, link: 2)") is None


def test_rsync_failure_says_the_receivers_reason():
    got = rsync_reason(lines("rsync-enospc.txt"))
    assert got == 'rsync: [receiver] write failed on "/data/cache/x/blobs/aaa": No space left on device (28)'
    # ssh's own line, before rsync's consequence of it.
    assert rsync_reason(["Host key verification failed.", "rsync: connection unexpectedly closed (0 bytes "
                         "received so far) [sender]", "rsync error: unexplained error (code 255) at io.c(232) "
                         "[sender=3.5.0]"]) == "Host key verification failed."
    assert rsync_reason([]) == "no message"
    assert exit_words(11).startswith("exit 11: error in file I/O")
    assert exit_words(99) == "exit 99"
    assert exit_words(137) == "exit 137: killed by signal 9"


def test_dd_progress():
    found = [p for p in map(parse_dd, lines("dd-progress.txt")) if p is not None]
    assert [b for b, _ in found] == [19_922_944, 40_894_464, 60_000_000, 60_000_000]
    assert found[0][1] == pytest.approx(19.4e6)
    assert parse_dd("57+1 records in") is None


def test_docker_images_json():
    # The twin's rows, and one in the Docker CLI's documented `{{json .}}` form (docs.docker.com, `docker images`).
    text = ('{"Repository":"lab/sync-test","Tag":"1","ID":"sha256:c1b0","Size":"12MB","CreatedSince":"N/A"}\n'
            '{"Containers":"N/A","CreatedAt":"2025-10-01 10:00:00 +0000 UTC","CreatedSince":"8 weeks ago",'
            '"Digest":"\\u003cnone\\u003e","ID":"sha256:2b1c","Repository":"nvcr.io/nvidia/vllm","SharedSize":"N/A",'
            '"Size":"20.1GB","Tag":"25.09-py3","UniqueSize":"N/A","VirtualSize":"20.1GB"}\n'
            '{"Repository":"\\u003cnone\\u003e","Tag":"\\u003cnone\\u003e","ID":"sha256:dead","Size":"1.2kB"}\n'
            "WARNING: not JSON\n")
    images = parse_images(text)
    assert [(i.name, i.id, i.size) for i in images] == [
        ("lab/sync-test:1", "sha256:c1b0", 12_000_000), ("nvcr.io/nvidia/vllm:25.09-py3", "sha256:2b1c",
                                                         20_100_000_000), ("<none>", "sha256:dead", 1200)]
    assert parse_size("512MB") == 512_000_000 and parse_size("0B") == 0 and parse_size("?") is None


def _listing(hub: Path, repo: str | None = None) -> str:
    # listing_script takes the hub as the shell should read it: quoted (or "$HOME"/... rendered).
    script = hfcache.listing_script(shlex.quote(str(hub)), repo)
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    return r.stdout


def test_hf_cache_listing_agrees_with_huggingface_hub(tmp_path):
    hub = tmp_path / "hub"
    sizes = write_snapshot(hub, "org/tiny", {"model-00001-of-00002.safetensors": 30_000,
                                             "model-00002-of-00002.safetensors": 12_345, "tokenizer.json": 999})
    (hub / "version.txt").write_text("1")  # the hub's own file beside the models, not a model
    models = hfcache.parse_listing(_listing(hub))
    assert list(models) == ["org/tiny"]
    model = models["org/tiny"]
    assert model.complete and model.revision == REVISION and model.revisions == [REVISION]
    assert model.size == sum(sizes.values()) + len(REVISION)  # the blobs and refs/main
    # One model's folder lists the same entries.
    assert hfcache.parse_listing(_listing(hub, "org/tiny"), "org/tiny")["org/tiny"].entries == model.entries
    huggingface_hub = pytest.importorskip("huggingface_hub")
    scan = huggingface_hub.scan_cache_dir(hub)
    (repo,) = scan.repos
    assert repo.repo_id == "org/tiny"
    blobs = sum(e.size for p, e in model.entries.items() if p.startswith("blobs/"))
    assert repo.size_on_disk == blobs
    (rev,) = repo.revisions
    assert rev.commit_hash == model.revision
    assert {f.file_name for f in rev.files} == {p.split("/", 2)[2] for p in model.entries if p.startswith("snapshots/")}


def test_an_incomplete_download_and_a_dangling_link_are_not_complete(tmp_path):
    hub = tmp_path / "hub"
    write_snapshot(hub, "org/partial", {"model.safetensors": 1000})
    folder = hub / "models--org--partial"
    (folder / "blobs" / "abc123.incomplete").write_bytes(b"x" * 10)
    os.symlink("../../blobs/abc123", folder / "snapshots" / REVISION / "weights.bin")
    model = hfcache.parse_listing(_listing(hub))["org/partial"]
    problems = model.problems()
    assert "blobs/abc123.incomplete is still downloading" in problems
    assert any("weights.bin points to ../../blobs/abc123, which is missing" in p for p in problems)
    assert model.size == sum(e.size for e in model.entries.values() if e.kind == "f") - 10


def test_changes_and_short_copies(tmp_path):
    hub = tmp_path / "hub"
    write_snapshot(hub, "org/m", {"model.safetensors": 5000})
    before = hfcache.parse_listing(_listing(hub))["org/m"]
    assert hfcache.changed_files(before, hfcache.parse_listing(_listing(hub))["org/m"]) == []
    assert hfcache.missing_or_short(before, before) == []
    blob = next(p for p, e in before.entries.items() if p.startswith("blobs/") and e.size == 5000)
    with open(hub / "models--org--m" / blob, "ab") as f:
        f.write(b"more")
    after = hfcache.parse_listing(_listing(hub))["org/m"]
    assert hfcache.changed_files(before, after) == [f"{blob} changed"]
    assert hfcache.missing_or_short(before, after) == [f"{blob} differs (5004 bytes, 5000 expected)"]
    assert hfcache.changed_files(before, None) == ["the whole folder is gone"]


def test_names():
    assert hfcache.repo_folder("org/name") == "models--org--name"
    assert hfcache.repo_id_of("models--org--name") == "org/name"
    assert hfcache.repo_id_of("datasets--x--y") is None
    assert kind_of("nvidia/Llama-3.1-8B-Instruct-FP8", None) == "model"
    assert kind_of("vllm/vllm-openai:v0.11.0", None) == "image"
    assert kind_of("nvcr.io/nvidia/vllm:25.09-py3", None) == "image"
    assert kind_of("redis@sha256:abc", None) == "image"
    assert kind_of("org/name", "image") == "image"
    assert human_bytes(2_000_123) == "2.0 MB" and human_bytes(999) == "999 B"


def test_the_move_into_the_cache_quotes_every_path_and_merges(tmp_path):
    """The scripts run on the target, for real, in a cache whose path has a space and a quote: the first copy of a
    model is one rename; a second revision is merged (blobs linked, refs replaced) and the staging folder goes."""
    from sparktop.sync.transfer import Syncer

    cache = tmp_path / "it's a cache"
    hub, staging = cache / "hub", cache / ".sparktop-sync"
    folder = "models--org--m"
    write_snapshot(staging, "org/m", {"a.safetensors": 1000}, revision="1" * 40)
    (staging / folder / "refs" / "main").unlink()
    refs = Syncer._refs_script(str(staging / folder), {"main": "1" * 40, "pr/7": "9" * 40})
    finish = Syncer._finish_script(str(hub), str(staging / folder), str(hub / folder))
    for script in (refs, finish):
        subprocess.run(["sh", "-c", script], check=True)
    assert (hub / folder / "refs/main").read_text() == "1" * 40
    assert (hub / folder / "refs/pr/7").read_text() == "9" * 40
    assert not (staging / folder).exists()
    first = hfcache.parse_listing(_listing(hub))["org/m"]
    assert first.complete and first.revision == "1" * 40
    # A second revision staged beside the first, then merged.
    write_snapshot(staging, "org/m", {"a.safetensors": 1000, "b.safetensors": 2000}, revision="2" * 40)
    subprocess.run(["sh", "-c", Syncer._refs_script(str(staging / folder), {"main": "2" * 40})], check=True)
    subprocess.run(["sh", "-c", finish], check=True)
    merged = hfcache.parse_listing(_listing(hub))["org/m"]
    assert merged.complete and merged.revision == "2" * 40 and merged.revisions == ["1" * 40, "2" * 40]
    assert not (staging / folder).exists()


def test_a_target_only_this_machine_can_reach_is_an_error():
    from sparktop.settings import Node
    from sparktop.sync.transfer import SyncError, address_of, ssh_command

    here, there = Node("spark-a", host="localhost"), Node("spark-b", host="spark-b", user="me", port=2222)
    assert address_of(there, here) == "me@spark-b"
    assert ssh_command(there) == "${RSYNC_RSH:-ssh} -o BatchMode=yes -p 2222"
    assert address_of(Node("spark-b", host="spark-b", fabric_ip="192.168.100.11")) == "192.168.100.11"
    with pytest.raises(SyncError, match="spark-b cannot reach spark-a: the inventory gives spark-a no fabric_ip"):
        address_of(here, there)
