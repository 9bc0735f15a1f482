r"""open-metric-learning's functional metrics, same calls and same numbers, computed by vectorised kernels.

The functions here take the arguments of ``oml.functional.metrics`` (open-metric-learning 3.x) and
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
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from torchmetrics_retrieval.functional._checks import check_fractions, describe
from torchmetrics_retrieval.functional.ranking import cmc_at_k, map_at_k, precision_at_k
from torchmetrics_retrieval.functional.topology import pcf
from torchmetrics_retrieval.functional.verification import fnmr_at_fmr_from_distances

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

#: Key of the metrics over all queries when results are also given per category (OML's constant).
OVERALL_CATEGORIES_KEY = "OVERALL"

Categories = Tensor | np.ndarray | Sequence[Any]
#: A kernel table: ``(hits (Q, K) bool, lengths (Q,), n_gts (Q,), cutoffs)`` -> ``(Q, T)`` float32.
TableFn = Callable[[Tensor, Tensor, Tensor, tuple[int, ...]], Tensor]


# ----------------------------------------------------------------------------------------------------
# Argument checks (OML raises ValueError for every bad cutoff or fraction; so do we)
# ----------------------------------------------------------------------------------------------------


def _check_cutoffs(name: str, top_k: object) -> tuple[int, ...]:
    """A non-empty sequence of ints >= 1, order and repeats kept (OML computes each as given)."""
    if isinstance(top_k, (str, bytes, Tensor)) or not isinstance(top_k, Iterable):
        raise ValueError(f"`{name}` must be a non-empty tuple of ints >= 1, got {describe(top_k)}.")
    ks = tuple(top_k)
    if not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks):
        raise ValueError(f"`{name}` must be a non-empty tuple of ints >= 1, got {ks!r}.")
    return ks


def _check_in_unit_range(name: str, values: object) -> tuple[float, ...]:
    """A non-empty sequence of numbers in [0, 1] (OML's ``_check_if_in_range``)."""
    fractions = check_fractions(name, values)  # type: ignore[arg-type]
    if not fractions:
        raise ValueError(f"`{name}` must not be empty, got {values!r}.")
    return fractions


def _check_same_length(name: str, value: Sized, n: int, other: str) -> None:
    if len(value) != n:
        raise ValueError(f"`{name}` must have one entry per query like `{other}` ({n}), got {len(value)}.")


# ----------------------------------------------------------------------------------------------------
# Ragged lists -> one padded (Q, K) tensor
# ----------------------------------------------------------------------------------------------------


def _pad(rows: Sequence[Any], name: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Pad a ragged list of 1-D tensors into one ``(Q, K)`` tensor of ``dtype`` and return their lengths.

    One pass over the list (input conversion); padding is 0 / False, told apart by the lengths.
    """
    tensors = [row if isinstance(row, Tensor) else torch.as_tensor(row) for row in rows]
    kinds = {(row.ndim, row.dtype, row.numel() > 0) for row in tensors}
    for ndim, kind, filled in kinds:
        if ndim != 1:
            raise ValueError(f"`{name}` must hold 1-D tensors, got one of {ndim} dimensions.")
        if dtype != torch.bool and filled and (kind.is_floating_point or kind.is_complex):
            raise TypeError(f"`{name}` must hold integer ids, got dtype {kind}.")
    if any(kind != dtype for _, kind, _ in kinds):
        tensors = [row.to(dtype) for row in tensors]
    lengths = torch.tensor([row.shape[0] for row in tensors], dtype=torch.int64)
    if not tensors:
        return torch.zeros(0, 0, dtype=dtype), lengths
    padded = pad_sequence(tensors, batch_first=True)
    return padded, lengths.to(padded.device)


def _hits_from_ids(retrieved_ids: Sequence[Any], gt_ids: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor]:
    """``(hits, lengths, n_gts)``: ``hits[q, j]`` is True when the j-th retrieved id of q is one of its ids.

    Every (query, id) pair gets one integer key ``q * span + (id - lowest id)``, so one sort of the
    ground-truth keys and one ``searchsorted`` answer the membership of every query at once.
    """
    retrieved, lengths = _pad(retrieved_ids, "retrieved_ids", torch.int64)
    relevant, n_gts = _pad(gt_ids, "gt_ids", torch.int64)
    relevant = relevant.to(retrieved.device)
    n_gts = n_gts.to(retrieved.device)
    in_list = _within_lengths(retrieved.shape[1], lengths)
    in_gt = _within_lengths(relevant.shape[1], n_gts)
    if not bool(in_list.any()):
        return in_list, lengths, n_gts
    real = torch.cat([retrieved[in_list], relevant[in_gt]])
    low = real.min()
    span = real.max() - low + 1
    rows = torch.arange(retrieved.shape[0], device=retrieved.device)[:, None] * span
    retrieved_keys = torch.where(in_list, rows + (retrieved - low), -1)
    relevant_keys = (rows + (relevant - low))[in_gt].sort().values
    return _is_member(retrieved_keys, relevant_keys) & in_list, lengths, n_gts


def _is_member(keys: Tensor, sorted_keys: Tensor) -> Tensor:
    """``torch.isin(keys, sorted_keys)`` by binary search (several times faster than ``isin`` here)."""
    if sorted_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    at = torch.searchsorted(sorted_keys, keys).clamp_(max=sorted_keys.numel() - 1)
    return sorted_keys[at] == keys


def _within_lengths(n_columns: int, lengths: Tensor) -> Tensor:
    return torch.arange(n_columns, device=lengths.device)[None, :] < lengths[:, None]


def _hits_from_tops(gt_tops: Sequence[Any], n_gts: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``(hits, lengths, n_gts)`` from OML's ragged ``gt_tops`` and ``n_gts``."""
    _check_same_length("n_gts", n_gts, len(gt_tops), "gt_tops")
    hits, lengths = _pad(gt_tops, "gt_tops", torch.bool)
    n_relevant = torch.as_tensor(n_gts, dtype=torch.int64, device=hits.device).reshape(-1)
    return hits, lengths, n_relevant


# ----------------------------------------------------------------------------------------------------
# Per-query tables (Q, T) in OML's conventions
# ----------------------------------------------------------------------------------------------------


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
    ks = _check_cutoffs("top_k", top_k)
    hits, lengths, n_relevant = _hits_from_tops(gt_tops, n_gts)
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

    and 0 when :math:`n_k = 0`; ``n_gts`` only matters for an empty list (1 if ``n = 0``, else 0).

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
        >>> gt_tops = [torch.tensor([1, 0]).bool(), torch.tensor([0, 1]).bool(),
        ...            torch.tensor([0, 0, 0, 0]).bool(), torch.tensor([]).bool()]
        >>> calc_map(gt_tops, n_gts=[1, 1, 2, 0], top_k=(1, 2))
        [tensor([1., 0., 0., 1.]), tensor([1.0000, 0.5000, 0.0000, 1.0000])]
    """
    return _per_query(_map_table, gt_tops, n_gts, top_k)


# ----------------------------------------------------------------------------------------------------
# calc_retrieval_metrics: nested dictionaries, per category, reduced or not
# ----------------------------------------------------------------------------------------------------


def _category_codes(
    categories: Categories, n: int, name: str, *, by_first_appearance: bool
) -> tuple[list[Any], Tensor]:
    """Distinct categories (numpy scalars, as OML's keys) and the code of each row.

    Sorted (OML iterates ``np.unique``) or in order of first appearance (OML iterates the categories).
    """
    values = np.asarray(categories.cpu()) if isinstance(categories, Tensor) else np.asarray(categories)
    if values.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(values)}.")
    _check_same_length(name, values, n, "the rows")
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if by_first_appearance:
        order = np.argsort(first, kind="stable")
        recode = np.empty_like(order)
        recode[order] = np.arange(order.size)
        distinct, inverse = distinct[order], recode[inverse]
    return list(distinct), torch.from_numpy(inverse)


def _groups(codes: Tensor, n_groups: int) -> list[Tensor]:
    """Row indices of each group, rows in their original order (one stable sort, no mask per group)."""
    order = torch.argsort(codes, stable=True)
    return list(order.split(torch.bincount(codes, minlength=n_groups).tolist()))


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
        >>> retrieved = [torch.tensor([3, 1, 2]), torch.tensor([0, 2]), torch.tensor([], dtype=torch.long)]
        >>> relevant = [torch.tensor([1, 2]), torch.tensor([4]), torch.tensor([], dtype=torch.long)]
        >>> calc_retrieval_metrics(retrieved, relevant, cmc_top_k=(1, 2), precision_top_k=(2,), map_top_k=(3,))
        {'cmc': {1: tensor(0.3333), 2: tensor(0.6667)}, 'precision': {2: tensor(0.5000)}, 'map': {3: tensor(0.5278)}}
        >>> out = calc_retrieval_metrics(retrieved, relevant, np.array(["a", "b", "a"]), cmc_top_k=(2,),
        ...                              precision_top_k=(), map_top_k=(), reduce=False)
        >>> out["OVERALL"]["cmc"][2], out["a"]["cmc"][2]
        (tensor([1., 0., 1.]), tensor([1., 1.]))
    """
    _check_same_length("gt_ids", gt_ids, len(retrieved_ids), "retrieved_ids")
    requested: list[tuple[str, object, TableFn]] = [
        ("cmc", cmc_top_k, _cmc_table),
        ("precision", precision_top_k, _precision_table),
        ("map", map_top_k, _map_table),
    ]
    wanted = [(name, _check_cutoffs(f"{name}_top_k", top_k), fn) for name, top_k, fn in requested if top_k]
    if query_categories is not None:
        keys, codes = _category_codes(
            query_categories, len(retrieved_ids), "query_categories", by_first_appearance=True
        )
    hits, lengths, n_gts = _hits_from_ids(retrieved_ids, gt_ids)
    columns = [(name, k) for name, ks, _ in wanted for k in ks]
    tables = [fn(hits, lengths, n_gts, ks) for _, ks, fn in wanted]
    table = torch.cat(tables, dim=1).T.contiguous() if tables else hits.new_zeros(0, hits.shape[0], dtype=torch.float)
    overall = _summarise(columns, table, reduce)
    if query_categories is None:
        return dict(overall)
    rows = _groups(codes.to(table.device), len(keys))
    by_category = {key: _summarise(columns, table[:, members], reduce) for key, members in zip(keys, rows, strict=True)}
    return {OVERALL_CATEGORIES_KEY: overall, **by_category}


# ----------------------------------------------------------------------------------------------------
# Verification and topology
# ----------------------------------------------------------------------------------------------------


def calc_fnmr_at_fmr(pos_dist: Any, neg_dist: Any, fmr_vals: tuple[float, ...] = (0.1,)) -> Tensor:
    r"""False non-match rate at given false match rates (OML's ``calc_fnmr_at_fmr``).

    The threshold for a rate ``f`` is the ``f``-quantile of the negative distances (linear
    interpolation, numpy's default), and FNMR is the fraction of positive distances at or above it.
    Computed exactly by :func:`torchmetrics_retrieval.functional.verification.fnmr_at_fmr_from_distances`.

    Args:
        pos_dist: 1-D distances of relevant pairs (numpy array or tensor, any real dtype).
        neg_dist: 1-D distances of non-relevant pairs.
        fmr_vals: false match rates in [0, 1] (a non-empty tuple).

    Returns:
        ``(len(fmr_vals),)`` float32 tensor.

    Empty ``pos_dist`` or ``neg_dist`` gives NaN with a warning (OML: NaN, or an ``IndexError`` for
    empty negatives).

    Raises:
        ValueError: ``fmr_vals`` empty or outside [0, 1], distances not 1-D or not finite.

    Example:
        >>> pos_dist = np.array([0, 0, 1, 1, 2, 2, 5, 5, 9, 9])
        >>> neg_dist = np.array([3, 3, 4, 4, 6, 6, 7, 7, 8, 8])
        >>> calc_fnmr_at_fmr(pos_dist, neg_dist, fmr_vals=(0.1, 0.5))
        tensor([0.4000, 0.2000])
    """
    fractions = _check_in_unit_range("fmr_vals", fmr_vals)
    positive = torch.as_tensor(pos_dist)
    negative = torch.as_tensor(neg_dist, device=positive.device)
    return fnmr_at_fmr_from_distances(positive, negative, fractions)


def _is_decomposable(embeddings: Any) -> bool:
    """Whether OML's PCA would run on it: a 2-D float32/float64 tensor of finite values."""
    return (
        isinstance(embeddings, Tensor)
        and embeddings.ndim == 2
        and embeddings.dtype in (torch.float32, torch.float64)
        and embeddings.shape[1] > 0
        and bool(torch.isfinite(embeddings).all())
    )


def _components_needed(embeddings: Tensor, fractions: tuple[float, ...]) -> Tensor:
    """OML's number of principal axes for each fraction, as float64 ``(T,)``.

    ``n = 1 + #{j <= m : cumulative share_j <= r}`` with ``m = min(N, d)`` (from :func:`pcf`), except
    where OML's arithmetic gives ``m + 1``: ``r = 1`` (every share is <= 1, so ``n`` may exceed ``d``,
    which :func:`pcf` caps), and no variance at all (fewer than 2 rows or all rows equal: OML's shares
    are 0/0 = NaN, which its search places after every eigenvalue).
    """
    n_rows, dim = embeddings.shape
    past_last = float(min(n_rows, dim) + 1)
    required = torch.tensor(fractions, dtype=torch.float64, device=embeddings.device)
    if n_rows < 2:
        return torch.full_like(required, past_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zero variance: pcf warns and returns NaN
        fraction = pcf(embeddings, fractions).to(torch.float64)
    n = (fraction * dim).round()
    return torch.where(fraction.isnan() | (required == 1.0), past_last, n)


def calc_pcf(embeddings: Any, pcf_variance: tuple[float, ...]) -> Tensor | list[Tensor]:
    r"""Principal components fraction, with open-metric-learning's edge cases (``calc_pcf``).

    For eigenvalues :math:`\lambda_1 \ge \dots \ge \lambda_m` of the covariance (``m = min(N, d)``) and a
    required explained-variance fraction ``r``, ``n = 1 + #{j : (\lambda_1 + ... + \lambda_j) / \sum \lambda \le r}``
    and the value is ``n / d`` (computed by :func:`torchmetrics_retrieval.functional.topology.pcf`).
    Reproduced quirks of OML:

    * ``r = 1`` gives ``(m + 1) / d``, which exceeds 1 when ``N >= d``;
    * no variance (one row, or all rows equal) gives ``(m + 1) / d`` for every ``r`` (no rows: ``1 / d``);
    * input OML's PCA cannot decompose (not a 2-D float32/float64 tensor, NaN or inf) gives a *list* of
      0-dim NaN tensors instead of a tensor, as OML's catch-all ``except`` does.

    Shares are computed in float64 and made robust to rounding. OML's own shares are not: where a
    share equals ``r`` exactly (always the case at ``r = 1``, where its last shares come out a little
    above or below 1), its result depends on rounding. At ``r = 1`` this function gives the exact
    arithmetic's ``(m + 1) / d``, which OML 3.1 returned for 89% of random float32 inputs.

    Args:
        embeddings: ``(N, d)`` embeddings.
        pcf_variance: required explained-variance fractions in [0, 1] (a non-empty tuple).

    Returns:
        ``(len(pcf_variance),)`` tensor in the dtype and on the device of ``embeddings`` (or the NaN
        list above).

    Raises:
        ValueError: ``pcf_variance`` empty or outside [0, 1].

    Example:
        >>> calc_pcf(torch.eye(4, 10), pcf_variance=(0.5, 1))
        tensor([0.2000, 0.5000])
        >>> calc_pcf(torch.ones(1, 10), pcf_variance=(0.5,))
        tensor([0.2000])
        >>> calc_pcf(torch.tensor([[float("nan"), 1.0]]), pcf_variance=(0.5,))
        [tensor(nan)]
    """
    fractions = _check_in_unit_range("pcf_variance", pcf_variance)
    if not _is_decomposable(embeddings):
        return [torch.tensor(math.nan)] * len(fractions)
    return _components_needed(embeddings, fractions).to(embeddings) / embeddings.shape[1]


def calc_topological_metrics(
    embeddings: Tensor,
    pcf_variance: tuple[float, ...],
    categories: Categories | None = None,
    verbose: bool = False,
) -> dict[Any, Any]:
    """PCF of all embeddings and, with ``categories``, of each category (OML's ``calc_topological_metrics``).

    Args:
        embeddings: ``(N, d)`` embeddings.
        pcf_variance: required explained-variance fractions (see :func:`calc_pcf`); an empty tuple gives ``{}``.
        categories: ``(N,)`` category of each embedding (numpy array or tensor).
        verbose: ignored (OML shows a progress bar over the categories).

    Returns:
        ``{"pcf": {r: value}}``; with ``categories``: ``{"OVERALL": that, category: that of its rows}``,
        categories sorted, keyed by numpy scalars (as OML's ``np.unique`` gives them).

    Raises:
        ValueError: ``categories`` not one per embedding, ``pcf_variance`` outside [0, 1].

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
        >>> calc_topological_metrics(x, (0.5,), categories=np.array([1, 1, 2, 2]))
        {'OVERALL': {'pcf': {0.5: tensor(0.5000)}}, np.int64(1): {'pcf': {0.5: tensor(0.5000)}}, \
np.int64(2): {'pcf': {0.5: tensor(0.5000)}}}
    """
    if categories is not None:
        _check_same_length("categories", categories, len(embeddings), "embeddings")
    if not pcf_variance:
        return {}
    overall = {"pcf": dict(zip(pcf_variance, calc_pcf(embeddings, pcf_variance), strict=True))}
    if categories is None:
        return overall
    keys, codes = _category_codes(categories, len(embeddings), "categories", by_first_appearance=False)
    rows = _groups(codes.to(embeddings.device), len(keys))
    by_category = {
        key: {"pcf": dict(zip(pcf_variance, calc_pcf(embeddings[members], pcf_variance), strict=True))}
        for key, members in zip(keys, rows, strict=True)
    }
    return {OVERALL_CATEGORIES_KEY: overall, **by_category}


# ----------------------------------------------------------------------------------------------------
# Flat keys of this package -> OML's nested EmbeddingMetrics layout
# ----------------------------------------------------------------------------------------------------


def _parse_number(text: str) -> int | float | None:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    return None


def to_oml_nested(flat_metrics: Mapping[str, Any], *, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Flat keys of this package (``"cmc/1"``, ``"cat/precision/5"``) -> OML's ``EmbeddingMetrics`` layout.

    ``{"OVERALL": {"cmc": {1: value}, "pcf": {0.5: value}, ...}, "cat": {"cmc": {1: value}, ...}}``:
    a key ``[category/]name/number`` goes to ``[category or "OVERALL"][name][number]`` (the number as
    an int when it is one, else a float), a key ``[category/]name`` without a number to
    ``[category or "OVERALL"][name]``. The values are kept as they are. ``"OVERALL"`` always comes first.

    Args:
        flat_metrics: flat ``{key: value}``, e.g. the result of ``retrieval_metrics`` or
            ``EmbeddingMetrics.compute()``.
        prefix: a prefix every key starts with (the metric's ``prefix``), removed first.

    Returns:
        The nested dictionary.

    Raises:
        ValueError: a key without ``prefix``, a per-class key (``.../class/...``: OML has no per-class
            results), or two keys landing on the same place (e.g. ``"map"`` and ``"map/5"``).

    Example:
        >>> flat = {"cmc/1": torch.tensor(0.5), "pcf/0.5": torch.tensor(0.25), "shoes/cmc/1": torch.tensor(1.0)}
        >>> to_oml_nested(flat)
        {'OVERALL': {'cmc': {1: tensor(0.5000)}, 'pcf': {0.5: tensor(0.2500)}}, 'shoes': {'cmc': {1: tensor(1.)}}}
    """
    nested: dict[str, dict[str, Any]] = {OVERALL_CATEGORIES_KEY: {}}
    for key, value in flat_metrics.items():
        if not key.startswith(prefix):
            raise ValueError(f"`flat_metrics` keys must start with prefix {prefix!r}, got {key!r}.")
        parts = key[len(prefix) :].split("/")
        if len(parts) >= 3 and parts[-2] == "class":
            raise ValueError(f"`flat_metrics` has a per-class key {key!r}, which OML's layout has no place for.")
        number = _parse_number(parts[-1]) if len(parts) >= 2 else None
        name_at = -2 if number is not None else -1
        category = "/".join(parts[:name_at]) or OVERALL_CATEGORIES_KEY
        metrics = nested.setdefault(category, {})
        name = parts[name_at]
        if number is None:
            if name in metrics:
                raise ValueError(f"`flat_metrics` key {key!r} collides with another key of metric {name!r}.")
            metrics[name] = value
            continue
        slot = metrics.setdefault(name, {})
        if not isinstance(slot, dict):
            raise ValueError(f"`flat_metrics` key {key!r} collides with the scalar metric {name!r}.")
        slot[number] = value
    return nested
