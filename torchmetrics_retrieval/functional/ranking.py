r"""Per-query ranking metrics, each a vectorised kernel on a hit matrix.

Every kernel takes ``is_relevant``, a ``(Q, K)`` bool tensor whose row q marks which of the K
nearest gallery items of query q (nearest first) are relevant, and ``n_relevant``, the ``(Q,)``
number n(q) of relevant items in the whole gallery of q. It returns one value per query: a ``(Q,)``
tensor for an int cutoff, ``(Q, T)`` for a tuple of T cutoffs (in the order given), all cutoffs
served by one cumulative sum up to the largest. No loop over queries.

Definitions (see docs/definitions.md), with :math:`rel_i` the i-th column and
:math:`P@i = \frac{1}{i}\sum_{j \le i} rel_j`:

* ``cmc@k`` = 1 if some :math:`rel_i = 1` with i <= k.
* ``precision@k`` = :math:`\sum_{i \le k} rel_i / \min(k, n(q))` (mode ``"min_k_n"``), or
  :math:`/ \min(k, |G(q)|)` (mode ``"standard"``).
* ``recall@k`` = :math:`\sum_{i \le k} rel_i / n(q)`.
* ``map@k`` = :math:`\frac{1}{m_k} \sum_{i \le k} P@i \cdot rel_i`, :math:`m_k = \sum_{i \le k} rel_i`, 0 when m_k = 0.
* ``ndcg@k`` = :math:`\sum_{i \le k} rel_i / \log_2(i + 1)` over the ideal
  :math:`\sum_{i \le \min(k, n(q))} 1/\log_2(i + 1)`.
* ``map@r`` = :math:`\frac{1}{R} \sum_{i \le R} P@i \cdot rel_i` and
  ``r_precision`` = :math:`\frac{1}{R} \sum_{i \le R} rel_i`, with R = n(q).
* ``average_precision`` = :math:`\frac{1}{n(q)} \sum_i P@i \cdot rel_i` over the whole ranking.
* ``reciprocal_rank`` = 1 / (rank of the first relevant item), 0 if none.

A cutoff beyond the K columns uses all K columns (K is the gallery size when the gallery is
smaller than the cutoff). Queries with n(q) = 0 get 0 here for every metric; whether they count
is decided by the reduction (``empty_target_action``).

Each public kernel checks its arguments (O(1): shapes, dtypes, cutoffs) and calls its private
``_<name>_compute`` twin, which internal callers holding checked data call directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_choice, check_counts, check_top_k, describe

__all__ = [
    "PrecisionMode",
    "average_precision",
    "cmc_at_k",
    "map_at_k",
    "map_at_r",
    "ndcg_at_k",
    "precision_at_k",
    "r_precision",
    "recall_at_k",
    "reciprocal_rank",
]

PrecisionMode = Literal["min_k_n", "standard"]
TopK = int | Sequence[int]


def _check_is_relevant(is_relevant: object) -> Tensor:
    if not isinstance(is_relevant, Tensor) or is_relevant.dtype != torch.bool or is_relevant.ndim != 2:
        raise TypeError(f"`is_relevant` must be a 2-D bool tensor of shape (Q, K), got {describe(is_relevant)}.")
    return is_relevant


def _check_hits(is_relevant: object, n_relevant: object, top_k: Any = None) -> None:
    """The arguments of a kernel: the hit matrix, one count per row, the cutoffs (None: a kernel without)."""
    n_query = _check_is_relevant(is_relevant).shape[0]
    check_counts("n_relevant", n_relevant, n_query, "is_relevant")
    if top_k is not None:
        check_top_k("top_k", top_k, allow_empty=False)


def _cutoffs(top_k: TopK, n_columns: int, device: torch.device) -> tuple[Tensor, Tensor, bool]:
    """(requested cutoffs, column index of each cutoff, whether a single int was given) of checked cutoffs."""
    single = isinstance(top_k, int) and not isinstance(top_k, bool)
    ks = [top_k] if single else list(top_k)  # type: ignore[arg-type]
    k = torch.tensor(ks, dtype=torch.long, device=device)
    return k, k.clamp(max=max(n_columns, 1)) - 1, single


def _at_cutoffs(cumulative: Tensor, columns: Tensor, single: bool) -> Tensor:
    if cumulative.shape[1] == 0:
        picked = torch.zeros(cumulative.shape[0], columns.numel(), dtype=cumulative.dtype, device=cumulative.device)
    else:
        picked = cumulative[:, columns]
    return picked[:, 0] if single else picked


def _safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator, 0 where the denominator is 0."""
    denominator = denominator.to(numerator.dtype)
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1e-30), torch.zeros_like(numerator))


def _up_to_last(is_relevant: Tensor, columns: Tensor) -> Tensor:
    """The columns of ``is_relevant`` up to the last cutoff column (the others serve no cutoff)."""
    return is_relevant[:, : int(columns.max()) + 1] if is_relevant.shape[1] else is_relevant


