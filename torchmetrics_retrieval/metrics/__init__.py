"""``torchmetrics.Metric`` classes: state, update, DDP sync, and a ``compute`` that calls the functional core.

The classes that keep every sample share :class:`~torchmetrics_retrieval.metrics._state.SampleAccumulator`
(validation against previous batches, DDP gather safe with empty ranks, de-duplication by ``indexes``).
"""

from torchmetrics_retrieval.metrics._sharded.faults import ShardedComputeError
from torchmetrics_retrieval.metrics.contrastive import ContrastiveAccuracy
from torchmetrics_retrieval.metrics.cross_modal import CrossModalRetrieval
from torchmetrics_retrieval.metrics.embedding import EmbeddingMetrics
from torchmetrics_retrieval.metrics.qrels import QrelsMetrics
from torchmetrics_retrieval.metrics.topology import PCF
from torchmetrics_retrieval.metrics.trials import TrialMetrics
from torchmetrics_retrieval.metrics.verification import FNMRAtFMR

__all__ = [
    "PCF",
    "ContrastiveAccuracy",
    "CrossModalRetrieval",
    "EmbeddingMetrics",
    "FNMRAtFMR",
    "ShardedComputeError",
    "TrialMetrics",
]

# graded relevance with qrels (issue 42)
__all__ += ["QrelsMetrics"]
