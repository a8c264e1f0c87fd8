"""A watched engine's prediction is `sparktop predict`'s, for its own command line.

`status`, the sweep screen and the cards ask `launch.prediction` about an engine the monitor found; it reads
the engine's flags with its runtime's parser (the one launch reads others' recipes with), so an engine started
with `--max-num-seqs 2` is predicted as `predict --set max_num_seqs=2` predicts it, and its secrets never
reach the snapshot."""

from __future__ import annotations

import json

from sparktop.cli import main
from sparktop.launch.prediction import engine_serving, predicted_now
from sparktop.masking import mask_argv
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.settings import load_inventory
from sparktop.status import engine_json


def _engine(argv: list[str], running: float = 4) -> EngineSnapshot:
    # 10 requests done: 10,240 prompt and 1,280 generated tokens, the means predict's defaults are.
    return EngineSnapshot(key="http://a:8000", url="http://a:8000", t=0, state="ready", kind="vllm",
                          model="gpt-oss-120b", running=running, requests=10, prompt_tokens_total=10240,
                          gen_tokens_total=1280, argv=argv)


def _predict(capsys, *extra: str) -> float:
    assert main(["predict", "--model", "gpt-oss-120b", "-c", "4", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["rows"][0]["decode_tps"]


def test_status_predicts_a_watched_engine_as_predict_does_with_its_own_flags(capsys):
    inventory = load_inventory()
    capped = _engine(["vllm", "serve", "openai/gpt-oss-120b", "--max-num-seqs", "2", "--api-key", "***"])
    free = _engine(["vllm", "serve", "openai/gpt-oss-120b"])
    capped_json, free_json = engine_json(capped, inventory=inventory), engine_json(free, inventory=inventory)
    assert capped_json["predicted"]["concurrency"] == 4
    assert (capped_json["predicted"]["prompt_tokens"], capped_json["predicted"]["output_tokens"]) == (1024, 128)
    assert capped_json["predicted"]["gen_tps"] == round(_predict(capsys, "--set", "max_num_seqs=2"), 1)
    assert free_json["predicted"]["gen_tps"] == round(_predict(capsys), 1)
    # Two slots for four requests: half of them wait, the engine serves less than with 1,024 slots.
    assert capped_json["predicted"]["gen_tps"] < free_json["predicted"]["gen_tps"]


def test_an_idle_engine_or_a_router_has_no_prediction():
    inventory = load_inventory()
    assert predicted_now(_engine([], running=0), inventory) is None
    router = _engine([])
    router.kind = "router"
    assert engine_json(router, inventory=inventory)["predicted"] is None


def test_each_runtime_reads_its_own_flags_into_the_models_names():
    assert engine_serving("vllm", ["vllm", "serve", "m", "--max-num-seqs", "8", "--max-model-len", "32k",
                                   "-tp", "2", "--no-enable-prefix-caching"]).max_num_seqs == 8
    vllm = engine_serving("vllm", ["vllm", "serve", "m", "--max-model-len", "32k", "--no-enable-prefix-caching"])
    assert (vllm.max_model_len, vllm.enable_prefix_caching) == (32768, False)
    assert engine_serving("sglang", ["python3", "-m", "sglang.launch_server", "--model-path", "m",
                                     "--max-running-requests", "6"]).max_num_seqs == 6
    # An engine sparktop does not launch, or no command line: the defaults.
    assert engine_serving("tgi", ["text-generation-launcher", "--max-batch-size", "3"]).max_num_seqs == \
        engine_serving("vllm", []).max_num_seqs


def test_a_command_line_in_a_snapshot_carries_no_secret():
    argv = ["vllm", "serve", "m", "--api-key", "sk-live-0123456789abcdef", "--hf-token=hf_abcdefghijklmnopqrst",
            "HF_TOKEN=x", "--port", "8000", "--endpoint", "http://user:pw@host:1/v1"]
    shown = mask_argv(argv)
    assert shown == ["vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "HF_TOKEN=***", "--port", "8000",
                     "--endpoint", "http://***@host:1/v1"]
    assert not any(s in " ".join(shown) for s in ("sk-live", "hf_abc", "pw@"))


def test_an_engine_launched_from_a_recipe_is_predicted_as_predict_predicts_the_recipe(capsys):
    """The demo's engines and every launch carry the recipe's format and stack as labels (no flag says them):
    the sweep screen, the cards and `status` read them back, so a watched gpt-oss-120b launched from its recipe
    (MXFP4 throughout, the NGC stack) is predicted at the recipe's figure, not the bare card's (BF16 attention)."""
    import shlex

    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.prediction import predicted_for_engine
    from sparktop.launch.topology import make_plan
    from sparktop.observe.host_probe import engines_in
    from sparktop.observe.snapshot import Container

    inventory = load_inventory()
    plan = make_plan(find_recipe("gpt-oss-120b"), "solo", inventory)
    (step,) = [s for s in plan.steps if s.role == "engine"]
    argv = shlex.split(step.command)
    labels = dict(v.split("=", 1) for f, v in zip(argv, argv[1:], strict=False) if f == "--label")
    command = shlex.join(argv[argv.index(plan.image) + 1:])
    found = engines_in(Container(step.container or "e", plan.image, "running", "Up", command=command,
                                 labels=labels), "127.0.0.1")
    assert found is not None and found.serves["sparktop.quant"] == "mxfp4-spark"
    snap = EngineSnapshot(key=found.url, url=found.url, t=0, state="ready", kind=found.kind, model=found.model,
                          argv=found.argv or [], image=found.image, serves=found.serves)
    assert main(["predict", "gpt-oss-120b", "-c", "1", "--json"]) == 0
    by_recipe = json.loads(capsys.readouterr().out)["rows"][0]["decode_tps"]
    assert predicted_for_engine(snap, inventory, 1).decode_tps == by_recipe
    # Without its labels (an engine someone else started from the same image) it is the bare card's figure.
    bare = EngineSnapshot(key=found.url, url=found.url, t=0, state="ready", kind=found.kind, model=found.model,
                          argv=found.argv or [], image=found.image)
    assert predicted_for_engine(bare, inventory, 1).decode_tps < by_recipe
