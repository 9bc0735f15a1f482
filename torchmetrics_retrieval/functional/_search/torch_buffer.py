"""The candidate buffer of the torch stage in torch passes (any device): per query, a running set of the best
candidates and a threshold ``tau`` below which a key must lie to enter it.

A block of keys is compared once against ``tau`` (after pruning by the minima of ``plan.SEGMENT``-wide
segments) and only the entries below it are appended; a full row is cut back to its best ``kp`` by one
``topk``, which lowers ``tau`` to the ``kp``-th key. While ``tau`` is +inf (no threshold yet) a row's block
entries go through a dense ``topk``. On the CPU, large searches take ``compiled.buffer.CompiledBuffer``
instead, with the same interface.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import plan

__all__ = ["TorchBuffer"]


def _below_by_row(keys: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(r, c, keys[r, c])`` of the entries with ``keys[r, c] < tau[r]``, sorted by row then column.

    The minima of ``SEGMENT``-wide row segments are taken first (one fast reduction); only the segments
    whose minimum is below the threshold are copied out (contiguous ``index_select``) and compared entry
    by entry.
    """
    n_rows, n_cols = keys.shape
    if n_cols % plan.SEGMENT or not keys.is_contiguous():
        r, c = torch.nonzero(keys < tau[:, None], as_tuple=True)
        return r, c, keys[r, c]
    per_row = n_cols // plan.SEGMENT
    segments = keys.view(n_rows * per_row, plan.SEGMENT)
    passing = torch.nonzero((segments.amin(dim=1).view(n_rows, per_row) < tau[:, None]).view(-1)).squeeze(1)
    values = segments.index_select(0, passing)  # (P, SEGMENT)
    segment_rows = torch.div(passing, per_row, rounding_mode="floor")
    hits = torch.nonzero((values < tau.index_select(0, segment_rows)[:, None]).view(-1)).squeeze(1)
    segment = torch.div(hits, plan.SEGMENT, rounding_mode="floor")
    rows = segment_rows.index_select(0, segment)
    cols = (passing.index_select(0, segment) - rows * per_row) * plan.SEGMENT + hits - segment * plan.SEGMENT
    return rows, cols, values.view(-1).index_select(0, hits)


