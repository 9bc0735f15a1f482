"""The evaluation behind :func:`~torchmetrics_retrieval.functional.retrieval_metrics`, its options already checked.

``evaluate`` is what ``EmbeddingMetrics``, the cross-modal metrics and the command line call with a
:class:`RetrievalOptions` they hold: one check of the inputs (``_sets``), then the ranking metrics (exact
search, an approximate index or given neighbour lists) and the verification, topology and clustering
metrics of the same sets.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._given import check_given_options, given_neighbours
from torchmetrics_retrieval.functional._options import RetrievalOptions, Unpack
from torchmetrics_retrieval.functional._per_query import RetrievalResult, count_relevant, per_query, search_depth
from torchmetrics_retrieval.functional._progress import shown
from torchmetrics_retrieval.functional._reduce import reduce_per_query
from torchmetrics_retrieval.functional._search.half_rows import values_dtype
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.functional._sets import QueryGallery, SampleFields, split_query_gallery
from torchmetrics_retrieval.functional.identification import _dir_at_fpir_compute
from torchmetrics_retrieval.functional.reduction import label_names


def _unit_rows(x: Tensor) -> Tensor:
    """``x`` L2-normalised in the dtype of its distances (float32 for half-precision rows: a copy either way)."""
    return torch.nn.functional.normalize(x.to(values_dtype(x)), dim=1)


def _normalized(qg: QueryGallery) -> QueryGallery:
    """The problem with L2-normalised rows (a set searched against itself stays one tensor)."""
    query = _unit_rows(qg.query)
    gallery = query if qg.gallery is qg.query else _unit_rows(qg.gallery)
    return qg._replace(query=query, gallery=gallery)


def _every_sample(qg: QueryGallery, whole_set: Tensor | None, normalize: bool) -> Tensor:
    """Every sample once: the whole set (``whole_set``, when the gallery was not separate; ``qg`` holds the
    masked subsets of it), or the queries followed by the separate gallery."""
    if whole_set is None:
        return torch.cat([qg.query, qg.gallery])
    if qg.same_set or not normalize:
        return qg.query if qg.same_set else whole_set
    return _unit_rows(whole_set)


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


def evaluate(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None,
    gallery_labels: Tensor | None,
    opts: RetrievalOptions,
    *,
    keep_neighbours: bool = True,
    neighbours: Tensor | None = None,
    **fields: Unpack[SampleFields],
) -> tuple[dict[str, Tensor], RetrievalResult | None]:
    """:func:`retrieval_metrics` with its options already checked (``EmbeddingMetrics`` and the command line
    hold a :class:`RetrievalOptions`): the metrics and the per-query result (None without ranking metrics);
    ``keep_neighbours`` as in :func:`retrieval_per_query`, ``neighbours`` as in :func:`retrieval_metrics`, the
    per-sample ``fields`` as in :func:`split_query_gallery`."""
    # the one check of the inputs; every stage below takes them as checked
    qg = split_query_gallery(query, query_labels, gallery, gallery_labels, **fields)
    categories = fields.get("categories")
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
