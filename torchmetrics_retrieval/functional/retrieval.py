"""The one entry point: embeddings and labels in, a flat ``dict[str, Tensor]`` of metrics out.

``_evaluate`` checks the inputs once (``_sets``: the query/gallery split) and chains the stages of the package,
each in its own module: ``search`` (one exact kNN search for every cutoff) -> ``relevance`` (hit matrix, n(q)) ->
``ranking`` (per-query kernels, in ``_per_query``) -> ``reduction`` (scalars), plus the verification,
topology and clustering metrics on the same sets when asked for.

Result keys (defined in docs/definitions.md): ``cmc/{k}``, ``precision/{k}``, ``recall/{k}``, ``map/{k}``,
``ndcg/{k}``, ``map`` (full ranking), ``map_at_r``, ``r_precision``, ``mrr``, ``nmi``, ``ami``,
``fnmr@fmr/{f}``, ``tar@far/{f}``, ``pcf/{r}``; with ``categories`` every key also as
``{category}/{key}``; with ``per_class=True`` every ranking key also as ``{key}/class/{label}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, overload

from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_bool, describe
from torchmetrics_retrieval.functional._evaluate import _normalized, evaluate
from torchmetrics_retrieval.functional._options import OptionArguments, RetrievalOptions, Unpack
from torchmetrics_retrieval.functional._per_query import RetrievalResult, per_query
from torchmetrics_retrieval.functional._sets import PairedIds, split_query_gallery
from torchmetrics_retrieval.functional.ranking import PrecisionMode
from torchmetrics_retrieval.functional.reduction import EmptyTargetAction
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.search import Distance, KNNBackend, SearchPrecision

__all__ = ["RetrievalOptions", "RetrievalResult", "retrieval_metrics", "retrieval_per_query"]


def retrieval_per_query(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    categories: Tensor | None = None,
    camera_ids: PairedIds | None = None,
    options: RetrievalOptions | None = None,
    keep_neighbours: bool = True,
) -> RetrievalResult:
    """Per-query ranking values, retrieved ids and distances (one kNN pass for every cutoff).

    Arguments as in :func:`retrieval_metrics`, with the options given as a :class:`RetrievalOptions`.
    With ``keep_neighbours=False`` a ``(Q, K)`` neighbour table larger than 64 MiB is never held whole
    (unless a leave-one-out search takes the symmetric pass, whose candidate buffer is larger): queries are
    searched in chunks and only their per-query values are kept (the result's ``indices``, ``distances``,
    ``valid`` and ``is_relevant`` then have zero columns). The search then also skips the float64
    recomputation that the ranking values do not need: every rank has the same relevance as with exact
    distances, but near-tied items of the same relevance may come in another order.
    """
    if options is not None and not isinstance(options, RetrievalOptions):
        raise TypeError(f"`options` must be a RetrievalOptions or None, got {describe(options)}.")
    check_bool("keep_neighbours", keep_neighbours)
    qg = split_query_gallery(
        query,
        query_labels,
        gallery,
        gallery_labels,
        is_query=is_query,
        is_gallery=is_gallery,
        sequence_ids=sequence_ids,
        search_groups=search_groups,
        categories=categories,
        camera_ids=camera_ids,
    )
    options = options or RetrievalOptions()
    return per_query(_normalized(qg) if options.normalize else qg, options, keep_neighbours)


@overload
def retrieval_metrics(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = ...,
    gallery_labels: Tensor | None = ...,
    *,
    is_query: Tensor | None = ...,
    is_gallery: Tensor | None = ...,
    sequence_ids: PairedIds | None = ...,
    search_groups: PairedIds | None = ...,
    categories: Tensor | None = ...,
    camera_ids: PairedIds | None = ...,
    neighbours: Tensor | None = ...,
    return_per_query: Literal[False] = ...,
    **options: Unpack[OptionArguments],
) -> dict[str, Tensor]: ...


@overload
def retrieval_metrics(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = ...,
    gallery_labels: Tensor | None = ...,
    *,
    is_query: Tensor | None = ...,
    is_gallery: Tensor | None = ...,
    sequence_ids: PairedIds | None = ...,
    search_groups: PairedIds | None = ...,
    categories: Tensor | None = ...,
    camera_ids: PairedIds | None = ...,
    neighbours: Tensor | None = ...,
    return_per_query: Literal[True],
    **options: Unpack[OptionArguments],
) -> tuple[dict[str, Tensor], RetrievalResult | None]: ...


def retrieval_metrics(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    categories: Tensor | None = None,
    camera_ids: PairedIds | None = None,
    neighbours: Tensor | None = None,
    return_per_query: bool = False,
    cmc_top_k: int | Iterable[int] = (1, 5),
    precision_top_k: int | Iterable[int] = (5,),
    map_top_k: int | Iterable[int] = (5,),
    recall_top_k: int | Iterable[int] = (),
    ndcg_top_k: int | Iterable[int] = (),
    map_at_r: bool = False,
    r_precision: bool = False,
    mrr: bool = False,
    map_full: bool = False,
    minp: bool = False,
    clustering: bool = False,
    fmr_vals: float | Iterable[float] = (),
    eer: bool = False,
    roc_auc: bool = False,
    min_dcf_p_target: float | Iterable[float] = (),
    dcf_costs: tuple[float, float] = (1.0, 1.0),
    fpir_vals: float | Iterable[float] = (),
    pcf_variance: float | Iterable[float] = (),
    distance: Distance = "euclidean",
    normalize: bool = False,
    precision_mode: PrecisionMode = "min_k_n",
    empty_target_action: EmptyTargetAction = "skip",
    avg_of_avgs: bool = False,
    per_class: bool = False,
    label_comparison_fn: LabelComparisonFn | None = None,
    confidence_level: float | None = None,
    n_bootstrap: int = 1000,
    seed: int = 0,
    knn_backend: KNNBackend = "auto",
    search_precision: SearchPrecision = "auto",
    chunk_size: int | None = None,
    progress: bool = False,
    approximate_index: str | None = None,
    approximate_params: str = "",
    audit_queries: int = 2000,
) -> dict[str, Tensor] | tuple[dict[str, Tensor], RetrievalResult | None]:
    """Retrieval metrics of embeddings, exact (definitions: docs/definitions.md), as a flat dict of scalars.

    Args:
        query: ``(N, D)`` embeddings. With ``gallery=None`` this is the whole set and
            ``is_query``/``is_gallery`` pick queries and gallery items (missing = all True; a
            sample that is both is left out of its own gallery, by position). Otherwise the queries.
        query_labels: ``(N,)`` or ``(N, L)`` labels, any dtype.
        gallery: ``(G, D)`` gallery embeddings, or None.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels of the gallery (with ``gallery`` only).
        is_query: ``(N,)`` bool mask of the queries (with ``gallery=None`` only).
        is_gallery: ``(N,)`` bool mask of the gallery items (with ``gallery=None`` only).
        sequence_ids: items sharing the query's sequence id are left out of its gallery. One
            ``(N,)`` tensor with ``gallery=None``, else a ``(query_side, gallery_side)`` pair.
        search_groups: the gallery of a query is restricted to its own group (same forms).
        categories: ``(N,)`` (or ``(Q,)`` with a separate gallery) category of each sample; every
            metric is also reported per query category as ``{category}/{key}``.
        camera_ids: the camera of each sample (re-identification protocol): an item with the query's label
            *and* camera is left out of its gallery; other labels from that camera stay. Same forms as
            ``sequence_ids``.
        neighbours: ``(Q, w)`` integer tensor, the neighbour lists of an approximate index (nearest first; -1: no
            result), one row per query in input order, holding positions in the input set (``gallery=None``) or
            in ``gallery``. Every ranking metric is then computed on these lists instead of the exact search, with
            the exact relevance counts n(q); repeats, -1 and excluded items are empty slots and ``mrr`` is the
            reciprocal rank within the list (docs/definitions.md, "Given neighbour lists"). ``map_full``,
            ``minp`` and ``fpir_vals`` need the full ranking and are refused.
        return_per_query: also return the :class:`RetrievalResult` (None when no ranking metric
            was asked for).
        cmc_top_k: cutoffs k of cmc@k.
        precision_top_k: cutoffs k of precision@k.
        map_top_k: cutoffs k of map@k.
        recall_top_k: cutoffs k of recall@k.
        ndcg_top_k: cutoffs k of ndcg@k.
        map_at_r: MAP@R.
        r_precision: R-precision.
        mrr: mean reciprocal rank over the full ranking.
        map_full: full-ranking mean average precision (key `map`).
        minp: mean inverse negative penalty: n(q) / rank of the last relevant item.
        clustering: NMI and AMI of a k-means clustering.
        fmr_vals: FMR values in [0, 1] of fnmr@fmr and tar@far.
        eer: equal error rate over every pair.
        roc_auc: area under the ROC curve over every pair (exact).
        min_dcf_p_target: target priors p in (0, 1) of min_dcf/{p} over every pair.
        dcf_costs: costs (C_miss, C_fa) of the detection cost of min_dcf.
        fpir_vals: FPIR values in [0, 1] of open-set dir@fpir and fnir@fpir.
        pcf_variance: explained-variance fractions in [0, 1] of pcf.
        distance: distance between embeddings.
        normalize: L2-normalise the embeddings first.
        precision_mode: precision@k divides by min(k, n(q)) or by k.
        empty_target_action: what a query without a relevant item counts as.
        avg_of_avgs: average per query label first, then over labels.
        per_class: also report every ranking key per query label.
        label_comparison_fn: custom relevance fn(query_labels[:, None], gallery_labels[None]).
        confidence_level: percentile-bootstrap interval of every ranking key ({key}/ci_low, /ci_high).
        n_bootstrap: bootstrap resamples of the intervals.
        seed: seed of the bootstrap resamples.
        knn_backend: kNN backend.
        search_precision: products of the kNN search's candidate pass (values never depend on it).
        chunk_size: rows per distance block (None: from a memory budget).
        progress: progress bars (tqdm, on stderr) on the passes that take more than a second.
        approximate_index: faiss index_factory string of an approximate index (None: exact search): every
            query is then searched on that index (keys ``approx/{key}``) and ``audit_queries`` of them, drawn
            with ``seed``, exactly (keys ``audit/...``; docs/definitions.md).
        approximate_params: faiss search parameters of that index, e.g. nprobe=32 (faiss's ``ParameterSpace``
            syntax, comma-separated).
        audit_queries: queries of the exact audit of an approximate index (all of them when there are fewer).

    The options (from ``cmc_top_k`` on) are the fields of :class:`RetrievalOptions`, which checks them.

    Returns:
        ``{key: 0-dim tensor}`` with the keys listed in the module docstring.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]])
        >>> labels = torch.tensor([0, 0, 1, 1, 1])
        >>> metrics = retrieval_metrics(x, labels, cmc_top_k=(1,), precision_top_k=(2,), map_top_k=(), mrr=True)
        >>> {key: round(float(value), 4) for key, value in metrics.items()}
        {'cmc/1': 0.4, 'precision/2': 0.6, 'mrr': 0.6667}
    """
    opts = RetrievalOptions.from_arguments(locals())  # first: locals() holds the parameters only
    check_bool("return_per_query", return_per_query)
    metrics, result = evaluate(
        query,
        query_labels,
        gallery,
        gallery_labels,
        opts,
        is_query=is_query,
        is_gallery=is_gallery,
        sequence_ids=sequence_ids,
        search_groups=search_groups,
        categories=categories,
        camera_ids=camera_ids,
        keep_neighbours=return_per_query,
        neighbours=neighbours,
    )
    return (metrics, result) if return_per_query else metrics