def _below_by_column(keys: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(c, r, keys[r, c])`` of the entries with ``keys[r, c] < tau[c]``, sorted by column then row.

    The minima of ``SEGMENT``-tall column segments come from one contiguous reduction over the row-major
    block; the few passing segments are gathered with ``take``. When many pass (a loose threshold), one
    transposed copy of the block and the row-wise scan are cheaper.
    """
    n_rows, n_cols = keys.shape
    if n_rows % plan.SEGMENT or not keys.is_contiguous():
        return _below_by_row(keys.T.contiguous(), tau)
    per_column = n_rows // plan.SEGMENT
    minima = keys.view(per_column, plan.SEGMENT, n_cols).amin(dim=1)  # (segments, columns)
    cols, segments = torch.nonzero((minima < tau[None, :]).T, as_tuple=True)  # sorted by column
    if cols.numel() * plan.TRANSPOSE_SHARE > minima.numel():
        return _below_by_row(keys.T.contiguous(), tau)
    rows = segments[:, None] * plan.SEGMENT + torch.arange(plan.SEGMENT, device=keys.device)  # (P, SEGMENT)
    values = keys.take(rows * n_cols + cols[:, None])
    hits = torch.nonzero((values < tau.index_select(0, cols)[:, None]).view(-1)).squeeze(1)
    strip = torch.div(hits, plan.SEGMENT, rounding_mode="floor")
    return cols.index_select(0, strip), rows.view(-1).index_select(0, hits), values.view(-1).index_select(0, hits)


class TorchBuffer:
    """Best candidates of ``n_rows`` queries: ``(n_rows, kp + slack)`` keys and gallery positions."""

    def __init__(self, kp: int, tau: Tensor) -> None:
        self.kp = kp
        self.width = plan.buffer_width(kp)
        n_rows, device = tau.shape[0], tau.device
        self.keys = torch.full((n_rows, self.width), float("inf"), device=device)
        self.indices = torch.zeros((n_rows, self.width), dtype=torch.int32, device=device)
        self.fill = torch.zeros(n_rows, dtype=torch.long, device=device)
        self.tau = tau.clone()  # +inf: no threshold yet

    def filling(self, rows: slice) -> bool:
        """Whether some of these rows has no threshold yet."""
        return bool(torch.isinf(self.tau[rows]).any())

    def add_dense(self, rows: slice, keys: Tensor, col0: int) -> None:
        """Append the best ``kp`` entries of each block row (rows ``rows``, items ``col0 + column``)."""
        top = torch.topk(keys, min(self.kp, keys.shape[1]), dim=1, largest=False, sorted=False)
        self._append_dense(rows, top.values, top.indices + col0)

    def add_dense_transposed(self, items: slice, keys: Tensor, queries: slice) -> None:
        """As :meth:`add_dense` for the column queries of a block whose rows are the items ``items``."""
        top = torch.topk(keys, min(self.kp, keys.shape[0]), dim=0, largest=False, sorted=False)
        self._append_dense(queries, top.values.T, top.indices.T + items.start)

    def add_filtered(self, rows: slice, keys: Tensor, col0: int) -> None:
        """Append the entries of the block below their row's threshold."""
        r, c, values = _below_by_row(keys, self.tau[rows])
        if r.numel():
            self._append_sorted(rows, r, c + col0, values)

    def add_filtered_transposed(self, items: slice, keys: Tensor, queries: slice) -> None:
        """Append the entries below their column query's threshold (keys are symmetric)."""
        c, r, values = _below_by_column(keys, self.tau[queries])
        if c.numel():
            self._append_sorted(queries, c, r + items.start, values)

    def add_both(self, rows: slice, keys: Tensor, cols: slice) -> None:
        """Append the entries of a block of symmetric keys for its row queries and its column queries."""
        if self.filling(rows):
            self.add_dense(rows, keys, cols.start)
        else:
            self.add_filtered(rows, keys, cols.start)
        if self.filling(cols):
            self.add_dense_transposed(rows, keys, cols)
        else:
            self.add_filtered_transposed(rows, keys, cols)

    def _append_dense(self, rows: slice, values: Tensor, items: Tensor) -> None:
        """Append ``values.shape[1]`` entries to every row of the slice ``rows``.

        With ``kp`` entries per row they may be the best ``kp`` of more: the dropped ones are >= the largest
        kept, so a row's threshold is lowered to it (else a dropped key could lie below the threshold).
        """
        n_new = values.shape[1]
        if n_new >= self.kp:
            self.tau[rows] = torch.minimum(self.tau[rows], values.amax(dim=1))
        full = torch.nonzero(self.fill[rows] + n_new > self.width).flatten()
        if full.numel():
            self._compact(full + rows.start)
        slots = self.fill[rows, None] + torch.arange(n_new, device=values.device)
        self.keys[rows].scatter_(1, slots, values)
        self.indices[rows].scatter_(1, slots, items.to(torch.int32))
        self.fill[rows] += n_new
        self._set_thresholds(rows)

    def _append_sorted(self, rows: slice, local: Tensor, items: Tensor, values: Tensor) -> None:
        """Append pairs whose row offsets ``local`` (within the slice ``rows``) are sorted."""
        counts = torch.bincount(local, minlength=rows.stop - rows.start)
        if int(counts.max()) > self.width - self.kp:  # more than the slack of a row: reduce to kp per row first
            self._append_dense(rows, *self._best_per_row(local, items, values, counts))
            return
        full = torch.nonzero(self.fill[rows] + counts > self.width).flatten()
        if full.numel():
            self._compact(full + rows.start)
        starts = torch.cumsum(counts, 0) - counts
        target = local + rows.start
        slots = self.fill[target] + torch.arange(local.numel(), device=local.device) - starts[local]
        self.keys[target, slots] = values
        self.indices[target, slots] = items.to(torch.int32)
        self.fill[rows] += counts
        self._set_thresholds(rows)

    def _best_per_row(self, local: Tensor, items: Tensor, values: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """The best ``kp`` of each row's new pairs, as dense ``(rows, kp)`` values and items (+inf padding)."""
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(local.numel(), device=local.device) - starts[local]
        dense = torch.full((counts.numel(), int(counts.max())), float("inf"), device=values.device)
        dense_items = torch.zeros(dense.shape, dtype=torch.long, device=values.device)
        dense[local, rank] = values
        dense_items[local, rank] = items
        top = torch.topk(dense, min(self.kp, dense.shape[1]), dim=1, largest=False, sorted=False)
        return top.values, dense_items.gather(1, top.indices)

    def _set_thresholds(self, rows: slice) -> None:
        """Give a threshold to the rows that have just reached ``kp`` entries."""
        waiting = torch.nonzero(torch.isinf(self.tau[rows]) & (self.fill[rows] >= self.kp)).flatten()
        if waiting.numel():
            self._compact(waiting + rows.start)

    def _compact(self, rows: Tensor) -> None:
        """Cut ``rows`` back to their best ``kp`` entries and set their thresholds."""
        top = torch.topk(self.keys[rows], self.kp, dim=1, largest=False, sorted=False)
        kept = self.indices[rows].gather(1, top.indices)
        self.keys[rows, self.kp :] = float("inf")
        self.keys[rows, : self.kp] = top.values
        self.indices[rows, : self.kp] = kept
        self.fill[rows] = self.kp
        self.tau[rows] = top.values.max(dim=1).values

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(keys, gallery positions)`` of the best ``kp`` candidates of every row (+inf where none) and
        each row's floor: every key of the row that is not a candidate is >= it."""
        over = torch.nonzero(self.fill > self.kp).flatten()
        if over.numel():
            self._compact(over)
        return self.keys[:, : self.kp].clone(), self.indices[:, : self.kp].long(), self.tau.clone()
