"""`sparktop collect --install` keeps secrets out of the unit file: --notify's webhooks (their URL is their key)
go to the unit's env file, readable by its owner only, and an --engine with credentials is refused."""

from __future__ import annotations

import stat

import pytest

from sparktop.cli import main
from sparktop.history.collect import env_file, notify_from_env, unit_path


def test_the_webhooks_go_to_the_env_file_and_never_into_the_unit(capsys):
    hook = "https://hooks.slack.com/services/T0/B0/SECRETKEY"
    assert main(["collect", "--notify", hook, "--notify=ntfy:https://ntfy.sh/s3cret-topic", "--install"]) == 0
    unit, env = unit_path().read_text(), env_file().read_text()
    assert "SECRETKEY" not in unit and "s3cret" not in unit and "--notify" not in unit
    assert f"SPARKTOP_NOTIFY={hook} ntfy:https://ntfy.sh/s3cret-topic" in env.splitlines()
    assert stat.S_IMODE(env_file().stat().st_mode) == 0o600
    out = capsys.readouterr().out
    assert "SECRETKEY" not in out and "not in the unit" in out
    # The installed collector reads them back from its environment.
    assert notify_from_env(None, {"SPARKTOP_NOTIFY": env.split("=", 1)[1].strip()}) == [
        hook, "ntfy:https://ntfy.sh/s3cret-topic"]
    assert notify_from_env(["https://x.example/h"], {"SPARKTOP_NOTIFY": hook}) == ["https://x.example/h"]


def test_an_engine_with_credentials_is_not_written_into_a_unit(capsys):
    assert main(["collect", "--engine", "http://user:pw@10.0.0.5:8000", "--install"]) == 2
    err = capsys.readouterr().err
    assert "carries credentials" in err and "pw" not in err and not unit_path().exists()


@pytest.fixture(autouse=True)
def _no_real_units(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
