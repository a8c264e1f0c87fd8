"""What sparktop serves to Prometheus, held to Prometheus' own tools (issue 38): `promtool check metrics`
on the exporter's text, `promtool check rules` and `promtool test rules` on the alerting rules shipped
beside the Grafana dashboard, and a real Prometheus scraping `sparktop collect --serve-metrics` that
watches two twin engines, one given as `localhost` with a user and password in its URL.

Debian's `prometheus` package has both programs (scripts/test installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from sparktop.history.exporter import METRICS
from tests.conftest import free_port
from tests.helpers.twin_process import start_twin_process
from tests.integration.test_history_collect import Collector, _ask

GRAFANA = Path(__file__).resolve().parents[2] / "docs" / "grafana"
RULES = GRAFANA / "sparktop-alerts.yml"
RULE_TESTS = GRAFANA / "sparktop-alerts.test.yml"
PASSWORD = "s3cret-pw-38"
USER = "watcher"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian's `prometheus` package has it; scripts/test installs it)")
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus is not installed (Debian's `prometheus` package; scripts/test installs it)")


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd)


# -- what is shipped ------------------------------------------------------------------------------------


@needs_promtool
def test_promtool_finds_nothing_to_fix_in_what_the_exporter_serves():
    """Every figure the exporter has (the recorded two-engine session with a link, DMI and clock reasons),
    latency percentiles among them."""
    from tests.unit.test_exporter import populated

    _, text = populated(price_per_kwh=0.32)
    assert "quantile=" in text
    checked = promtool("check", "metrics", stdin=text)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


@needs_promtool
def test_the_alerting_rules_are_valid_and_their_unit_tests_pass():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 16 rules found" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=GRAFANA)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_waits_says_how_bad_and_queries_only_what_is_exported():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {t["alertname"] for test in tests for t in test["alert_rule_test"] if t["exp_alerts"]}
    for rule in rules:
        assert re.fullmatch(r"\d+m", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert rule["alert"] in tested, f"{rule['alert']}: no test makes it fire"
        names = set(re.findall(r"\bsparktop_[a-z0-9_]+", rule["expr"]))
        assert names <= set(METRICS), (rule["alert"], names - set(METRICS))
    # What the issue asks to be alerted on, each there.
    assert {r["alert"] for r in rules} >= {
        "SparktopNodeLost", "SparktopNodeMemoryLow", "SparktopNodeMemoryCritical", "SparktopEngineDown",
        "SparktopEngineHung", "SparktopKVCacheSaturated", "SparktopEnginePreempting", "SparktopNCCLOnSockets",
        "SparktopLinkOneHalf", "SparktopGPUThrottled", "SparktopHistoryPaused", "SparktopReplicaImbalance",
        "SparktopGPULowClock", "SparktopNodeDiskLow", "SparktopNodeDiskFull"}


# -- a real Prometheus ----------------------------------------------------------------------------------


class Prometheus:
    """`prometheus` scraping one target every second, with the shipped alerting rules loaded."""

    def __init__(self, tmp_path: Path, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "sparktop", "static_configs": [{"targets": [target]}]}],
        }))
        self.log = open(tmp_path / "prometheus.log", "w+")  # noqa: SIM115 - read after it stops
        self.proc = subprocess.Popen(["prometheus", f"--config.file={config}",
                                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path: str, **params) -> dict | list:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]  # type: ignore[index]

    def until(self, what: str, check, timeout: float = 90.0):
        """`check()`'s first true answer; fails, with Prometheus' log, after `timeout` s."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited: {self.logged()}"
            try:
                last = check()
            except (httpx.HTTPError, KeyError, IndexError):
                last = None
            if last:
                return last
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout:g} s (last: {last}); prometheus said: {self.logged()}")

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@needs_prometheus
@pytest.mark.slow
def test_prometheus_scrapes_one_series_per_engine_and_no_password(tmp_path):
    """Slow (about a minute on two cores): two twin engines, a collector and Prometheus each start as
    processes, and the latency summaries need requests over two histogram reads of the engines (every
    5 s) before they exist. Waits on what each says, never a fixed time."""
    twins = [start_twin_process("llama-3.1-8b", speed=8) for _ in range(2)]
    (first, first_url), (second, second_url) = twins
    first_port = first_url.rsplit(":", 1)[1]
    ours = {first_url, second_url}  # as sparktop names them: http://127.0.0.1:PORT, whatever was typed
    metrics_port = free_port()
    collect = prometheus = None
    try:
        collect = Collector(tmp_path, "--engine", f"http://{USER}:{PASSWORD}@localhost:{first_port}",
                            "--engine", second_url.removeprefix("http://") + "/v1", "-i", "0.5",
                            "--file", str(tmp_path / "history.sqlite"),
                            "--serve-metrics", f"127.0.0.1:{metrics_port}")
        collect.wait_for("serving Prometheus metrics on")
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{metrics_port}")
        prometheus.until("the target up", lambda: [
            t for t in prometheus.api("targets")["activeTargets"]  # type: ignore[index]
            if t["health"] == "up" and t["labels"]["job"] == "sparktop"])

        def ready() -> set[str]:
            up = {r["metric"]["engine"] for r in prometheus.query("sparktop_engine_up == 1")}
            return up if ours <= up else set()

        prometheus.until("both engines up", ready)
        engines = {r["metric"]["engine"] for r in prometheus.query("last_over_time(sparktop_engine_up[1h])")}
        # Each of ours is one engine, however it was given and found; any other is this machine's own,
        # found by its node on a port of its own (none in a test worker's network).
        ports = {url.rsplit(":", 1)[1] for url in ours}
        assert {e for e in engines if e.rsplit(":", 1)[-1] in ports} == ours
        foreign = {e for e in engines if e.rsplit(":", 1)[-1] not in ports}
        cluster = prometheus.until("the cluster's count", lambda: prometheus.query("sparktop_cluster_engines"))
        assert float(cluster[0]["value"][1]) == 2 + len(foreign)
        # One engine, one series, from the collector's first scrape on: its up, and its info once it answered.
        for name in ("sparktop_engine_up", "sparktop_engine_info"):
            seen = {r["metric"]["engine"]: float(r["value"][1])
                    for r in prometheus.query(f"count by (engine) (last_over_time({name}[1h]))")}
            assert {e: seen.get(e) for e in ours} == {e: 1.0 for e in ours}, name
        info = {r["metric"]["engine"]: r["metric"] for r in prometheus.query("sparktop_engine_info")}
        assert {info[e]["model"] for e in ours} == {"llama-3.1-8b"} and {info[e]["kind"] for e in ours} == {"vllm"}

        # Requests, until the latency percentiles are there: summaries, stored as Prometheus stores them.
        def percentiles():
            _ask(first_url, 2)
            _ask(second_url, 2)
            return prometheus.query('sparktop_engine_time_to_first_token_seconds{quantile="0.95"}')

        found = prometheus.until("the TTFT summaries", percentiles)
        assert {r["metric"]["engine"] for r in found} & ours
        body = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert "# TYPE sparktop_engine_time_to_first_token_seconds summary" in body
        checked = promtool("check", "metrics", stdin=body)
        assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")

        # No label anywhere holds the password, nor the user: names, values, every series' labels.
        for label in prometheus.api("labels"):  # type: ignore[union-attr]
            values = prometheus.api(f"label/{label}/values")
            assert not [v for v in values if PASSWORD in v or USER in v], label  # type: ignore[union-attr]
        series = prometheus.api("series", **{"match[]": '{__name__=~"sparktop_.+"}'})
        assert len(series) > 50 and PASSWORD not in repr(series) and USER not in repr(series)
        assert PASSWORD not in body and USER not in body

        # The alerting rules load, and every one evaluates on these series without an error.
        def evaluated():
            rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]  # type: ignore[index]
            return rules if rules and all(r["health"] != "unknown" for r in rules) else None

        rules = prometheus.until("the rules evaluated", evaluated)
        assert len(rules) == 16 and [r["name"] for r in rules if r["health"] != "ok"] == []
        code, out, err = collect.stop()
    finally:
        if prometheus is not None:
            prometheus.stop()
        if collect is not None:
            collect.stop()
        for proc, _ in twins:
            proc.terminate()
            proc.wait(10)
    assert code == 0, err
    assert PASSWORD not in out + err
    # Nor did the password reach the history.
    assert PASSWORD.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("history.sqlite*"))
