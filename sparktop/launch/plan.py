"""A launch plan: ordered steps (a command on one node, and what "done"
looks like) plus the endpoints the launch will serve.

Commands are argument lists; `render` joins them with shlex quoting, so a
recipe value never reaches a shell as code. The one thing that is not
quoted is a `Home` path's `"$HOME"/` prefix, which sparktop writes itself.
Secrets are never in a plan: a step that needs them names them, and the
executor writes their values to a 0600 file on the node through the
command's standard input at launch time.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from sparktop.engine_ids import DEFAULT


class Home(str):
    """A path under the node user's home: `~/x` rendered as `"$HOME"/x`."""

    def render(self) -> str:
        rest = self[2:] if self.startswith("~/") else self
        return '"$HOME"/' + shlex.quote(rest)


class HomeMount(Home):
    """A bind mount `~/dir/file:~/dir/file:ro` with both sides under $HOME."""

    def render(self) -> str:
        path, options = self.rsplit(":", 1) if self.count(":") == 2 else (self, "")
        inside = path.split(":", 1)[0]
        side = Home(inside).render()
        return f"{side}:{side}" + (f":{shlex.quote(options)}" if options else "")


Arg = str | Home


def render(argv: list[Arg]) -> str:
    parts = []
    for arg in argv:
        if isinstance(arg, Home):
            parts.append(arg.render())
        else:
            parts.append(shlex.quote(str(arg)))
    return " ".join(parts)


@dataclass
class Wait:
    """What must be true before the next step runs."""

    kind: str  # running | ray-nodes | http | none
    container: str | None = None
    count: int = 0  # ray-nodes: how many
    url: str | None = None  # http: the endpoint
    model: str | None = None  # http: must be listed by /v1/models
    api_key_env: str | None = None  # http: secret name for the Authorization header


@dataclass
class Step:
    node: str
    argv: list[Arg]
    title: str
    container: str | None = None  # the container this step starts (logs, teardown)
    wait: Wait = field(default_factory=lambda: Wait("none"))
    stdin_secrets: list[str] = field(default_factory=list)  # names whose values go to a file via stdin
    stdin_text: str | None = None  # non-secret file content sent via stdin
    role: str = ""  # engine | worker | ray-head | ray-worker | router | setup

    @property
    def command(self) -> str:
        return render(self.argv)


@dataclass
class Endpoint:
    url: str
    kind: str  # the engine that answers (`observe.engines` id: vllm, sglang, llama.cpp, trtllm) | router
    node: str
    model: str
    topology: str
    container: str
    api_key_env: str | None = None
    # The containers its engine runs in, (node, name), in the order the plan starts them (workers before a
    # head that waits for them, a Ray head before its workers): what a watchdog restarts, in that order.
    members: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Plan:
    launch_id: str
    recipe_id: str
    recipe_name: str
    topology: str
    nodes: list[str]
    steps: list[Step]
    endpoints: list[Endpoint]
    containers: dict[str, list[str]]  # node -> containers this plan starts
    secrets: list[str]  # names of secrets the launch passes (values never stored here)
    state_dir: str  # per-launch directory on each node (under $HOME)
    flags: dict = field(default_factory=dict)  # the engine's flags as launched (recipe + topology + overrides)
    image: str = ""
    notes: list[str] = field(default_factory=list)
    runtime: str = DEFAULT  # the runtime its engines run (`launch/runtimes/`)

    def render(self) -> str:
        lines = [f"# launch {self.launch_id}: {self.recipe_id} as {self.topology} on {', '.join(self.nodes)}"]
        for note in self.notes:
            lines.append(f"# note: {note}")
        if self.secrets:
            lines.append(f"# secrets passed by name (values read at launch, written 0600 on the node, never "
                         f"on a command line): {', '.join(self.secrets)}")
        for i, step in enumerate(self.steps, 1):
            lines.append(f"\n# {i}. {step.title}  [on {step.node}]")
            if step.stdin_secrets:
                values = ", ".join(f"{n}=<generated at launch>" if n == "LITELLM_MASTER_KEY" else
                                   f"{n}=<from your environment>" for n in step.stdin_secrets)
                lines.append(f"#    standard input: {values}")
            elif step.stdin_text is not None:
                lines.append("#    standard input:")
                lines += [f"#      {line}" for line in step.stdin_text.splitlines()]
            if step.argv:
                lines.append(step.command)
            if step.wait.kind == "running":
                lines.append(f"#    then wait until container {step.wait.container} is running")
            elif step.wait.kind == "ray-nodes":
                lines.append(f"#    then wait until `ray status` in {step.wait.container} shows "
                             f"{step.wait.count} nodes")
            elif step.wait.kind == "http":
                lines.append(f"#    then wait for {step.wait.url}/health and {step.wait.model!r} in /v1/models")
        lines.append("\n# endpoints:")
        for e in self.endpoints:
            lines.append(f"#   {e.url}/v1  ({e.kind}, model {e.model})")
        return "\n".join(lines) + "\n"
