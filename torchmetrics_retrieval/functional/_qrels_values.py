r"""Per-query values of :func:`~torchmetrics_retrieval.functional.qrels.qrels_metrics` from a ranked list: every
cutoff of every measure in one pass of cumulative sums over a ``(R, L)`` block (definitions: docs/definitions.md,
"Graded relevance with qrels").

Ties. The list arrives in the order the search gives (distance, then corpus position; for ``ties="trec_eval"`` the
corpus was reordered so that position order is trec_eval's). For ``ties="expected"`` the items of equal distance form
*tie groups*, and each value is its mean over every order of the items inside each group (McSherry & Najork, 2008).
The values linear in the relevance at each rank (precision, recall, R-precision, DCG) take the group's mean
relevance (or gain) at each of its ranks. Average precision has products of two ranks' relevance: for two ranks of
one group of :math:`t` items holding :math:`r` relevant ones, :math:`E[x_i x_j] = r (r - 1) / (t (t - 1))`; for ranks
of different groups, the product of their means. The reciprocal rank of a first relevant item in a group of
:math:`t` items with :math:`r` relevant ones, after :math:`b` better items, is
:math:`\sum_j P(J = j) / (b + j)` with :math:`P(J = j) = \binom{t - j}{r - 1} / \binom{t}{r}`
(:func:`expected_reciprocal_rank`). Without ties every group is one item and the same formulas give the plain values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["Cutoffs", "expected_reciprocal_rank", "list_values"]

#: Entries of the ``(rows, j)`` table of :func:`expected_reciprocal_rank` per block.
_RR_BUDGET = 2**22


class Cutoffs:
    """The requested cutoffs by measure (sorted tuples) and the two whole-ranking measures."""

    def __init__(
        self,
        ndcg: Sequence[int],
        map_: Sequence[int],
        recall: Sequence[int],
        precision: Sequence[int],
        mrr: bool,
        r_precision: bool,
    ) -> None:
        self.ndcg, self.map, self.recall, self.precision = tuple(ndcg), tuple(map_), tuple(recall), tuple(precision)
        self.mrr, self.r_precision = mrr, r_precision
        self.every = tuple(sorted(set(self.ndcg + self.map + self.recall + self.precision)))

    def keys(self) -> list[str]:
        """The result keys, in the order of the values."""
        keys = [f"ndcg/{k}" for k in self.ndcg] + [f"map/{k}" for k in self.map]
        keys += [f"recall/{k}" for k in self.recall] + [f"precision/{k}" for k in self.precision]
        keys += ["mrr"] * self.mrr + ["r_precision"] * self.r_precision
        return keys + ["tie_rate"] * bool(self.every)


def _lchoose(n: Tensor, k: Tensor) -> Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def expected_reciprocal_rank(before: Tensor, tied: Tensor, relevant: Tensor) -> Tensor:
    """Mean over the orders of a tie group of the reciprocal rank of its first relevant item: ``before`` items
    precede the group of ``tied`` items, ``relevant >= 1`` of them relevant (all ``(B,)``). Float64, in blocks of
    rows so that the ``(rows, j)`` table stays within a budget (a constant scorer has one group of N items)."""
    before, tied, relevant = (x.to(torch.float64) for x in (before, tied, relevant))
    out = torch.zeros_like(before)
    if before.numel() == 0:
        return out
    spans = (tied - relevant + 1).clamp(min=1)  # the first relevant item's possible positions in the group
    order = torch.argsort(spans)  # similar widths together: little padding
    start = 0
    while start < order.numel():
        width = int(spans[order[min(order.numel() - 1, start)]])
        rows = order[start : start + max(1, _RR_BUDGET // width)]
        width = int(spans[rows].max())
        j = torch.arange(1, width + 1, dtype=torch.float64, device=before.device)[None, :]
        t, r, b = tied[rows, None], relevant[rows, None], before[rows, None]
        possible = j <= t - r + 1
        log_p = _lchoose((t - j).clamp(min=0), r - 1) - _lchoose(t, r)
        out[rows] = torch.where(possible, torch.exp(log_p) / (b + j), 0.0).sum(dim=1)
        start += rows.numel()
    return out


def _groups(distances: Tensor, expected: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Per slot: its group id, the group's first slot and the group's size (singletons unless ``expected``)."""
    n_rows, width = distances.shape
    position = torch.arange(width, device=distances.device).expand(n_rows, width)
    if not expected:
        return position, position, torch.ones_like(position)
    new = torch.ones_like(distances, dtype=torch.bool)
    new[:, 1:] = distances[:, 1:] != distances[:, :-1]
    group = torch.cumsum(new, dim=1) - 1
    first = torch.where(new, position, 0).cummax(dim=1).values
    size = torch.zeros_like(group).scatter_add_(1, group, torch.ones_like(group)).gather(1, group)
    return group, first, size


def _group_sum(values: Tensor, group: Tensor) -> Tensor:
    return torch.zeros_like(values).scatter_add_(1, group, values).gather(1, group)


def _at(cumulative: Tensor, ks: Tensor | Sequence[int]) -> Tensor:
    """``cumulative`` at rank ``k`` (1-based; the last rank for a k past the list, which holds every item there)."""
    width = cumulative.shape[1]
    if isinstance(ks, Tensor):  # one k per row
        return cumulative.gather(1, (ks.clamp(max=width) - 1).clamp(min=0)[:, None])[:, 0]
    return cumulative[:, [min(k, width) - 1 for k in ks]]


