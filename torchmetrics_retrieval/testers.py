"""pytorch-metric-learning's testers, kept importable here: they live in :mod:`torchmetrics_retrieval.compat.testers`.

``from torchmetrics_retrieval import testers`` and ``from torchmetrics_retrieval.testers import X`` give the
same classes as ``torchmetrics_retrieval.compat.testers``, the home of every pytorch-metric-learning adapter.
"""

from torchmetrics_retrieval.compat.testers import (
    BaseTester,
    GlobalEmbeddingSpaceTester,
    GlobalTwoStreamEmbeddingSpaceTester,
    WithSameParentLabelTester,
)

__all__ = [
    "BaseTester",
    "GlobalEmbeddingSpaceTester",
    "GlobalTwoStreamEmbeddingSpaceTester",
    "WithSameParentLabelTester",
]
