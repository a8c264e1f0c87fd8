"""sparktop: watch, launch and benchmark vLLM on NVIDIA DGX Spark nodes."""

__version__ = "0.1.0"
