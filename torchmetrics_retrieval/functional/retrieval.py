"""The one entry point: embeddings and labels in, a flat ``dict[str, Tensor]`` of metrics out.

It checks the inputs once (``_sets``: the query/gallery split) and chains the stages of the package, each in
its own module: ``search`` (one exact kNN search for every cutoff) -> ``relevance`` (hit matrix, n(q)) ->
``ranking`` (per-query kernels, in ``_per_query``) -> ``reduction`` (scalars), plus the verification,
topology and clustering metrics on the same sets when asked for.

Result keys (defined in docs/definitions.md): ``cmc/{k}``, ``precision/{k}``, ``recall/{k}``, ``map/{k}``,
``ndcg/{k}``, ``map`` (full ranking), ``map_at_r``, ``r_precision``, ``mrr``, ``nmi``, ``ami``,
``fnmr@fmr/{f}``, ``tar@far/{f}``, ``pcf/{r}``; with ``categories`` every key also as
``{category}/{key}``; with ``per_class=True`` every ranking key also as ``{key}/class/{label}``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Literal, overload

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import describe
from torchmetrics_retrieval.functional._given import check_given_options, given_neighbours
from torchmetrics_retrieval.functional._options import OptionArguments, RetrievalOptions, Unpack
from torchmetrics_retrieval.functional._per_query import RetrievalResult, count_relevant, per_query, search_depth
from torchmetrics_retrieval.functional._progress import shown
from torchmetrics_retrieval.functional._reduce import reduce_per_query
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.functional._sets import PairedIds, QueryGallery, split_query_gallery
from torchmetrics_retrieval.functional.identification import _dir_at_fpir_compute
from torchmetrics_retrieval.functional.ranking import PrecisionMode
from torchmetrics_retrieval.functional.reduction import EmptyTargetAction, label_names
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
    if not isinstance(keep_neighbours, bool):
        raise TypeError(f"`keep_neighbours` must be a bool, got {describe(keep_neighbours)}.")
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


def _normalized(qg: QueryGallery) -> QueryGallery:
    """The problem with L2-normalised rows (a set searched against itself stays one tensor)."""
    query = torch.nn.functional.normalize(qg.query, dim=1)
    gallery = query if qg.gallery is qg.query else torch.nn.functional.normalize(qg.gallery, dim=1)
    return qg._replace(query=query, gallery=gallery)


def _every_sample(qg: QueryGallery, whole_set: Tensor | None, normalize: bool) -> Tensor:
    """Every sample once: the whole set (``whole_set``, when the gallery was not separate; ``qg`` holds the
    masked subsets of it), or the queries followed by the separate gallery."""
    if whole_set is None:
        return torch.cat([qg.query, qg.gallery])
    if qg.same_set or not normalize:
        return qg.query if qg.same_set else whole_set
    return torch.nn.functional.normalize(whole_set, dim=1)


def _extra_metrics(
    options: RetrievalOptions,
    qg: QueryGallery,
    everything: Tensor,
    labels: Tensor,
    by_category: tuple[Tensor, Tensor] | None,
) -> dict[str, Tensor]:
    """Verification, topology and clustering metrics of the same sets.

    ``everything``/``labels``: every sample (queries and gallery items) once; ``by_category``: the
    samples that carry a category and their categories, for per-category PCF.
    """
    metrics: dict[str, Tensor] = {}
    if options.needs_pairs:
        from torchmetrics_retrieval.functional.verification import PairRequest, pair_metrics

        metrics.update(pair_metrics(qg, PairRequest.of(options)))
    if options.pcf_variance:
        from torchmetrics_retrieval.functional.topology import pcf

        def pcf_keys(x: Tensor, prefix: str = "") -> dict[str, Tensor]:
            values = pcf(x, options.pcf_variance)
            return {f"{prefix}pcf/{r}": v for r, v in zip(options.pcf_variance, values.unbind(), strict=True)}

        metrics.update(pcf_keys(everything))
        if by_category is not None:
            members, categories = by_category
            names, ids = torch.unique(categories, return_inverse=True)
            for i, name in enumerate(label_names(names)):  # one PCA per category: few categories, d x d each
                if int((ids == i).sum()) >= 2:
                    metrics.update(pcf_keys(members[ids == i], f"{name}/"))
    if options.clustering:
        from torchmetrics_retrieval.functional.clustering import clustering_scores

        metrics.update(clustering_scores(everything, labels))
    return metrics


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
        >>> x = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]])
        >>> labels = torch.tensor([0, 0, 1, 1, 1])
        >>> metrics = retrieval_metrics(x, labels, cmc_top_k=(1,), precision_top_k=(2,), map_top_k=(), mrr=True)
        >>> {key: round(float(value), 4) for key, value in metrics.items()}
        {'cmc/1': 0.4, 'precision/2': 0.6, 'mrr': 0.6667}
    """
    opts = RetrievalOptions.from_arguments(locals())  # first: locals() holds the parameters only
    if not isinstance(return_per_query, bool):
        raise TypeError(f"`return_per_query` must be a bool, got {describe(return_per_query)}.")
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


