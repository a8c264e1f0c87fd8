"""From two bare OpenSSH hosts to replicas serving behind the balancing router: issue 40's whole journey, each
step the command a user types, in the lab (real OpenSSH, Debian's rsync and HAProxy, twin engines).

1. `sparktop setup lab-spark-a lab-spark-b --yes` writes the inventory (and lets the nodes reach each other);
2. the model's weights and the engine's image are only on spark-a: preflight says so and names `sparktop sync`;
3. `sparktop sync MODEL` copies the snapshot over rsync, interrupted once and resumed, and `sparktop sync IMAGE`
   the image (the same ID on both);
4. preflight passes, and `2x solo` launches behind HAProxy leastconn, which splits lockstep bursts exactly.

Counts, states and texts; no time is asserted.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparktop.twin.fabric_tools import set_addresses
from sparktop.twin.images import put_image
from tests.e2e.lab import HAPROXY
from tests.e2e.test_lab_launch import RECIPE, assert_nothing_left, router_key, sparktop
from tests.e2e.test_lab_router import ENGINES, burst, router_view, until
from tests.e2e.test_lab_sync import folder_bytes, hub, sent_bytes, staging, tree, wait_for
from tests.helpers.hfsnapshot import REVISION, write_snapshot
from tests.helpers.signals import ctrl_c_as_in_a_terminal

pytestmark = [pytest.mark.lab, pytest.mark.slow]

MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"  # the recipe's weights
FOLDER = "models--nvidia--Llama-3.1-8B-Instruct-FP8"
IMAGE = "vllm/vllm-openai:journey"  # an engine image only spark-a has


def in_a_terminal(lab, *args: str) -> tuple[int, str]:
    """`sparktop ARGS` with a pseudo-terminal as its output (so rich draws what a user sees): its exit status
    and everything it wrote, escape sequences taken out."""
    main, child = pty.openpty()
    env = {**lab.env(), "COLUMNS": "120", "TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", *args], stdout=child, stderr=child,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(child)
    out = bytearray()
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    code = proc.wait(timeout=120)
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace")).replace("\r", "\n")


async def test_from_bare_hosts_to_replicas_split_exactly(lab):
    if not Path(HAPROXY).exists():
        pytest.fail("the journey needs HAProxy: run the tests with scripts/test, which installs it")
    a, b = lab.hosts[:2]
    for host in lab.hosts:  # the two halves of the cable, each in its own /24, as NVIDIA's playbook addresses them
        n = host.address.rsplit(".", 1)[1]
        set_addresses(host.twin.home, {"enp1s0f1np1": [f"{host.address}/24"], "enP2p1s0f1np1": [f"127.0.1.{n}/24"]})

    # 1. setup, from nothing.
    inventory = lab.root / "journey" / "cluster.yaml"
    setup = sparktop(lab, "setup", "lab-spark-a", "lab-spark-b", "--yes", "--inventory", str(inventory))
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr
    assert "FAIL" not in setup.stdout and f"inventory {inventory}: written" in setup.stdout
    # The engine image the user picks, which only spark-a has; and, because the lab's hosts share one machine,
    # each node's engines listen on its own address (on Sparks the default, every address, is right).
    written = yaml.safe_load(inventory.read_text())
    written.setdefault("defaults", {})["image"] = IMAGE
    for node, host in zip(written["nodes"], lab.hosts, strict=True):
        node["bind"] = host.address
    inventory.write_text(yaml.safe_dump(written, sort_keys=False))
    put_image(a.twin, {"name": IMAGE, "size": 4_000_000})

    # 2. The weights and the image are only on spark-a: preflight names the fix.
    sizes = write_snapshot(hub(a), MODEL, {"model-00001-of-00001.safetensors": 24_000_000})
    total = sum(sizes.values()) + len(REVISION)
    dry = sparktop(lab, "launch", RECIPE, "--layout", "2x solo", "--inventory", str(inventory), "--yes",
                   "--timeout", "180", timeout=400)
    assert dry.returncode != 0, dry.stdout[-2000:]
    assert f"sparktop sync {MODEL} --to lab-spark-b" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    assert f"sparktop sync {IMAGE} --to lab-spark-b" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    assert lab.containers(a) == [] and lab.containers(b) == []  # nothing started

    # 3. sync: interrupted a quarter of the way (Ctrl-C), nothing half-written in spark-b's cache, then resumed.
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "sync", MODEL, "--inventory", str(inventory),
                             "--bwlimit", "4M"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=lab.env(), preexec_fn=ctrl_c_as_in_a_terminal)
    try:
        wait_for(lambda: folder_bytes(staging(b) / FOLDER) > total // 4 or proc.poll() is not None, 120,
                 "a quarter of the snapshot staged")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, out + err
    assert not (hub(b) / FOLDER).exists()
    resumed, shown = in_a_terminal(lab, "sync", MODEL, "--inventory", str(inventory))
    assert resumed == 0, shown
    assert "already staged" in shown and sent_bytes(shown) < total
    # In a terminal the copy has its bar: the transfer named, the bar drawn, the bytes of the whole.
    assert "lab-spark-a→lab-spark-b" in shown and "━" in shown and f"/{total / 1e6:.1f} MB" in shown, shown
    assert tree(hub(b) / FOLDER) == tree(hub(a) / FOLDER)
    image = sparktop(lab, "sync", IMAGE, "--inventory", str(inventory))
    assert image.returncode == 0, image.stdout + image.stderr
    ids = [lab.sh(h, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout.strip() for h in (a, b)]
    assert ids[0].startswith("sha256:") and ids[0] == ids[1]
    cached = {n["node"]: n for n in json.loads(sparktop(lab, "cache", "--inventory", str(inventory),
                                                        "--json").stdout)}
    for node in ("lab-spark-a", "lab-spark-b"):
        assert MODEL in [m["repo_id"] for m in cached[node]["models"]], cached[node]
        assert IMAGE in [i["name"] for i in cached[node]["images"]], cached[node]

    # 4. Preflight passes; 2x solo serves through HAProxy leastconn, every burst split exactly.
    launched = sparktop(lab, "launch", RECIPE, "--layout", "2x solo", "--inventory", str(inventory), "--yes",
                        "--timeout", "180", timeout=400)
    try:
        assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
        assert "[fail" not in launched.stdout and "sparktop sync" not in launched.stdout
        assert "router: HAProxy" in launched.stdout and "leastconn" in launched.stdout
        key = router_key(lab)
        assert key
        until(lambda: router_view(key) == {"lab-spark-a": "UP", "lab-spark-b": "UP"}, "both backends UP")
        splits = {c: await burst(c, key) for c in (2, 4, 8, 16)}
        assert splits == {c: {node: c // 2 for node in ENGINES} for c in (2, 4, 8, 16)}, splits
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(lab)
