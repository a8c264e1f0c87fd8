"""The performance model: what a model on GB10 node(s) under vLLM does, computed.

A product feature in its own right (`sparktop predict`, the launcher's
prediction, the sweep's predicted column) and the clock of the twin:

- `hardware`: GB10 by precision (bandwidth, tensor throughput, the link),
  with the source of every figure in `data/`;
- `architecture`: a model's layers read from its real `config.json`;
- `quant`: what a quantization stores and which kernel path vLLM takes for
  it on SM 12.x, hence the precision its GEMMs compute in;
- `cards`: the models sparktop knows (one YAML per model in `data/cards/`);
- `constants`: the few shared physical constants (`Constants`) and the
  factors a runtime or a vLLM build multiplies them by; it imports nothing
  else of the model;
- `perf`: the roofline of one engine step, and memory;
- `scheduler`: vLLM v1's scheduler, clock-free;
- `simulate`: the scheduler on a virtual clock, as a sweep would measure it;
- `predict`: rows per topology and concurrency, the recommendation;
- `fit`: the few shared constants fitted to the published figures, and the
  cross-validation that says how far to trust a prediction.

It imports nothing from `twin`, `launch`, `observe` or `ui`.
"""
