r"""open-metric-learning's functional metrics, same calls and same numbers, computed by vectorised kernels.

The functions of this package take the arguments of ``oml.functional.metrics`` (open-metric-learning 3.x) and
return what it returns: lists of per-query ``float32`` tensors, and the nested result dictionaries
``{"cmc": {k: value}, "precision": {...}, "map": {...}}`` (with categories:
``{"OVERALL": {...}, category: {...}}``). Where open-metric-learning loops over queries in Python,
the ragged inputs are padded once into a ``(Q, K)`` hit matrix and the kernels of
:mod:`torchmetrics_retrieval.functional.ranking` compute every query and every cutoff at once.

Per-query rules, for a query with ``L`` retrieved items of which ``h_k`` are relevant among the first
``k``, and ``n`` ground-truth items (open-metric-learning's behaviour, quirks included):

* ``L = 0``: every metric is 1 when ``n = 0`` too, else 0.
* ``cmc@k`` = 1 if ``h_k > 0``; ``map@k`` = mean of ``P@i`` over the relevant positions ``i <= k``
  (0 if none); a ``k`` beyond ``L`` uses ``L``.
* ``precision@k`` = ``h_k / min(n, k, L)``; a query with retrieved items but no ground truth
  (``n = 0``) divides by 0 and gets NaN (so does any mean over it) - as in open-metric-learning.

:func:`to_oml_nested` turns the flat result of :func:`torchmetrics_retrieval.functional.retrieval_metrics`
(or of ``EmbeddingMetrics``) into the nested layout of open-metric-learning's ``EmbeddingMetrics``.

Differences from open-metric-learning (deliberate, all on input it mishandles):

* Bad input raises ``ValueError`` (OML: ``assert``, or ``zip`` silently dropping the extra queries when
  the lengths differ).
* Tensor ``query_categories`` are treated as their numpy array (keys are numpy scalars, one per
  category); OML keys its result by each 0-dim tensor, one entry per query.
* ``map@k`` is summed in another order than OML's, so it can differ in the last float32 bit.
* Results are on the device of the inputs (OML: always CPU). ``verbose`` is accepted and ignored: the
  computation is one vectorised pass, with no progress to show.

Layout (private modules): ``_inputs`` (argument checks, ragged lists -> one padded tensor, categories),
``_ranking`` (``calc_cmc``, ``calc_precision``, ``calc_map``, ``calc_retrieval_metrics``), ``_verification``
(``calc_fnmr_at_fmr``), ``_topology`` (``calc_pcf``, ``calc_topological_metrics``), ``_nested``
(``to_oml_nested``).
"""

from torchmetrics_retrieval.compat.oml._inputs import OVERALL_CATEGORIES_KEY
from torchmetrics_retrieval.compat.oml._nested import to_oml_nested
from torchmetrics_retrieval.compat.oml._ranking import calc_cmc, calc_map, calc_precision, calc_retrieval_metrics
from torchmetrics_retrieval.compat.oml._topology import calc_pcf, calc_topological_metrics
from torchmetrics_retrieval.compat.oml._verification import calc_fnmr_at_fmr

__all__ = [
    "OVERALL_CATEGORIES_KEY",
    "calc_cmc",
    "calc_fnmr_at_fmr",
    "calc_map",
    "calc_pcf",
    "calc_precision",
    "calc_retrieval_metrics",
    "calc_topological_metrics",
    "to_oml_nested",
]
