"""torchmetrics-retrieval: exact, fast, distributed retrieval metrics for embedding models."""

from torchmetrics_retrieval import functional

__version__ = "0.1.0"

__all__ = ["__version__", "functional"]
