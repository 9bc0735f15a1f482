"""Approximate evaluation with an exact audit (``retrieval_metrics(..., approximate_index=...)``).

For sets beyond exact reach, or to measure what an index costs: every query is searched on a faiss index
(``index_factory(D, approximate_index)``, trained and filled with the gallery, ``approximate_params`` set through
faiss's ``ParameterSpace``), and its lists are scored as given lists (``_given``; n(q) stays exact). Then a random
sample of ``audit_queries`` queries (a ``torch.Generator`` seeded with ``seed``) is searched exactly, and the result
holds, never under one key:

* ``approx/{key}``: every ranking metric of the approximate lists, over every query;
* ``audit/queries``: the size of the sample; ``audit/recall@{K}``, ``audit/recall_1@{K}``, ``audit/tie_recall@{K}``,
  ``audit/duplicate_rate``, ``audit/missing_rate``: :func:`~.audit.audit_neighbours` on the sample, K the search
  depth (the largest cutoff, or R for MAP@R);
* ``audit/{key}/exact``: the exact metric on the sample; ``audit/{key}/delta``: the mean over the sample's counted
  queries of the paired difference approximate - exact (a lone query, equal on both sides, adds 0);
  ``audit/{key}/ci_low`` and ``/ci_high``: its percentile-bootstrap interval (``n_bootstrap`` resamples of the
  sample's queries, ``seed``, level ``confidence_level`` or 0.95), the machinery of ``compare_models``.

The index sees the gallery in float32 (faiss's type); for ``cosine`` the rows are L2-normalised and searched by
inner product, for ``dot`` by inner product, otherwise by L2. An index built on a set searched against itself
returns each query first: it is searched one deeper and the query's own id is dropped (by position, never the
first column). Under DDP, ``EmbeddingMetrics`` gathers the embeddings and every process builds the same index on
the whole gallery (a per-process index would make the metrics depend on the number of processes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._bootstrap import _bootstrap_means, _quantiles
from torchmetrics_retrieval.functional._given import given_neighbours
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import (
    RetrievalResult,
    _search,
    count_relevant,
    per_query,
    search_depth,
)
from torchmetrics_retrieval.functional._progress import section
from torchmetrics_retrieval.functional._reduce import reduce_per_query
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.audit import audit_values
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute

__all__ = ["approximate_evaluation", "approximate_lists"]


def _rows(x: Tensor, distance: str) -> Any:
    """The rows as faiss takes them: contiguous float32 numpy, unit rows for cosine."""
    x = x.detach().to("cpu", torch.float32)
    if distance == "cosine":
        x = torch.nn.functional.normalize(x, dim=1)
    return x.contiguous().numpy()


def build_index(gallery: Tensor, options: RetrievalOptions) -> Any:
    """The trained, filled faiss index of ``options.approximate_index`` with ``approximate_params`` set."""
    import faiss

    metric = faiss.METRIC_INNER_PRODUCT if options.distance in ("cosine", "dot") else faiss.METRIC_L2
    try:
        index = faiss.index_factory(gallery.shape[1], str(options.approximate_index), metric)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"`approximate_index` must be a faiss index_factory string valid for {gallery.shape[1]}-d rows, got "
            f"{options.approximate_index!r} ({first})."
        ) from error
    rows = _rows(gallery, options.distance)
    if not index.is_trained:
        index.train(rows)
    index.add(rows)
    if options.approximate_params:
        try:
            # (faiss's stub types the parameters as an int: the function takes the "name=value,..." string)
            faiss.ParameterSpace().set_index_parameters(index, options.approximate_params)  # type: ignore[arg-type]
        except RuntimeError as error:
            raise ValueError(
                f"`approximate_params` must be search parameters of {options.approximate_index!r} like "
                f"'nprobe=32' or 'efSearch=64', got {options.approximate_params!r}."
            ) from error
    return index


def approximate_lists(qg: QueryGallery, options: RetrievalOptions, depth: int) -> tuple[Tensor, Tensor]:
    """``(Q, depth)`` gallery items of each query from the index (-1 for none, the query's own id dropped) and their
    distances as the index computed them (float32, in ``options.distance``)."""
    index = build_index(qg.gallery, options)
    own = qg.self_index
    extra = int(bool((own >= 0).any()))  # one deeper when a query may find itself
    width = min(depth + extra, qg.gallery.shape[0])
    scores, found_ = index.search(_rows(qg.query, options.distance), width)
    found, scores = torch.from_numpy(found_).to(qg.query.device), torch.from_numpy(scores).to(qg.query.device)
    # faiss reports squared L2, or inner products: the package's distances are monotone in them
    if options.distance == "euclidean":
        scores = scores.clamp(min=0).sqrt()
    elif options.distance in ("dot", "cosine"):
        scores = -scores if options.distance == "dot" else 1.0 - scores
    if extra:
        itself = found == own[:, None]
        order = torch.sort(itself.to(torch.int8), dim=1, stable=True).indices  # the others first, in their order
        found, scores = torch.where(itself, -1, found).gather(1, order), scores.gather(1, order)
    found, scores = found[:, :depth], scores[:, :depth]
    missing = depth - found.shape[1]
    return (
        torch.nn.functional.pad(found, (0, missing), value=-1),
        torch.nn.functional.pad(scores, (0, missing), value=float("inf")),
    )


def _paired(
    approx: RetrievalResult, exact: RetrievalResult, sample: Tensor, options: RetrievalOptions
) -> dict[str, Tensor]:
    """``audit/{key}/exact``, ``/delta``, ``/ci_low``, ``/ci_high`` of every per-query key on the sample."""
    keys = list(exact.values)
    if not keys:
        return {}
    action = options.empty_target_action
    exact_table, counted = _apply_empty_target_action_compute(
        torch.stack([exact.values[key] for key in keys], dim=1).to(torch.float64), exact.n_relevant, action
    )
    approx_table, _ = _apply_empty_target_action_compute(
        torch.stack([approx.values[key][sample] for key in keys], dim=1).to(torch.float64), exact.n_relevant, action
    )
    differences = (approx_table - exact_table)[counted]
    out: dict[str, Tensor] = {}
    if differences.shape[0] == 0:  # no counted query in the sample: nothing to compare
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=differences.device)
        return {f"audit/{key}/{part}": nan for key in keys for part in ("exact", "delta", "ci_low", "ci_high")}
    means = _bootstrap_means(differences, options.n_bootstrap, options.seed)
    low, high = _quantiles(means, options.confidence_level or 0.95)
    for i, key in enumerate(keys):
        out[f"audit/{key}/exact"] = exact_table[counted, i].mean()
        out[f"audit/{key}/delta"] = differences[:, i].mean()
        out[f"audit/{key}/ci_low"], out[f"audit/{key}/ci_high"] = low[i], high[i]
    return out


def approximate_evaluation(
    qg: QueryGallery, options: RetrievalOptions, keep_neighbours: bool
) -> tuple[dict[str, Tensor], RetrievalResult]:
    """The ``approx/`` and ``audit/`` keys of a checked (and normalised) problem (see the module), and the
    per-query result of the approximate lists."""
    n_query, device = qg.query.shape[0], qg.query.device
    depth = search_depth(options, count_relevant(qg, options))
    with section("approximate search", n_query, unit="query"):
        lists, scores = approximate_lists(qg, options, depth)
    positions = torch.where(lists >= 0, qg.gallery_positions[lists.clamp(min=0)], -1)
    n_input = int(qg.gallery_positions.max()) + 1
    found = given_neighbours(qg, positions, n_input, depth, options.distance, scores)
    approx = per_query(qg, options, keep_neighbours, found, listed=True)
    metrics = {f"approx/{key}": value for key, value in reduce_per_query(approx, options).items()}
    # the audit: a random sample of the queries, searched exactly against the whole gallery
    generator = torch.Generator().manual_seed(options.seed)
    sample = torch.randperm(n_query, generator=generator)[: options.audit_queries].sort().values.to(device)
    sampled = qg.take(sample)
    search = _search(sampled, options, depth, exact_distances=True)
    exact_found = search(torch.arange(sample.numel(), device=device))
    exact = per_query(sampled, options, False, exact_found)
    metrics["audit/queries"] = torch.tensor(sample.numel(), device=device)
    recalls = audit_values(search, exact_found, lists[sample], depth)
    metrics.update({f"audit/{key}": value.mean() for key, value in recalls.items()})
    metrics.update(_paired(approx, exact, sample, options))
    return metrics, approx
