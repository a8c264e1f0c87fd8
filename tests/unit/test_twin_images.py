"""The twin's `docker save` and `docker load`: a tar stream that carries an image to another host with its ID, and
a stream cut short that adds nothing."""

from __future__ import annotations

import pytest

from sparktop.twin.containers import DockerError, image_id
from sparktop.twin.host import TwinHost
from sparktop.twin.images import cmd_load, cmd_save, human_size, image_size


def test_save_then_load_keeps_the_image_id(tmp_path, capsys):
    a, b = TwinHost(tmp_path / "a"), TwinHost(tmp_path / "b")
    a.setup("a", images=[{"name": "lab/img:1", "size": 3_000_000, "env": {"X": "1"}, "entrypoint": ["serve"]}])
    b.setup("b", images=[])
    tar = tmp_path / "img.tar"
    assert cmd_save(a, ["-o", str(tar), "lab/img:1"]) == 0
    assert tar.stat().st_size > 3_000_000
    assert cmd_load(b, ["-i", str(tar)]) == 0
    assert capsys.readouterr().out == "Loaded image: lab/img:1\n"
    assert image_id(b, "lab/img:1") == image_id(a, "lab/img:1")
    assert image_size(b, "lab/img:1") == 3_000_000
    entry = next(e for e in b.images if isinstance(e, dict))
    assert entry["env"] == {"X": "1"} and entry["entrypoint"] == ["serve"]


def test_a_stream_cut_short_loads_nothing(tmp_path):
    a, b = TwinHost(tmp_path / "a"), TwinHost(tmp_path / "b")
    a.setup("a", images=[{"name": "lab/img:1", "size": 2_000_000}])
    b.setup("b", images=[])
    tar = tmp_path / "img.tar"
    cmd_save(a, ["-o", str(tar), "lab/img:1"])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(tar.read_bytes()[:1_000_000])
    with pytest.raises(DockerError, match="unexpected EOF"):
        cmd_load(b, ["-i", str(cut)])
    assert image_id(b, "lab/img:1") is None


def test_save_names_an_image_the_host_lacks(tmp_path):
    a = TwinHost(tmp_path / "a")
    a.setup("a", images=[])
    with pytest.raises(DockerError, match="reference does not exist: nope:1"):
        cmd_save(a, ["-o", str(tmp_path / "x.tar"), "nope:1"])
    assert human_size(20_000_000_000) == "20GB" and human_size(12_345_678) == "12.3MB"
