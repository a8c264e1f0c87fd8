"""A study on disk: what it is, how far it got, written as it goes.

```
<data>/sparktop/studies/<study-id>/
    study.json          this file's `Study`, rewritten atomically after every change
    runs/<run-id>/      one sweep run per topology (meta.json, requests.jsonl, engine.jsonl)
    report/             what `sparktop report` writes (charts, report.md, report.html)
```

Which levels of a topology are measured is never kept twice: the sweep
run's own files say it (complete batches), so a resumed study hands the
run back to the sweep with `resume=` and nothing measured is measured again.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from sparktop import engine_ids
from sparktop.errors import SparktopError

STUDY = "study.json"

# A topology's status. `pending` has not started; the next four are the
# stages it goes through; the last three are where it ends.
PENDING, PREFLIGHT, LAUNCHING, SWEEPING, STOPPING = "pending", "preflight", "launching", "sweeping", "stopping"
DONE, FAILED, CANCELLED = "done", "failed", "cancelled"
FINISHED = (DONE, FAILED)
# How the runner words a topology stopped by preflight (`runner._preflight`): nothing of it was launched.
PREFLIGHT_FAILED = "preflight failed"


def studies_dir() -> Path:
    from sparktop.settings import data_dir

    return data_dir() / "studies"


def new_study_id(recipe: str, when: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when or time.time()))
    short = re.sub(r"[^A-Za-z0-9.]+", "-", recipe).strip("-").lower()[:40] or "study"
    return f"{stamp}-{short}"


@dataclass
class TopologyState:
    """One topology of the study: its stage, its run, and how it ended."""

    name: str
    status: str = PENDING
    stage: str = ""  # what it is doing now, in words ("loading weights 41 %")
    reason: str | None = None  # why it failed
    lines: list[str] = field(default_factory=list)  # the log lines that show why
    launch_id: str | None = None
    run: str | None = None  # the sweep run's directory name under runs/
    commands: list[str] = field(default_factory=list)  # the launch's command lines, secrets masked
    nodes: list[str] = field(default_factory=list)
    vllm_version: str | None = None
    startup_s: float | None = None
    sweep_s: float | None = None
    started: float | None = None
    ended: float | None = None
    # Predicted before it ran: concurrency (as a string, JSON keys) -> metric -> value.
    predicted: dict[str, dict[str, float | None]] = field(default_factory=dict)
    contaminated: list[int] = field(default_factory=list)  # levels reported as contaminated
    serving: dict = field(default_factory=dict)  # model.serving.Serving's fields, for predict and fit
    # A study across runtimes (`--runtimes`): this entry's layout and runtime, and the recipe that serves the
    # model in that runtime; `name` is then "llama.cpp solo". Empty: `name` is the layout, the study's recipe.
    layout: str = ""
    runtime: str = ""
    recipe: str = ""
    recipe_path: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def layout_name(self) -> str:
        """The layout its plan is made for."""
        return self.layout or self.name

    @property
    def launched(self) -> bool:
        """Whether its launch's commands ran: not for one still pending or in preflight, nor for one whose
        plan or preflight failed (no plan: no launch id; preflight's failure is worded `PREFLIGHT_FAILED`)."""
        if self.startup_s is not None or self.run:
            return True
        if self.status in (PENDING, PREFLIGHT) or not self.launch_id:
            return False
        return not (self.status == FAILED and (self.reason or "").startswith(PREFLIGHT_FAILED))


@dataclass
class Study:
    id: str
    recipe: str
    model: str  # the served model name
    topologies: list[TopologyState]
    levels: list[int]
    runs: int = 5
    pp: int = 1024
    tg: int = 128
    extra_body: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)  # --set FLAG=VALUE, as vLLM flags
    # A study of request rates (bench/load.py) instead of lockstep levels: each topology swept at these
    # rates, or searched for its highest rate meeting `slo`; and the context depths a lockstep study sweeps.
    rates: list[float] | None = None
    slo: str | None = None
    find_max_rate: bool = False
    arrivals: str = "poisson"
    requests: int | None = None
    duration: float = 30.0
    depths: list[int] | None = None
    prefix_cache: bool = False
    recipe_path: str | None = None
    card: str | None = None  # the model card the predictions used
    inventory: str | None = None  # the inventory file, if one was given
    inventory_key: str | None = None  # which fitted constants apply (see model.fit)
    nodes: list[str] = field(default_factory=list)
    image: str | None = None
    # The nodes' pace (an inventory's defaults.twin_speed: twins at --speed S): its figures are S times a
    # GB10's, and so are its predictions; the vLLM stack and the weight format the predictions used.
    speed: float = 1.0
    stack: str | None = None
    quant: str | None = None
    status: str = "planned"  # planned | running | done | cancelled | interrupted
    stage: str = ""  # the current topology's stage, for `sparktop studies` and the status line
    estimate_s: float | None = None
    created: float = field(default_factory=time.time)
    updated: float | None = None
    ended: float | None = None
    pid: int | None = None  # the process running it (a dead pid: interrupted)
    sparktop_version: str | None = None
    path: Path | None = field(default=None, compare=False)

    # -- where things are --------------------------------------------------

    @property
    def dir(self) -> Path:
        assert self.path is not None, "the study has no directory yet"
        return self.path

    @property
    def runs_dir(self) -> Path:
        return self.dir / "runs"

    @property
    def report_dir(self) -> Path:
        return self.dir / "report"

    def run_dir(self, topology: TopologyState) -> Path | None:
        return self.runs_dir / topology.run if topology.run else None

    def topology(self, name: str) -> TopologyState:
        for t in self.topologies:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def current(self) -> TopologyState | None:
        """The first topology that has not finished."""
        return next((t for t in self.topologies if not t.finished), None)

    def running_here(self) -> bool:
        """Whether the process that runs it is alive (on this machine)."""
        if self.status != "running" or not self.pid:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def state(self) -> str:
        """The status a user reads: a `running` study whose process died is `interrupted`; a finished one
        whose every topology failed is `failed` (it measured nothing)."""
        if self.status == "running" and not self.running_here():
            return "interrupted"
        if self.status == DONE and self.topologies and all(t.status == FAILED for t in self.topologies):
            return FAILED
        return self.status

    @property
    def outcome(self) -> str:
        """`state`, with how many topologies failed when some did: "done, 1 of 3 failed"."""
        state = self.state
        failed = sum(1 for t in self.topologies if t.status == FAILED)
        if state != FAILED and failed:
            return f"{state}, {failed} of {len(self.topologies)} failed"
        return state

    # -- on disk -----------------------------------------------------------

    def save(self) -> None:
        self.updated = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        data.pop("path", None)
        tmp = self.dir / (STUDY + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.dir / STUDY)

    @classmethod
    def from_dict(cls, data: dict, path: Path | None = None) -> Study:
        known = {f.name for f in fields(TopologyState)}
        tops = [TopologyState(**{k: v for k, v in t.items() if k in known}) for t in data.get("topologies", [])]
        for t in tops:  # by engine_ids' id: a study written as `llama-cpp` (before llama.cpp was its id) resumes
            if t.runtime and (row := engine_ids.lookup(t.runtime)) is not None:
                t.runtime = row.id
        names = {f.name for f in fields(cls)} - {"topologies", "path"}
        return cls(topologies=tops, path=path, **{k: v for k, v in data.items() if k in names})


def load_study(ref: str | Path) -> Study:
    """A study by id (under the studies dir) or by directory."""
    p = Path(ref)
    if not (p / STUDY).exists():
        p = studies_dir() / str(ref)
    if not (p / STUDY).exists():
        raise SparktopError(f"{ref}: no such study (not a directory with {STUDY}, nor an id under {studies_dir()}; "
                            "see `sparktop studies`)")
    try:
        data = json.loads((p / STUDY).read_text())
    except ValueError as e:
        raise SparktopError(f"{p / STUDY}:{getattr(e, 'lineno', 1)}: not valid JSON ({e})") from None
    return Study.from_dict(data, p)


def list_studies(root: Path | None = None) -> list[Study]:
    root = root or studies_dir()
    out = []
    if root.exists():
        for d in sorted(root.iterdir()):
            if (d / STUDY).exists():
                try:
                    out.append(load_study(d))
                except SparktopError:
                    continue
    return out
