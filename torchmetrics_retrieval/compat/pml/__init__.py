"""pytorch-metric-learning's ``AccuracyCalculator`` (2.x API), computed by :mod:`torchmetrics_retrieval.functional`.

Swap the import and keep the code::

    # from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from torchmetrics_retrieval.compat.pml import AccuracyCalculator

    calculator = AccuracyCalculator(k="max_bin_count", exclude=("NMI", "AMI"))
    accuracies = calculator.get_accuracy(query, query_labels, reference, reference_labels, ref_includes_query=False)

The constructor, ``get_accuracy``, the metric names, the result (a dict of Python floats, or of lists
with ``return_per_class=True``), the validation errors and the extension mechanism (``calculate_<name>``
methods listed by ``requires_knn`` / ``requires_clustering``, called with the same keyword arguments)
are pytorch-metric-learning's. The search is an exact kNN (:func:`~torchmetrics_retrieval.functional.knn`,
squared Euclidean distances like faiss' ``IndexFlatL2``), hits come from
:func:`~torchmetrics_retrieval.functional.relevance_matrix` and
:func:`~torchmetrics_retrieval.functional.count_relevant`, values from the ranking kernels and
averages from :mod:`~torchmetrics_retrieval.functional.reduction`.

The numbers are pytorch-metric-learning's, quirks included: every metric is computed within the k
retrieved neighbours (``mean_reciprocal_rank`` is 0 for a query whose first hit lies beyond k,
``mean_average_precision`` divides the precision summed over the k neighbours by R);
``r_precision`` divides by min(R, k); queries whose label has no other match in the reference set
("lone" queries) are left out of every kNN metric, and a metric is NaN when every query is lone.

Where pytorch-metric-learning departs from docs/definitions.md, this package follows the definitions:

* Labels keep their dtype (pytorch-metric-learning casts them to float32, so int labels above 2**24
  collide and float labels are rounded).
* R, the number of relevant references of a query, is counted exactly: with ``ref_includes_query``
  the query's own row is subtracted only if the comparison function matches a label with itself
  (pytorch-metric-learning always subtracts 1, which is off by one for non-reflexive functions).
* 2-D labels with the default comparison match when the whole row is equal (pytorch-metric-learning's
  default ``torch.eq`` compares column by column and averages the columns in some metrics).
* The query's own row is removed from its neighbours by position, before the search (never by dropping
  "the first neighbour", wrong when duplicates sit at distance 0); equal distances are ordered by
  reference position.
* With the 1.x call (``embeddings_come_from_same_source=True``) the query may be any subset of the
  reference, as 1.x allowed: each query row is matched to a reference row with exactly the same
  embedding and label, the j-th repeat of a row among the queries to the j-th occurrence of that row in
  the reference. (The 2.x ``ref_includes_query=True`` requires, like pytorch-metric-learning, that the
  query set be the first rows of the reference set; query i is then reference row i.)
* ``mean_reciprocal_rank`` alone works (pytorch-metric-learning forgets it in ``requires_knn`` and
  crashes); padding slots of a search asking for more neighbours than there are references are
  dropped (k is capped at the number of candidates) instead of being read as the last reference's label.
* Metric names passed to ``get_accuracy`` are checked (pytorch-metric-learning ignores typos silently).

Warnings that pytorch-metric-learning writes to its logger are issued with :func:`warnings.warn`.

Layout (private modules, imported in this order): ``_values`` (per-query values and reductions),
``_functions`` (the module-level helpers of ``accuracy_calculator``), ``_search`` (the default ``knn_func``
and ``kmeans_func``), ``_inputs`` (checks of ``get_accuracy``'s inputs, the 1.x call forms),
``_calculator`` (``AccuracyCalculator``).
"""

from torchmetrics_retrieval.compat.pml._calculator import AccuracyCalculator
from torchmetrics_retrieval.compat.pml._functions import (
    get_label_match_counts,
    get_lone_query_labels,
    get_unique_labels,
    maybe_get_avg_of_avgs,
    mean_average_precision,
    mean_reciprocal_rank,
    nan_accuracy,
    precision_at_k,
    r_precision,
    try_getting_not_lone_labels,
)
from torchmetrics_retrieval.compat.pml._search import ExactKNN, KMeans, KMeansFunc, KNNFunc
from torchmetrics_retrieval.compat.pml._values import EQUALITY, Accuracy, LabelComparison

__all__ = [
    "EQUALITY",
    "Accuracy",
    "AccuracyCalculator",
    "ExactKNN",
    "KMeans",
    "KMeansFunc",
    "KNNFunc",
    "LabelComparison",
    "get_label_match_counts",
    "get_lone_query_labels",
    "get_unique_labels",
    "maybe_get_avg_of_avgs",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "nan_accuracy",
    "precision_at_k",
    "r_precision",
    "try_getting_not_lone_labels",
]
