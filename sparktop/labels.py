"""The labels sparktop puts on the containers of a launch that say what it serves, as the model names it.

A recipe's `quantization:` and the vLLM build it was measured on are no flags of the engine's, so they
reach whoever reads the container only this way: the twin (which serves the prediction they name) and
the monitor (which predicts a watched engine as `predict` predicts its recipe). `launch.prediction`
writes them, `model.forecast.labelled_card` reads the card and its format back.
"""

from __future__ import annotations

CARD = "sparktop.card"  # the model card's name
QUANT = "sparktop.quant"  # its quantisation scheme (`mxfp4-spark`)
STACK = "sparktop.stack"  # the vLLM build's stack (`ngc-vllm`)
FIT = "sparktop.fit"  # the path of the inventory's own fitted constants, where the launch was planned
PREDICTION = (CARD, QUANT, STACK, FIT)


def prediction_labels(labels: dict[str, str]) -> dict[str, str]:
    """The labels of `labels` that say what an engine serves."""
    return {k: v for k, v in labels.items() if k in PREDICTION}
