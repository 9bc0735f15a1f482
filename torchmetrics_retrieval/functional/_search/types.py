"""The engine's vocabulary: result types, the distance and backend names, and the exclusion rule.

The exclusion rule lives here once. A gallery item ``g`` is *excluded* from the gallery of query ``q`` when
it is ``q`` itself (``self_index[q] == g``: by position, never by comparing vectors), when both carry the
same sequence id, or when they belong to different search groups. :meth:`Exclusions.fill_excluded_` writes
a value into the excluded pairs of any block of pairs (a query x gallery tile, a sample of gallery columns,
or a per-query list of gallery items), and :meth:`Exclusions.count_eligible` counts what the rule leaves,
per query, without forming pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

import torch
from torch import Tensor

__all__ = [
    "BACKENDS",
    "DISTANCES",
    "Distance",
    "DistanceBlock",
    "Exclusions",
    "KNNBackend",
    "KNNResult",
    "RelevanceFn",
]

Distance = Literal["euclidean", "sqeuclidean", "cosine", "dot"]
KNNBackend = Literal["auto", "torch", "faiss"]
DISTANCES: tuple[str, ...] = get_args(Distance)
BACKENDS: tuple[str, ...] = get_args(KNNBackend)
#: ``(query positions (R,), gallery positions (R, n)) -> (R, n) bool``: which retrieved items are relevant.
RelevanceFn = Callable[[Tensor, Tensor], Tensor]


class KNNResult(NamedTuple):
    """Neighbours of every query, nearest first; ties ordered by gallery position.

    distances: (Q, K) in the chosen distance, +inf where ``valid`` is False.
    indices: (Q, K) int64 gallery positions; 0 where ``valid`` is False (never -1).
    valid: (Q, K) bool; False only where a query has fewer than K eligible gallery items.
    """

    distances: Tensor
    indices: Tensor
    valid: Tensor


class DistanceBlock(NamedTuple):
    """One block of the query x gallery distance matrix (see ``distance_blocks``)."""

    query_slice: slice
    gallery_slice: slice
    distances: Tensor  # (rows, cols), the chosen distance; +inf where not eligible
    eligible: Tensor | None  # (rows, cols) bool, or None when every pair of the block is eligible


#: Gallery columns of a block of pairs: a slice or ``(C,)`` positions shared by every row, or ``(R, n)``
#: positions of each row's own items.
Columns = slice | Tensor


def _query_side(ids: Tensor, rows: slice | Tensor) -> Tensor:
    return ids[rows][:, None]


def _gallery_side(ids: Tensor, cols: Columns) -> Tensor:
    return ids[cols] if isinstance(cols, Tensor) and cols.ndim == 2 else ids[cols][None, :]


class Exclusions(NamedTuple):
    """Checked exclusion rules, all on the query's device (see the module docstring)."""

    self_index: Tensor | None  # (Q,) int64, -1 where the query is not in the gallery
    sequence_ids: tuple[Tensor, Tensor] | None  # (query side (Q,), gallery side (G,))
    search_groups: tuple[Tensor, Tensor] | None  # (query side (Q,), gallery side (G,))

    @property
    def any(self) -> bool:
        """Whether some rule is given."""
        return self.self_index is not None or self.sequence_ids is not None or self.search_groups is not None

    def fill_excluded_(self, target: Tensor, rows: slice | Tensor, cols: Columns, value: float | bool) -> Tensor:
        """Write ``value`` into the entries of ``target`` that pair a query of ``rows`` with an excluded item.

        ``target`` is ``(R, C)`` for the query rows ``rows`` (a slice or positions) and the columns ``cols``
        (see :data:`Columns`). The self rule touches at most one entry per row: for a slice of columns it
        is written entry by entry instead of comparing the whole block. Returns ``target``.
        """
        if self.sequence_ids is not None:
            seq_q, seq_g = self.sequence_ids
            target.masked_fill_(_query_side(seq_q, rows) == _gallery_side(seq_g, cols), value)
        if self.search_groups is not None:
            group_q, group_g = self.search_groups
            target.masked_fill_(_query_side(group_q, rows) != _gallery_side(group_g, cols), value)
        if self.self_index is not None:
            own = self.self_index[rows]
            if isinstance(cols, slice):
                hit = torch.nonzero((own >= cols.start) & (own < cols.stop)).flatten()
                target[hit, own[hit] - cols.start] = value
            else:
                target.masked_fill_(_query_side(own, slice(None)) == (cols if cols.ndim == 2 else cols[None, :]), value)
        return target

    def eligible(
        self, rows: slice | Tensor, cols: Columns, shape: tuple[int, int], device: torch.device
    ) -> Tensor | None:
        """``shape`` bool mask of the eligible pairs of a block, or None when every pair is eligible."""
        if not self.any:
            return None
        mask = self.fill_excluded_(torch.ones(shape, dtype=torch.bool, device=device), rows, cols, False)
        return None if bool(mask.all()) else mask

    def take(self, rows: Tensor) -> Exclusions:
        """The rules of a subset of the queries (the gallery side is unchanged)."""
        seq, groups = self.sequence_ids, self.search_groups
        return Exclusions(
            self_index=None if self.self_index is None else self.self_index[rows],
            sequence_ids=None if seq is None else (seq[0][rows], seq[1]),
            search_groups=None if groups is None else (groups[0][rows], groups[1]),
        )

    def count_eligible(self, n_query: int, n_gallery: int, device: torch.device) -> Tensor:
        """Number of eligible gallery items of each query, ``(Q,)`` int64, by counting ids (no pairs formed):
        the group's size, minus the items of the query's sequence in its group, minus the query itself
        when it is in the gallery and not already excluded by those two rules."""
        count = torch.full((n_query,), n_gallery, dtype=torch.long, device=device)
        group_q = group_g = seq_q = seq_g = None
        if self.search_groups is not None:
            group_q, group_g, n_groups = _dense_ids(*self.search_groups)
            count = _same_id_count(group_q, group_g, n_groups)
        if self.sequence_ids is not None:
            seq_q, seq_g, n_seq = _dense_ids(*self.sequence_ids)
            if group_q is not None and group_g is not None:  # same sequence *and* same group
                count = count - _same_id_count(group_q * n_seq + seq_q, group_g * n_seq + seq_g, n_groups * n_seq)
            else:
                count = count - _same_id_count(seq_q, seq_g, n_seq)
        if self.self_index is not None:
            own = self.self_index
            present = own >= 0
            safe = own.clamp(min=0)
            if seq_q is not None and seq_g is not None:
                present &= seq_g[safe] != seq_q
            if group_q is not None and group_g is not None:
                present &= group_g[safe] == group_q
            count = count - present.long()
        return count


def _dense_ids(query_side: Tensor, gallery_side: Tensor) -> tuple[Tensor, Tensor, int]:
    """Both sides of an id pair mapped to 0..U-1 (same id, same number), and U."""
    unique, inverse = torch.unique(torch.cat([query_side, gallery_side]), return_inverse=True)
    n_query = query_side.shape[0]
    return inverse[:n_query], inverse[n_query:], unique.numel()


def _same_id_count(query_ids: Tensor, gallery_ids: Tensor, n_ids: int) -> Tensor:
    """For each query, the number of gallery items with the same dense id."""
    return torch.bincount(gallery_ids, minlength=n_ids)[query_ids]
