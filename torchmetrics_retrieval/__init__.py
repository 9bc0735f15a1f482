"""torchmetrics-retrieval: exact, fast, distributed retrieval metrics for embedding models.

The metric classes are ``torchmetrics.Metric`` subclasses; :mod:`torchmetrics_retrieval.functional`
holds the stateless core they call; :mod:`torchmetrics_retrieval.compat` the drop-in APIs of
pytorch-metric-learning, open-metric-learning and nidl.
"""

from torchmetrics_retrieval import functional, plotting
from torchmetrics_retrieval.metrics import (
    PCF,
    ContrastiveAccuracy,
    CrossModalRetrieval,
    EmbeddingMetrics,
    FNMRAtFMR,
    QrelsMetrics,  # graded relevance with qrels (issue 42)
    ShardedComputeError,
    TrialMetrics,
)

__version__ = "0.1.0"

__all__ = [
    "PCF",
    "ContrastiveAccuracy",
    "CrossModalRetrieval",
    "EmbeddingMetrics",
    "FNMRAtFMR",
    "ShardedComputeError",
    "TrialMetrics",
    "__version__",
    "functional",
    "plotting",
]

# graded relevance with qrels (issue 42)
__all__ += ["QrelsMetrics"]
