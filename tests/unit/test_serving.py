"""vLLM's serving flags as the performance model reads them: one reading for
`predict`, the launcher and the twin, with vLLM's defaults on a GB10."""

from __future__ import annotations

import pytest

from sparktop.errors import SparktopError
from sparktop.model.serving import Serving


def test_defaults_are_vllms_for_a_gpu_of_70_gib_or_more():
    s = Serving()
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (1024, 8192)
    assert s.enable_prefix_caching and s.enable_chunked_prefill and s.kv_dtype_bytes is None


def test_flags_in_every_spelling_a_recipe_or_the_command_line_uses():
    s = Serving.from_flags({"max-num-seqs": "64", "--kv-cache-dtype": "fp8_e4m3", "max_model_len": "32k",
                            "no_enable_prefix_caching": True, "enforce_eager": "true", "port": 8000})
    assert (s.max_num_seqs, s.max_model_len, s.kv_dtype_bytes) == (64, 32768, 1)
    assert not s.enable_prefix_caching and s.enforce_eager


def test_without_chunked_prefill_a_whole_prompt_fits_one_step():
    s = Serving.from_flags({"enable_chunked_prefill": False, "max_model_len": 65536})
    assert s.max_num_batched_tokens == 65536


@pytest.mark.parametrize("flags, message", [
    ({"max_num_seqs": "lots"}, "max_num_seqs='lots'"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
    ({"enforce_eager": "maybe"}, "expected true or false"),
])
def test_bad_values_name_the_flag(flags, message):
    with pytest.raises(SparktopError, match=message):
        Serving.from_flags(flags, "recipes/x.yaml")
