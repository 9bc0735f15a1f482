"""CMC, precision and MAP in OML's conventions: per-query tables from one padded hit matrix, nested results."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.oml._inputs import (
    OVERALL_CATEGORIES_KEY,
    Categories,
    category_codes,
    check_cutoffs,
    check_same_length,
    groups,
    hits_from_ids,
    hits_from_tops,
)
from torchmetrics_retrieval.functional.ranking import cmc_at_k, map_at_k, precision_at_k

__all__ = ["calc_cmc", "calc_map", "calc_precision", "calc_retrieval_metrics"]

#: A kernel table: ``(hits (Q, K) bool, lengths (Q,), n_gts (Q,), cutoffs)`` -> ``(Q, T)`` float32.
TableFn = Callable[[Tensor, Tensor, Tensor, tuple[int, ...]], Tensor]


def _empty_list_rule(values: Tensor, lengths: Tensor, n_gts: Tensor) -> Tensor:
    """OML: a query that retrieved nothing scores 1 when it has no ground truth either, else 0."""
    nothing = (lengths == 0)[:, None]
    return torch.where(nothing, (n_gts == 0).to(values.dtype)[:, None], values)


def _cmc_table(hits: Tensor, lengths: Tensor, n_gts: Tensor, ks: tuple[int, ...]) -> Tensor:
    return _empty_list_rule(cmc_at_k(hits, n_gts, ks), lengths, n_gts)


def _precision_table(hits: Tensor, lengths: Tensor, n_gts: Tensor, ks: tuple[int, ...]) -> Tensor:
    # min(k, n, L): the kernel divides by min(k, n(q)), and cutoffs beyond L see no more hits.
    values = precision_at_k(hits, torch.minimum(n_gts, lengths), ks)
    # OML divides by min(0, k) = 0 when a query has no ground truth: NaN (or inf with hits). The hit
    # count itself is the "standard" precision with a denominator of min(k, 1) = 1.
    found = precision_at_k(hits, n_gts, ks, mode="standard", n_candidates=torch.ones_like(n_gts))
    values = torch.where((n_gts == 0)[:, None], found / 0.0, values)
    return _empty_list_rule(values, lengths, n_gts)


def _map_table(hits: Tensor, lengths: Tensor, n_gts: Tensor, ks: tuple[int, ...]) -> Tensor:
    return _empty_list_rule(map_at_k(hits, n_gts, ks), lengths, n_gts)


def _per_query(table_fn: TableFn, gt_tops: Sequence[Any], n_gts: Sequence[int], top_k: object) -> list[Tensor]:
    ks = check_cutoffs("top_k", top_k)
    hits, lengths, n_relevant = hits_from_tops(gt_tops, n_gts)
    return list(table_fn(hits, lengths, n_relevant, ks).T.contiguous().unbind(0))


def calc_cmc(
    gt_tops: Sequence[Tensor], n_gts: Sequence[int], top_k: tuple[int, ...], verbose: bool = False
) -> list[Tensor]:
    r"""Cumulative matching characteristic of every query at every cutoff (OML's ``calc_cmc``).

    ``cmc@k`` is 1 when one of the first ``k`` retrieved items is relevant, else 0; a query with an
    empty list scores 1 if it has no ground truth (``n_gts = 0``), else 0.

    Args:
        gt_tops: Q 1-D bool tensors (ragged): ``gt_tops[q][j]`` tells whether the j-th retrieved item
            of query q is relevant.
        n_gts: Q ints, the number of relevant items of each query.
        top_k: cutoffs ``k >= 1`` (a non-empty tuple; order and repeats kept).
        verbose: ignored (OML shows a progress bar).

    Returns:
        One ``(Q,)`` float32 tensor per cutoff, in the order of ``top_k``.

    Raises:
        ValueError: ``top_k`` empty or not positive ints, ``n_gts`` of another length than ``gt_tops``,
            a ``gt_tops`` entry that is not 1-D.

    Example:
        >>> gt_tops = [torch.tensor([1, 0]).bool(), torch.tensor([0, 1, 1]).bool(),
        ...            torch.tensor([0, 0]).bool(), torch.tensor([]).bool()]
        >>> calc_cmc(gt_tops, n_gts=[2, 2, 1, 0], top_k=(1, 2))
        [tensor([1., 0., 0., 1.]), tensor([1., 1., 0., 1.])]
    """
    return _per_query(_cmc_table, gt_tops, n_gts, top_k)


def calc_precision(
    gt_tops: Sequence[Tensor], n_gts: Sequence[int], top_k: tuple[int, ...], verbose: bool = False
) -> list[Tensor]:
    r"""Precision of every query at every cutoff, OML's definition (``calc_precision``).

    .. math:: \mathrm{precision}@k = \frac{1}{\min(k, n, L)} \sum_{i \le \min(k, L)} g_i

    with ``g`` the query's ``gt_tops`` row, ``L`` its length and ``n`` its ``n_gts``: a perfect ranking
    scores 1 even when ``n < k``. An empty list scores 1 if ``n = 0``, else 0; a non-empty list with
    ``n = 0`` divides by 0 (NaN, as in OML).

    Args:
        gt_tops: Q 1-D bool tensors (ragged), relevance of the retrieved items, nearest first.
        n_gts: Q ints, the number of relevant items of each query.
        top_k: cutoffs ``k >= 1`` (a non-empty tuple).
        verbose: ignored.

    Returns:
        One ``(Q,)`` float32 tensor per cutoff.

    Raises:
        ValueError: as :func:`calc_cmc`.

    Example:
        >>> gt_tops = [torch.tensor([1, 0]).bool(), torch.tensor([0, 1, 1]).bool(),
        ...            torch.tensor([0, 0]).bool(), torch.tensor([]).bool()]
        >>> calc_precision(gt_tops, n_gts=[2, 3, 5, 2], top_k=(1, 2))
        [tensor([1., 0., 0., 0.]), tensor([0.5000, 0.5000, 0.0000, 0.0000])]
    """
    return _per_query(_precision_table, gt_tops, n_gts, top_k)


def calc_map(
    gt_tops: Sequence[Tensor], n_gts: Sequence[int], top_k: tuple[int, ...], verbose: bool = False
) -> list[Tensor]:
    r"""Mean average precision of every query at every cutoff (OML's ``calc_map``).

    .. math:: \mathrm{map}@k = \frac{1}{n_k} \sum_{i \le k} \frac{n_i}{i} g_i, \qquad n_i = \sum_{j \le i} g_j

    and 0 when :math:`n_k = 0`; ``n_gts`` only matters for an empty list (1 if ``n = 0``, else 0). Arguments,
    result and errors as :func:`calc_precision`'s.

    Example:
        >>> gt_tops = [torch.tensor([1, 0]).bool(), torch.tensor([0, 1]).bool(),
        ...            torch.tensor([0, 0, 0, 0]).bool(), torch.tensor([]).bool()]
        >>> calc_map(gt_tops, n_gts=[1, 1, 2, 0], top_k=(1, 2))
        [tensor([1., 0., 0., 1.]), tensor([1.0000, 0.5000, 0.0000, 1.0000])]
    """
    return _per_query(_map_table, gt_tops, n_gts, top_k)


def _nest(columns: list[tuple[str, int]], values: Iterable[Tensor]) -> dict[str, dict[int, Tensor]]:
    nested: dict[str, dict[int, Tensor]] = {}
    for (name, k), value in zip(columns, values, strict=True):
        nested.setdefault(name, {})[k] = value
    return nested


def _summarise(columns: list[tuple[str, int]], table: Tensor, reduce: bool) -> dict[str, dict[int, Tensor]]:
    """Nested ``{name: {k: value}}`` from a ``(T, Q)`` table: per-query rows, or their means (NaN if no query)."""
    return _nest(columns, table.mean(dim=1).unbind(0) if reduce else table.unbind(0))


def calc_retrieval_metrics(
    retrieved_ids: Sequence[Tensor],
    gt_ids: Sequence[Tensor],
    query_categories: Categories | None = None,
    cmc_top_k: tuple[int, ...] = (5,),
    precision_top_k: tuple[int, ...] = (5,),
    map_top_k: tuple[int, ...] = (5,),
    reduce: bool = True,
    verbose: bool = True,
) -> dict[Any, Any]:
    """CMC, precision and MAP at cutoffs from retrieved and ground-truth ids (OML's ``calc_retrieval_metrics``).

    The j-th retrieved item of query q is relevant when its id is in ``gt_ids[q]`` (repeats in a list
    count each time; ``n`` is ``len(gt_ids[q])``). The per-query rules are in the module docstring.

    Args:
        retrieved_ids: Q 1-D integer tensors (ragged): gallery ids retrieved for each query, nearest first.
        gt_ids: Q 1-D integer tensors (ragged): the gallery ids relevant to each query.
        query_categories: ``(Q,)`` category of each query (numpy array or tensor); adds one entry per
            category, in order of first appearance, keyed by the category as a numpy scalar.
        cmc_top_k: cutoffs of ``cmc@k`` (an empty tuple leaves the metric out).
        precision_top_k: cutoffs of ``precision@k`` (OML's ``min(k, n)`` denominator).
        map_top_k: cutoffs of ``map@k``.
        reduce: True: a 0-dim mean over the queries per value; False: the ``(Q,)`` per-query values
            (per category: the values of its queries, in query order).
        verbose: ignored (OML shows progress bars).

    Returns:
        ``{"cmc": {k: value}, "precision": {k: value}, "map": {k: value}}`` (metrics with no cutoff left
        out); with ``query_categories``: ``{"OVERALL": that, category: that restricted to the category}``.

    Raises:
        ValueError: lists of different lengths, categories not one per query, bad cutoffs.
        TypeError: non-integer ids.

    Example:
        >>> import numpy as np
        >>> retrieved = [torch.tensor([3, 1, 2]), torch.tensor([0, 2]), torch.tensor([], dtype=torch.long)]
        >>> relevant = [torch.tensor([1, 2]), torch.tensor([4]), torch.tensor([], dtype=torch.long)]
        >>> calc_retrieval_metrics(retrieved, relevant, cmc_top_k=(1, 2), precision_top_k=(2,), map_top_k=(3,))
        {'cmc': {1: tensor(0.3333), 2: tensor(0.6667)}, 'precision': {2: tensor(0.5000)}, 'map': {3: tensor(0.5278)}}
        >>> out = calc_retrieval_metrics(retrieved, relevant, np.array(["a", "b", "a"]), cmc_top_k=(2,),
        ...                              precision_top_k=(), map_top_k=(), reduce=False)
        >>> out["OVERALL"]["cmc"][2], out["a"]["cmc"][2]
        (tensor([1., 0., 1.]), tensor([1., 1.]))
    """
    check_same_length("gt_ids", gt_ids, len(retrieved_ids), "retrieved_ids")
    requested: list[tuple[str, object, TableFn]] = [
        ("cmc", cmc_top_k, _cmc_table),
        ("precision", precision_top_k, _precision_table),
        ("map", map_top_k, _map_table),
    ]
    wanted = [(name, check_cutoffs(f"{name}_top_k", top_k), fn) for name, top_k, fn in requested if top_k]
    if query_categories is not None:
        keys, codes = category_codes(query_categories, len(retrieved_ids), "query_categories", by_first_appearance=True)
    hits, lengths, n_gts = hits_from_ids(retrieved_ids, gt_ids)
    columns = [(name, k) for name, ks, _ in wanted for k in ks]
    tables = [fn(hits, lengths, n_gts, ks) for _, ks, fn in wanted]
    table = torch.cat(tables, dim=1).T.contiguous() if tables else hits.new_zeros(0, hits.shape[0], dtype=torch.float)
    overall = _summarise(columns, table, reduce)
    if query_categories is None:
        return dict(overall)
    rows = groups(codes.to(table.device), len(keys))
    by_category = {key: _summarise(columns, table[:, members], reduce) for key, members in zip(keys, rows, strict=True)}
    return {OVERALL_CATEGORIES_KEY: overall, **by_category}