def _hit_counts(is_relevant: Tensor) -> Tensor:
    return is_relevant.cumsum(dim=1, dtype=torch.float32)


def _ranks(n_columns: int, device: torch.device) -> Tensor:
    return torch.arange(1, n_columns + 1, dtype=torch.float32, device=device)


def _expand(values: Tensor, single: bool) -> Tensor:
    """Per-query quantity broadcast against the cutoff axis."""
    return values if single else values[:, None]


def cmc_at_k(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """Cumulative matching characteristic: 1 if a relevant item is among the first k.

    Example:
        >>> hits = torch.tensor([[True, False], [False, True], [False, False]])
        >>> cmc_at_k(hits, torch.tensor([2, 2, 1]), (1, 2))
        tensor([[1., 1.],
                [0., 1.],
                [0., 0.]])
    """
    _check_hits(is_relevant, n_relevant, top_k)
    return _cmc_at_k_compute(is_relevant, n_relevant, top_k)


def _cmc_at_k_compute(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """:func:`cmc_at_k` of checked arguments."""
    _, columns, single = _cutoffs(top_k, is_relevant.shape[1], is_relevant.device)
    return (_at_cutoffs(_hit_counts(_up_to_last(is_relevant, columns)), columns, single) > 0).float()


def precision_at_k(
    is_relevant: Tensor,
    n_relevant: Tensor,
    top_k: TopK,
    *,
    mode: PrecisionMode = "min_k_n",
    n_candidates: Tensor | None = None,
) -> Tensor:
    """Fraction of relevant items among the first k.

    ``mode="min_k_n"`` (open-metric-learning's definition, the default) divides by min(k, n(q)) so
    a perfect ranking scores 1 even when a query has fewer than k relevant items;
    ``mode="standard"`` divides by min(k, |G(q)|), with |G(q)| given by ``n_candidates``, a ``(Q,)``
    integer tensor (default: k, i.e. every gallery holds at least k items).

    Example:
        >>> hits = torch.tensor([[True, True, True, False, False]])
        >>> precision_at_k(hits, torch.tensor([3]), (3, 5))
        tensor([[1., 1.]])
        >>> precision_at_k(hits, torch.tensor([3]), (3, 5), mode="standard")
        tensor([[1.0000, 0.6000]])
    """
    _check_hits(is_relevant, n_relevant, top_k)
    check_choice("mode", mode, ("min_k_n", "standard"))
    if n_candidates is not None:
        check_counts("n_candidates", n_candidates, is_relevant.shape[0], "is_relevant")
    return _precision_at_k_compute(is_relevant, n_relevant, top_k, mode, n_candidates)


def _precision_at_k_compute(
    is_relevant: Tensor, n_relevant: Tensor, top_k: TopK, mode: PrecisionMode, n_candidates: Tensor | None
) -> Tensor:
    """:func:`precision_at_k` of checked arguments."""
    k, columns, single = _cutoffs(top_k, is_relevant.shape[1], is_relevant.device)
    found = _at_cutoffs(_hit_counts(_up_to_last(is_relevant, columns)), columns, single)
    size = n_relevant if mode == "min_k_n" else n_candidates
    if size is None:
        denominator = k[0].expand(found.shape[0]) if single else k[None, :].expand_as(found)
    else:
        denominator = torch.minimum(_expand(size, single), k[0] if single else k[None, :])
    return _safe_divide(found, denominator)


def recall_at_k(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """Fraction of the query's relevant items found among the first k.

    Example:
        >>> recall_at_k(torch.tensor([[True, False, True]]), torch.tensor([4]), (1, 3))
        tensor([[0.2500, 0.5000]])
    """
    _check_hits(is_relevant, n_relevant, top_k)
    return _recall_at_k_compute(is_relevant, n_relevant, top_k)


def _recall_at_k_compute(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """:func:`recall_at_k` of checked arguments."""
    _, columns, single = _cutoffs(top_k, is_relevant.shape[1], is_relevant.device)
    found = _at_cutoffs(_hit_counts(_up_to_last(is_relevant, columns)), columns, single)
    return _safe_divide(found, _expand(n_relevant, single))


def map_at_k(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """Average of P@i over the relevant positions i <= k (0 when none is relevant).

    Example:
        >>> hits = torch.tensor([[True, False], [False, True], [False, False]])
        >>> map_at_k(hits, torch.tensor([1, 1, 2]), (1, 2))
        tensor([[1.0000, 1.0000],
                [0.0000, 0.5000],
                [0.0000, 0.0000]])
    """
    _check_hits(is_relevant, n_relevant, top_k)
    return _map_at_k_compute(is_relevant, n_relevant, top_k)


def _map_at_k_compute(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """:func:`map_at_k` of checked arguments."""
    _, columns, single = _cutoffs(top_k, is_relevant.shape[1], is_relevant.device)
    hits = _up_to_last(is_relevant, columns)
    counts = _hit_counts(hits)
    precision_sum = (counts / _ranks(counts.shape[1], counts.device) * hits).cumsum(dim=1)
    return _safe_divide(_at_cutoffs(precision_sum, columns, single), _at_cutoffs(counts, columns, single))


def ndcg_at_k(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """Normalised discounted cumulative gain with binary relevance.

    Example:
        >>> round(float(ndcg_at_k(torch.tensor([[False, True]]), torch.tensor([1]), 2)), 4)
        0.6309
    """
    _check_hits(is_relevant, n_relevant, top_k)
    return _ndcg_at_k_compute(is_relevant, n_relevant, top_k)


def _ndcg_at_k_compute(is_relevant: Tensor, n_relevant: Tensor, top_k: TopK) -> Tensor:
    """:func:`ndcg_at_k` of checked arguments."""
    k, columns, single = _cutoffs(top_k, is_relevant.shape[1], is_relevant.device)
    n_columns = is_relevant.shape[1]
    discounts = 1.0 / torch.log2(_ranks(n_columns, is_relevant.device) + 1.0)
    hits = _up_to_last(is_relevant, columns)
    gain = _at_cutoffs((hits * discounts[: hits.shape[1]]).cumsum(dim=1), columns, single)
    ideal_table = torch.cat([discounts.new_zeros(1), discounts.cumsum(dim=0)])
    n_ideal = torch.minimum(_expand(n_relevant, single), k[0] if single else k[None, :]).clamp(max=n_columns)
    return _safe_divide(gain, ideal_table[n_ideal])


def _within_first_r(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    return _ranks(is_relevant.shape[1], is_relevant.device)[None, :] <= n_relevant[:, None]


def map_at_r(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """MAP@R: precision averaged over the first R = n(q) positions, relevant ones only, divided by R.

    ``is_relevant`` needs at least max n(q) columns (or the whole gallery) to be exact.

    Example:
        >>> map_at_r(torch.tensor([[True, False, True, False]]), torch.tensor([3]))
        tensor([0.5556])
    """
    _check_hits(is_relevant, n_relevant)
    return _map_at_r_compute(is_relevant, n_relevant)


def _map_at_r_compute(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """:func:`map_at_r` of checked arguments."""
    in_first_r = is_relevant & _within_first_r(is_relevant, n_relevant)
    counts = _hit_counts(in_first_r)
    precision_sum = (counts / _ranks(counts.shape[1], counts.device) * in_first_r).sum(dim=1)
    return _safe_divide(precision_sum, n_relevant)


def r_precision(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """Fraction of relevant items among the first R = n(q).

    Example:
        >>> r_precision(torch.tensor([[True, False, True, False]]), torch.tensor([3]))
        tensor([0.6667])
    """
    _check_hits(is_relevant, n_relevant)
    return _r_precision_compute(is_relevant, n_relevant)


def _r_precision_compute(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """:func:`r_precision` of checked arguments."""
    found = (is_relevant & _within_first_r(is_relevant, n_relevant)).sum(dim=1, dtype=torch.float32)
    return _safe_divide(found, n_relevant)


def average_precision(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """Average precision over the whole ranking: sum of P@i at relevant positions, over n(q).

    ``is_relevant`` must reach every relevant item (a full ranking); relevant items missing from
    it count as never found.

    Example:
        >>> average_precision(torch.tensor([[False, True, True]]), torch.tensor([2]))
        tensor([0.5833])
    """
    _check_hits(is_relevant, n_relevant)
    return _average_precision_compute(is_relevant, n_relevant)


def _average_precision_compute(is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """:func:`average_precision` of checked arguments."""
    counts = _hit_counts(is_relevant)
    precision_sum = (counts / _ranks(counts.shape[1], counts.device) * is_relevant).sum(dim=1)
    return _safe_divide(precision_sum, n_relevant)


def reciprocal_rank(is_relevant: Tensor) -> Tensor:
    """1 / (1-based position of the first relevant item), 0 when no item is relevant.

    Example:
        >>> reciprocal_rank(torch.tensor([[False, False, True], [False, False, False]]))
        tensor([0.3333, 0.0000])
    """
    _check_is_relevant(is_relevant)
    return _reciprocal_rank_compute(is_relevant)


def _reciprocal_rank_compute(is_relevant: Tensor) -> Tensor:
    """:func:`reciprocal_rank` of checked arguments."""
    if is_relevant.shape[1] == 0:
        return torch.zeros(is_relevant.shape[0], device=is_relevant.device)
    first = is_relevant.float().argmax(dim=1).float() + 1.0
    return torch.where(is_relevant.any(dim=1), 1.0 / first, torch.zeros_like(first))
