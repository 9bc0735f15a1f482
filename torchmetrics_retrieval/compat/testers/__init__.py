"""pytorch-metric-learning's testers: a model and datasets in, nearest-neighbour accuracies out.

Same classes, options, methods and results as ``pytorch_metric_learning.testers``; the metrics come from
:class:`torchmetrics_retrieval.compat.pml.AccuracyCalculator` (any object with its ``get_accuracy`` and
``get_curr_metrics`` works, e.g. pytorch-metric-learning's own calculator or a subclass)::

    from torchmetrics_retrieval.compat import testers  # or: from torchmetrics_retrieval import testers

    tester = testers.GlobalEmbeddingSpaceTester(batch_size=64, dataloader_num_workers=0)
    all_accuracies = tester.test({"train": train_set, "val": val_set}, epoch, model)
    all_accuracies["val"]["precision_at_1_level0"]

Every dataset is embedded once (model in eval mode, no gradients, batches in order). ``splits_to_eval`` is a
list of ``(query_split, [reference_splits])``; by default every split is its own query and reference set.
When the query split is among its reference splits, it is put first, so that query i is reference row i
and is left out of its own neighbours (``ref_includes_query``).

Results are stored in ``tester.all_accuracies[query_split][f"{metric}_level{L}"]`` for every label
hierarchy level L evaluated (and ``AVERAGE_{metric}`` over the levels when there are several), plus
``["epoch"]``.

Differences from pytorch-metric-learning: labels keep their dtype (it builds float32 label tensors in
the two-stream tester), bad options and split names raise ``ValueError``/``TypeError`` instead of failing
an ``assert``, the caller's ``splits_to_eval`` is not modified, and PCA is an exact eigendecomposition of
the covariance in float64 (faiss' ``PCAMatrix`` in pytorch-metric-learning; the components agree up to
sign, which leaves every distance unchanged).

Layout (private modules, as pytorch-metric-learning's ``testers`` package): ``_preprocess`` (label ranks and
levels, standardisation, PCA, the sets of one search), ``_base`` (``BaseTester``), ``_global``
(``GlobalEmbeddingSpaceTester``, ``GlobalTwoStreamEmbeddingSpaceTester``), ``_same_parent``
(``WithSameParentLabelTester``).
"""

from torchmetrics_retrieval.compat.testers._base import BaseTester
from torchmetrics_retrieval.compat.testers._global import (
    GlobalEmbeddingSpaceTester,
    GlobalTwoStreamEmbeddingSpaceTester,
)
from torchmetrics_retrieval.compat.testers._same_parent import WithSameParentLabelTester

__all__ = [
    "BaseTester",
    "GlobalEmbeddingSpaceTester",
    "GlobalTwoStreamEmbeddingSpaceTester",
    "WithSameParentLabelTester",
]