def evaluate(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None,
    gallery_labels: Tensor | None,
    opts: RetrievalOptions,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    categories: Tensor | None = None,
    camera_ids: PairedIds | None = None,
    keep_neighbours: bool = True,
    neighbours: Tensor | None = None,
) -> tuple[dict[str, Tensor], RetrievalResult | None]:
    """:func:`retrieval_metrics` with its options already checked (``EmbeddingMetrics`` and the command line
    hold a :class:`RetrievalOptions`): the metrics and the per-query result (None without ranking metrics);
    ``keep_neighbours`` as in :func:`retrieval_per_query`, ``neighbours`` as in :func:`retrieval_metrics`."""
    qg = split_query_gallery(  # the one check of the inputs; every stage below takes them as checked
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
    if neighbours is not None and opts.approximate_index is not None:
        raise ValueError(
            "`neighbours` gives an index's lists and `approximate_index` builds one: pass one of them, got both."
        )
    if neighbours is not None or opts.approximate_index is not None:
        check_given_options(opts)
    with shown(opts.progress):
        metrics, result = _evaluate_checked(
            qg, opts, query, query_labels, gallery, categories, keep_neighbours, neighbours
        )
    if not metrics and not opts.needs_ranking:
        warnings.warn(
            "No metric was requested: every option that selects a metric is empty.", UserWarning, stacklevel=3
        )
    return metrics, result


def _evaluate_checked(
    qg: QueryGallery,
    opts: RetrievalOptions,
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None,
    categories: Tensor | None,
    keep_neighbours: bool,
    neighbours: Tensor | None = None,
) -> tuple[dict[str, Tensor], RetrievalResult | None]:
    qg = _normalized(qg) if opts.normalize else qg
    result = None
    metrics: dict[str, Tensor] = {}
    if opts.needs_ranking and opts.approximate_index is not None:
        from torchmetrics_retrieval.functional._approximate import approximate_evaluation  # (faiss, when asked)

        metrics, result = approximate_evaluation(qg, opts, keep_neighbours)
    elif opts.needs_ranking and neighbours is not None:
        n_input = query.shape[0] if gallery is None else gallery.shape[0]
        depth = search_depth(opts, count_relevant(qg, opts))
        found = given_neighbours(qg, neighbours, n_input, depth, opts.distance)
        metrics, result = ranking_metrics(qg, opts, keep_neighbours, found, listed=True)
    elif opts.needs_ranking:
        metrics, result = ranking_metrics(qg, opts, keep_neighbours)
    if opts.needs_pairs or opts.pcf_variance or opts.clustering:
        everything = _every_sample(qg, query if gallery is None else None, opts.normalize)
        labels = query_labels if gallery is None else torch.cat([qg.query_labels, qg.gallery_labels])
        by_category = None if categories is None else (everything[: categories.shape[0]], categories)
        metrics.update(_extra_metrics(opts, qg, everything, labels, by_category))
    return metrics, result


def ranking_metrics(
    qg: QueryGallery,
    opts: RetrievalOptions,
    keep_neighbours: bool,
    neighbours: KNNResult | None = None,
    listed: bool = False,
) -> tuple[dict[str, Tensor], RetrievalResult]:
    """The ranking metrics of a checked (and normalised) problem and its per-query result; ``neighbours`` and
    ``listed`` as in :func:`per_query`."""
    result = per_query(qg, opts, keep_neighbours, neighbours, listed)
    metrics = reduce_per_query(result, opts)
    if opts.fpir_vals:
        assert result.nearest is not None and result.nearest_relevant is not None
        metrics.update(_dir_at_fpir_compute(result.nearest, result.nearest_relevant, result.n_relevant, opts.fpir_vals))
    return metrics, result
