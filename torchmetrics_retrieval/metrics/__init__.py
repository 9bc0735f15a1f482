"""``torchmetrics.Metric`` classes: state, update, DDP sync, and a ``compute`` that calls the functional core.

The classes that keep every sample share :class:`~torchmetrics_retrieval.metrics._state.SampleAccumulator`
(validation against previous batches, DDP gather safe with empty ranks, de-duplication by ``indexes``).
"""

from torchmetrics_retrieval.metrics.embedding import EmbeddingMetrics

# ContrastiveAccuracy (metrics/contrastive.py), FNMRAtFMR (metrics/verification.py) and PCF
# (metrics/topology.py) are exported here once written.

__all__ = ["EmbeddingMetrics"]
