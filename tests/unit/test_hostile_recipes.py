"""Hostile recipe values reach vLLM as literal arguments and never run.

A recipe is written to YAML with hostile strings (shell metacharacters,
quotes, newlines, `$()`, backticks, payloads that try to `touch` a marker
file) in the model, served name, a flag value, an extra argument and an
environment value. Its plan, for every topology, is executed by a real
`sh -c` exactly as a node would run it, with stand-ins for `docker`, `vllm`,
`ray`, `litellm` and `haproxy` that record the argument vectors they receive. The
stand-in `docker run` runs the container's command the way Docker would
(entrypoint plus arguments, `-e` variables set), so the Ray head's nested
`sh -c` script is executed too. The marker must never appear, and each
hostile value must arrive as exactly one argument, unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparktop.launch.catalog import load_recipe_file
from sparktop.launch.topology import make_plan
from sparktop.layouts import parse_layout
from sparktop.settings import Inventory, Node

TOPOLOGIES = ["solo", "cluster-mp", "cluster-ray", "shuffle", "least-busy",
              "tp=4", "tp=4,ray", "tp=2,pp=2", "2x tp=2", "2x tp=2,ray", "4x solo,shuffle", "2x solo,litellm"]
IMAGE = "nvcr.io/nvidia/vllm:25.11-py3"
ROUTER_IMAGE = "ghcr.io/berriai/litellm:v1.106.2"

FAKE_DOCKER = textwrap.dedent("""\
    import json, os, subprocess, sys
    args = sys.argv[1:]
    with open(os.environ["RECORD_DIR"] + "/docker.jsonl", "a") as f:
        f.write(json.dumps(args) + "\\n")
    if args[:1] != ["run"]:
        sys.exit(0)
    takes_value = {"--name", "--label", "--network", "--gpus", "--ulimit", "-v", "--env-file", "-e", "--entrypoint"}
    env, entrypoint, i = {}, None, 1
    while i < len(args):
        a = args[i]
        if a in takes_value:
            if a == "-e":
                key, _, value = args[i + 1].partition("=")
                env[key] = value
            elif a == "--entrypoint":
                entrypoint = args[i + 1]
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            break
    image, command = args[i], args[i + 1:]
    # Run the container's command in the foreground, as Docker would inside it.
    sys.exit(subprocess.run([entrypoint, *command], env={**os.environ, **env}).returncode)
""")

# Each records its argv NUL-separated (the one byte an argument cannot hold)
# and the hostile environment variable as the container saw it.
RECORDER = textwrap.dedent("""\
    #!/bin/sh
    printf '%s\\0' "$@" > "$RECORD_DIR/{name}.$$.argv"
    printf '%s' "$HOSTILE_ENV" > "$RECORD_DIR/{name}.$$.env"
    {extra}
    exit 0
