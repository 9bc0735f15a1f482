"""The engine's vocabulary: result types, the distance and backend names, and the exclusion rule.

The exclusion rule lives here once. A gallery item ``g`` is *excluded* from the gallery of query ``q`` when
it is ``q`` itself (``self_index[q] == g``: by position, never by comparing vectors), when both carry the
same sequence id, when both carry the same label *and* camera (the re-identification camera protocol; the
pair is encoded as one id, ``camera_labels``), when they belong to different search groups, or when both lie
on the same side of a bipartite search (``sides``: one set's items against another's, in one symmetric pass).
:meth:`Exclusions.fill_excluded_` writes a value into the excluded pairs of any block of pairs (a query x
gallery tile, a sample of gallery columns, or a per-query list of gallery items), and
:meth:`Exclusions.count_eligible` counts what the rule leaves, per query, without forming pairs.
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
    "consecutive_start",
]

Distance = Literal["euclidean", "sqeuclidean", "cosine", "dot"]
KNNBackend = Literal["auto", "torch", "faiss"]
DISTANCES: tuple[str, ...] = get_args(Distance)
BACKENDS: tuple[str, ...] = get_args(KNNBackend)
#: ``(query positions (R,), gallery positions (R, n)) -> (R, n) bool``: which retrieved items are relevant.
RelevanceFn = Callable[[Tensor, Tensor], Tensor]


def consecutive_start(rows: Tensor) -> int | None:
    """The first of ``rows`` when they are consecutive positions ``start, start + 1, ...`` (0 when empty), else None:
    such rows can be read as a slice, in place.

    >>> consecutive_start(torch.tensor([4, 5, 6])), consecutive_start(torch.tensor([4, 6]))
    (4, None)
    """
    start = int(rows[0]) if rows.numel() else 0
    return start if bool((rows == torch.arange(start, start + rows.numel(), device=rows.device)).all()) else None


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
    camera_labels: tuple[Tensor, Tensor] | None = None  # dense ids of (label, camera), both sides
    sides: tuple[Tensor, Tensor] | None = None  # side (0 or 1) of each item in a bipartite search
    self_is_identity: bool = False  # ``self_index`` is ``arange(Q)``: a set against itself

    @property
    def same_id_rules(self) -> list[tuple[Tensor, Tensor]]:
        """The rules that exclude the items sharing the query's id: sequences, (label, camera), side."""
        return [ids for ids in (self.sequence_ids, self.camera_labels, self.sides) if ids is not None]

    @property
    def any(self) -> bool:
        """Whether some rule is given."""
        return self.self_index is not None or bool(self.same_id_rules) or self.search_groups is not None

    def fill_excluded_(self, target: Tensor, rows: slice | Tensor, cols: Columns, value: float | bool) -> Tensor:
        """Write ``value`` into the entries of ``target`` that pair a query of ``rows`` with an excluded item.

        ``target`` is ``(R, C)`` for the query rows ``rows`` (a slice or positions) and the columns ``cols``
        (see :data:`Columns`). The self rule touches at most one entry per row: for slices of a set against
        itself, the block's diagonal that pairs each query with itself; for a slice of columns, or ascending
        positions (a search's strided sample, found by bisection), entry by entry instead of comparing the
        whole block. Returns ``target``.
        """
        for ids_q, ids_g in self.same_id_rules:
            target.masked_fill_(_query_side(ids_q, rows) == _gallery_side(ids_g, cols), value)
        if self.search_groups is not None:
            group_q, group_g = self.search_groups
            target.masked_fill_(_query_side(group_q, rows) != _gallery_side(group_g, cols), value)
        if self.self_index is not None:
            if self.self_is_identity and isinstance(rows, slice) and isinstance(cols, slice):
                # query i is item i: a block's own entries lie on one diagonal, a view (no index computed)
                target.diagonal((rows.start or 0) - (cols.start or 0)).fill_(value)
                return target
            own = self.self_index[rows]
            if isinstance(cols, slice):
                hit = torch.nonzero((own >= cols.start) & (own < cols.stop)).flatten()
                target[hit, own[hit] - cols.start] = value
            elif cols.ndim == 1 and cols.numel() and bool((cols[1:] > cols[:-1]).all()):
                at = torch.searchsorted(cols, own).clamp_(max=cols.numel() - 1)
                hit = torch.nonzero(cols[at] == own).flatten()
                target[hit, at[hit]] = value
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

        def side(ids: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
            return None if ids is None else (ids[0][rows], ids[1])

        return Exclusions(
            self_index=None if self.self_index is None else self.self_index[rows],
            sequence_ids=side(self.sequence_ids),
            search_groups=side(self.search_groups),
            camera_labels=side(self.camera_labels),
            sides=side(self.sides),
        )

    def count_eligible(self, n_query: int, n_gallery: int, device: torch.device) -> Tensor:
        """Number of eligible gallery items of each query, ``(Q,)`` int64, by counting ids (no pairs formed):
        the items of the query's group, minus those sharing one of its same-id rules (by inclusion-exclusion
        over the rules), minus the query itself when it is in the gallery and no rule already excluded it."""
        group = self.search_groups if self.search_groups is not None else None
        rules = self.same_id_rules

        def sharing(chosen: list[tuple[Tensor, Tensor]]) -> Tensor:
            """Per query, the items of its group sharing every id of ``chosen``."""
            sides = ([group] if group is not None else []) + chosen
            if not sides:
                return torch.full((n_query,), n_gallery, dtype=torch.long, device=device)
            query_key, gallery_key, n_keys = _dense_ids(*_combined(sides))
            return _same_id_count(query_key, gallery_key, n_keys)

        count = sharing([])
        for size in range(1, len(rules) + 1):  # inclusion-exclusion: |A or B| = |A| + |B| - |A and B|
            for chosen in _subsets(rules, size):
                count = count - (-1) ** (size + 1) * sharing(chosen)
        if self.self_index is not None and not rules:  # a same-id rule always excludes the query itself
            own = self.self_index
            present = own >= 0
            if group is not None:
                present &= group[1][own.clamp(min=0)] == group[0]
            count = count - present.long()
        return count


def _subsets(items: list[tuple[Tensor, Tensor]], size: int) -> list[list[tuple[Tensor, Tensor]]]:
    if size == 0:
        return [[]]
    return [[items[i], *rest] for i in range(len(items)) for rest in _subsets(items[i + 1 :], size - 1)]


def _combined(sides: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Several id pairs as one pair of ids, equal when every component is equal (mixed in as dense ids, one
    component at a time: a 1-D unique each, far faster than a unique over rows)."""
    query, gallery, _ = _dense_ids(*sides[0])
    for side in sides[1:]:
        q, g, n = _dense_ids(*side)
        query, gallery, _ = _dense_ids(query * n + q, gallery * n + g)
    return query, gallery


def _dense_ids(query_side: Tensor, gallery_side: Tensor) -> tuple[Tensor, Tensor, int]:
    """Both sides of an id pair mapped to 0..U-1 (same id, same number), and U."""
    unique, inverse = torch.unique(torch.cat([query_side, gallery_side]), return_inverse=True)
    n_query = query_side.shape[0]
    return inverse[:n_query], inverse[n_query:], unique.numel()


def _same_id_count(query_ids: Tensor, gallery_ids: Tensor, n_ids: int) -> Tensor:
    """For each query, the number of gallery items with the same dense id."""
    return torch.bincount(gallery_ids, minlength=n_ids)[query_ids]