def _safe_div(numerator: Tensor, denominator: Tensor) -> Tensor:
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1e-300), 0.0)


def list_values(
    cutoffs: Cutoffs,
    distances: Tensor,
    valid: Tensor,
    grades: Tensor,
    complete: Tensor,
    n_relevant: Tensor,
    ideal: Tensor,
    relevance_level: int,
    expected: bool,
) -> tuple[dict[str, Tensor], Tensor]:
    """The per-query values of a block of ranked lists, and the rows whose ``mrr`` the list cannot give.

    Args:
        cutoffs: what to compute.
        distances: ``(R, L)`` reported distances, ascending (+inf in invalid slots).
        valid: ``(R, L)`` bool.
        grades: ``(R, L)`` int64 grades of the listed items (0: unjudged or invalid).
        complete: ``(R,)`` bool, the list holds every eligible item of the row.
        n_relevant: ``(R,)`` relevant documents of each row (in the corpus or not).
        ideal: ``(R, M)`` float64 judged grades, decreasing.
        relevance_level: grade threshold of the binary measures.
        expected: tie groups are averaged over (else every slot is its own group).

    Returns:
        ``{key: (R,) float64}`` (``mrr`` is 0 on the rows returned as beyond the list) and ``(R,)`` bool, the rows
        whose first relevant item (or its tie group) lies beyond the list.
    """
    n_rows, width = distances.shape
    device = distances.device
    relevant = ((grades >= relevance_level) & valid).to(torch.float64)
    gains = torch.where(valid, grades, 0).to(torch.float64)
    group, first, size = _groups(distances, expected)
    sizes = size.to(torch.float64)
    hits_in_group = _group_sum(relevant, group)
    mean_hit = hits_in_group / sizes
    mean_gain = _group_sum(gains, group) / sizes if expected else gains
    rank = torch.arange(1, width + 1, dtype=torch.float64, device=device)
    n_rel = n_relevant.to(torch.float64)
    values: dict[str, Tensor] = {}

    if cutoffs.ndcg:
        dcg = torch.cumsum(mean_gain / torch.log2(rank + 1), dim=1)
        ideal_rank = torch.arange(1, ideal.shape[1] + 1, dtype=torch.float64, device=device)
        idcg = torch.cumsum(ideal / torch.log2(ideal_rank + 1), dim=1)
        for k, gained, best in zip(cutoffs.ndcg, _at(dcg, cutoffs.ndcg).T, _at(idcg, cutoffs.ndcg).T, strict=True):
            values[f"ndcg/{k}"] = _safe_div(gained, best)
    hits = torch.cumsum(mean_hit, dim=1)
    if cutoffs.map:
        # E[x_i * (1 + sum_{j<i} x_j)]: same-group pairs by r (r - 1) / (t (t - 1)), other pairs by their means
        before_in_group = (torch.arange(width, device=device)[None, :] - first).to(torch.float64)
        pair = _safe_div(hits_in_group * (hits_in_group - 1), sizes * (sizes - 1))
        earlier = hits - mean_hit
        term = mean_hit + mean_hit * (earlier - before_in_group * mean_hit) + before_in_group * pair
        ap = torch.cumsum(term / rank, dim=1)
        for k, total in zip(cutoffs.map, _at(ap, cutoffs.map).T, strict=True):
            values[f"map/{k}"] = _safe_div(total, n_rel)
    for k, found in zip(cutoffs.recall, _at(hits, cutoffs.recall).T if cutoffs.recall else (), strict=True):
        values[f"recall/{k}"] = _safe_div(found, n_rel)
    for k, found in zip(cutoffs.precision, _at(hits, cutoffs.precision).T if cutoffs.precision else (), strict=True):
        values[f"precision/{k}"] = found / k
    beyond = torch.zeros(n_rows, dtype=torch.bool, device=device)
    if cutoffs.mrr:
        has = hits_in_group > 0
        found = has.any(dim=1)
        at = torch.where(found, has.to(torch.int8).argmax(dim=1), 0)  # the first slot of the first group with a hit
        start, tied = first.gather(1, at[:, None])[:, 0], size.gather(1, at[:, None])[:, 0]
        closed = complete | (start + tied < width)  # the group's end is inside the list
        counted_here = found & closed
        rr = torch.zeros(n_rows, dtype=torch.float64, device=device)
        rows = torch.nonzero(counted_here).flatten()
        rr[rows] = expected_reciprocal_rank(start[rows], tied[rows], hits_in_group.gather(1, at[:, None])[rows, 0])
        values["mrr"] = rr
        beyond = ~counted_here & ~complete & (n_relevant > 0)
    if cutoffs.r_precision:
        values["r_precision"] = _safe_div(_at(hits, n_relevant), n_rel)
    if cutoffs.every:
        # a cutoff k is inside a tie when the items at ranks k and k + 1 have the same distance
        ks = [k for k in cutoffs.every if k < width]
        inside = torch.zeros(n_rows, dtype=torch.float64, device=device)
        if ks:
            k_index = torch.tensor(ks, device=device)
            tied_at = valid[:, k_index] & (distances[:, k_index - 1] == distances[:, k_index])
            inside = tied_at.to(torch.float64).sum(dim=1)
        values["tie_rate"] = inside / len(cutoffs.every)
    return values, beyond
