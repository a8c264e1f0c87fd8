"""Shared fixtures (in-process twin servers, free ports, a clean XDG home) and
how a parallel run is laid out (pytest-xdist, `-n`):

- each worker runs in a network namespace of its own (tests/helpers/netns.py),
  so the fixed addresses and ports of the lab, the demo and what they launch
  never meet another worker's;
- the controller makes the tools the selected tests install on first use in
  the background (tests/helpers/prepare.py), since the workers have no route
  to PyPI;
- tests that share an expensive fixture (a module's lab, the session's real
  vLLM) run on one worker, as one group (`--dist loadgroup`), and the groups
  that take longest are handed out first.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparktop.twin.dialects.vllm_args import parse_serve_args
from sparktop.twin.server import TwinServer
from tests.helpers import venvs
from tests.helpers.netns import enter_own_network, isolated_python
from tests.helpers.prepare import LOG, TOOLS, needed

_preparing: list[subprocess.Popen] = []


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        if not os.environ.get("SPARKTOP_TEST_ISOLATED"):  # started without worker_init: the network, at least
            why = enter_own_network()
            if why is not None:
                raise pytest.UsageError(f"a parallel run gives each worker its own network namespace, and this "
                                        f"machine refused one ({why}): run the tests without -n")
        os.environ[venvs.OFFLINE] = "1"
        return
    if not (config.pluginmanager.has_plugin("xdist") and config.getoption("numprocesses", None)):
        return
    wrapper = isolated_python()
    if wrapper is not None:  # every worker a machine of its own: network and process table
        config.option.tx = [f"popen//python={shlex.join(wrapper)}" if tx == "popen" else tx
                            for tx in config.option.tx]
    if os.environ.get("SPARKTOP_TEST_PREPARE", "1") != "0":
        _prepare(config)


def _prepare(config) -> None:
    """Start making, in the background, the tools this run's tests will want."""
    tools = needed(_selected_paths(config), _marks_selector(config))
    if not tools:
        return
    venvs.LAB.mkdir(exist_ok=True)
    # Locked here and handed over, so a worker never finds the lock free before `prepare` has begun.
    lock = os.open(venvs.PREPARE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another run's `prepare` is at work: the workers wait for it as they would for ours
        os.close(lock)
        print("tests: another `prepare` is making the tools; this run's workers wait for it", file=sys.stderr)
        return
    # What an earlier run could not make is tried again; until then a worker must not read the old reason.
    for name in tools:
        TOOLS[name].forget_failure()
    with open(LOG, "a") as log:
        _preparing.append(subprocess.Popen([sys.executable, "-m", "tests.helpers.prepare", *tools],
                                           stdout=log, stderr=subprocess.STDOUT, pass_fds=[lock],
                                           cwd=str(venvs.LAB.parent), start_new_session=True))
    os.close(lock)


def _selected_paths(config) -> list[str]:
    """The run's paths, relative to the project ("tests/unit", "tests/real/x.py::test_y")."""
    out = []
    for arg in config.args or ["."]:
        path, _, rest = str(arg).partition("::")
        try:
            rel = (Path(config.invocation_params.dir) / path).resolve().relative_to(config.rootpath)
        except ValueError:
            continue
        out.append(rel.as_posix() + (f"::{rest}" if rest else ""))
    return out


def _marks_selector(config):
    """Whether `-m` selects a test carrying exactly a given set of markers."""
    expr = config.getoption("markexpr", "")
    if not expr:
        return lambda marks: True
    from _pytest.mark.expression import Expression  # pytest's own -m grammar (pytest<9, pinned)

    compiled = Expression.compile(expr)
    return lambda marks: compiled.evaluate(lambda name, **kw: name in marks)


def pytest_unconfigure(config):
    for proc in _preparing:
        if proc.poll() is None:  # a run cut short: its installs and build stop too, and are made again next time
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


# How long each kind of group takes decides when it is handed out: the longest first, so that no worker is
# left with a long group at the end; the real engines' groups once their tools are likely made.
_FIRST = ("tests/e2e/",)


def _shared_group(item) -> str | None:
    """The group of a test that uses a fixture wider than itself, defined by
    this project: a session fixture's name, else its module."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = None
    for name in item.fixturenames:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if not fixturedef.baseid and "tests" not in str(getattr(fixturedef.func, "__module__", "")):
                continue  # a plugin's (tmp_path_factory, the event loop policy)
            if fixturedef.scope == "session":
                return f"session-{name}"
            if fixturedef.scope in ("package", "module", "class"):
                module = item.nodeid.split("::")[0]
    return module


def _rank(item) -> int:
    if item.get_closest_marker("realvllm") or item.get_closest_marker("realllama"):
        return 1
    if item.nodeid.startswith(_FIRST):
        return 0
    return 2 if item.get_closest_marker("slow") else 3


SAYS_WHY_AFTER_S = 30.0  # a test longer than this says why in its docstring (tests/README.md)
_UNEXPLAINED: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # On the controller too (xdist forwards the reports): the whole run's tests, wherever they ran.
    if report.when == "call" and report.duration > SAYS_WHY_AFTER_S and \
            not dict(report.user_properties).get("says_why", True):
        _UNEXPLAINED[report.nodeid] = report.duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":
        doc = getattr(getattr(item, "function", None), "__doc__", None)
        report.user_properties.append(("says_why", bool(doc and doc.strip())))  # sent from xdist's workers


def pytest_terminal_summary(terminalreporter):
    if _UNEXPLAINED:
        terminalreporter.write_sep("-", f"tests over {SAYS_WHY_AFTER_S:.0f} s without a docstring saying why")
        for nodeid, seconds in sorted(_UNEXPLAINED.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            group = _shared_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_rank)  # stable: the collection's order within a rank


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Never read or write the developer's real config, results or state."""
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(var, str(tmp_path / "xdg" / sub))
    monkeypatch.delenv("SPARKTOP_TWIN_HOME", raising=False)
    monkeypatch.delenv("SPARKTOP_TWIN_SPEED", raising=False)


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture
async def twin():
    """Factory: `await twin("gpt-oss-120b", "--max-num-seqs", "8", speed=2)`
    returns a started in-process TwinServer; all are stopped at teardown."""
    servers: list[TwinServer] = []

    async def make(model: str = "gpt-oss-120b", *flags: str, speed: float = 1.0,
                   startup_speed: float = 1e6, host=None) -> TwinServer:
        args = parse_serve_args([model, "--host", "127.0.0.1", "--port", "0", "--speed", str(speed),
                                 "--startup-speed", str(startup_speed), *flags])
        server = TwinServer(args, log=io.StringIO(), host=host)
        servers.append(server)
        await server.start()
        return server

    yield make
    for server in servers:
        await server.stop()