""")

PAYLOADS = [
    "; touch {marker}", "$(touch {marker})", "`touch {marker}`", "'; touch {marker}; '", "\"; touch {marker}; \"",
    "\n touch {marker}\n", "| touch {marker}", "&& touch {marker}", "' \"$(touch {marker})\" '", "${{IFS}}touch${{IFS}}{marker}",  # noqa: E501
    "x\\'; touch {marker} #", "$'\\x3b' touch {marker}", "*", "-- ; rm -rf ~",
]

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


@st.composite
def hostile(draw):
    payload = draw(st.sampled_from(PAYLOADS))
    return draw(text) + payload + draw(text)


def inventory() -> Inventory:
    return Inventory(nodes=[Node(f"spark-{c}", f"spark-{c}.lan", fabric_ip=f"10.0.0.{i + 1}", eth_if="eth0")
                            for i, c in enumerate("abcd")])


def sandbox(root: Path) -> dict[str, str]:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (root / "rec").mkdir()
    (root / "home").mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!{sys.executable} -S\n" + FAKE_DOCKER)
    ray_status = "[ \"$1\" = status ] && printf ' node_%s\\n' 1 2 3 4 5 6 7 8"
    for name, extra in (("vllm", ""), ("ray", ray_status), ("litellm", ""), ("haproxy", "")):
        (bin_dir / name).write_text(RECORDER.format(name=name, extra=extra))
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root / "home"), "RECORD_DIR": str(root / "rec"),
            "LC_ALL": "C.UTF-8"}


def recorded(root: Path, name: str) -> list[tuple[list[str], str]]:
    out = []
    for path in sorted((root / "rec").glob(f"{name}.*.argv")):
        argv = path.read_bytes().decode("utf-8").split("\0")[:-1]
        env = path.with_suffix(".env").read_bytes().decode("utf-8")
        out.append((argv, env))
    return out


def value_after(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topology=st.sampled_from(TOPOLOGIES), model=hostile(), served=hostile(), template=hostile(),
       extra=hostile(), env_value=hostile())
def test_hostile_recipe_values_reach_vllm_literally_and_never_run(tmp_path_factory, topology, model, served,
                                                                  template, extra, env_value):
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "pwned"
    fill = lambda s: s.replace("{marker}", str(marker))  # noqa: E731
    model, served, template, extra, env_value = map(fill, (model, served, template, extra, env_value))
    if extra.startswith("-"):
        extra = "x" + extra  # extra args may not re-set the flags sparktop owns; that is a separate error
    doc = {"name": "hostile", "model": model, "served_model_name": served,
           "vllm": {"chat_template": template, "max_model_len": 4096},
           "extra_args": ["--override-generation-config", extra], "env": {"HOSTILE_ENV": env_value},
           "memory": {"weights_gib": 1}}
    path = root / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc))  # escapes line breaks like NEL, which YAML would fold
    recipe = load_recipe_file(path)
    assert (recipe.model, recipe.served_name, recipe.flags["chat_template"], recipe.env["HOSTILE_ENV"]) == \
        (model, served, template, env_value)

    plan = make_plan(recipe, topology, inventory(), lid="hostile")
    env = sandbox(root)
    for step in plan.steps:
        if not step.argv:
            continue
        stdin = "".join(f"{n}=secret\n" for n in step.stdin_secrets) if step.stdin_secrets else step.stdin_text
        r = subprocess.run(["sh", "-c", step.command], input=(stdin or "").encode(), capture_output=True,
                           env=env, cwd=root, timeout=30)
        assert r.returncode == 0, (step.title, r.stderr.decode(errors="replace"))

    assert not marker.exists(), "a hostile recipe value ran as shell code"
    engines = recorded(root, "vllm")
    # One vLLM process per engine or worker, each with every hostile value intact.
    layout = parse_layout(topology)
    per_engine = layout.nodes_per_engine if layout.backend == "mp" else 1  # Ray: vLLM on the head only
    assert len(engines) == layout.replicas * per_engine
    for argv, container_env in engines:
        assert argv[:2] == ["serve", model]
        assert value_after(argv, "--chat-template") == template
        assert value_after(argv, "--override-generation-config") == extra
        if "--headless" not in argv:
            assert value_after(argv, "--served-model-name") == served
        assert container_env == env_value
    if layout.router in ("leastconn", "litellm"):  # HAProxy: its config names the replicas, no recipe's value
        [(router_argv, _)] = recorded(root, "haproxy")
        config = Path(value_after(router_argv, "-f")).read_text()
        assert "balance leastconn" in config and config.count("\n    server ") == layout.replicas
    if layout.router == "leastconn":
        assert recorded(root, "litellm") == []
    elif layout.router:
        [(router_argv, _)] = recorded(root, "litellm")
        config = yaml.safe_load(Path(value_after(router_argv, "--config")).read_text())
        assert {m["model_name"] for m in config["model_list"]} == {served}
        if layout.router != "litellm":
            assert recorded(root, "haproxy") == []
    else:
        assert recorded(root, "litellm") == recorded(root, "haproxy") == []
    docker_runs = [line for line in (root / "rec" / "docker.jsonl").read_text().splitlines()]
    assert len(docker_runs) == len(plan.steps) - sum(1 for s in plan.steps if not s.argv or s.role == "setup")
