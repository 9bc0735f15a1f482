"""Streaming top-k selection over a blocked key matrix: the torch backend's stage 1 of ``knn``.

Each query keeps a running buffer of candidates and a threshold ``tau``: every key of the query that
is not in the buffer is >= ``tau``. A new block of keys is compared once against ``tau`` and only the
few entries below it are extracted and appended; the buffer is cut back to its best ``kp`` by one
``topk`` when it fills up, which lowers ``tau`` to the ``kp``-th key. While ``tau`` is +inf (no
threshold yet) a query's block rows go through a dense ``topk``. For large searches on the CPU the same
buffer is a :class:`~torchmetrics_retrieval.functional._compiled_buffer.CompiledBuffer`, whose compiled
scans do the compare-and-append of a block in one pass.

The first ``tau`` comes from a strided sample of the gallery: its ``kp``-th key (a proven upper bound of
the ``kp``-th key over the whole gallery) or, with ``estimate=True``, a lower sample rank chosen so that
the true ``kp``-th key is below it with overwhelming probability. An estimate discards far more of every
block; a query whose estimate was too low ends with fewer than ``kp`` candidates, and the final ``tau``
it returns (its *floor*) still bounds every key it dropped, so the caller can decide whether the
candidates it has are enough.

Two drivers share the buffer:

* :func:`stream_topk` - queries against a separate gallery, query chunk by query chunk;
* :func:`stream_topk_symmetric` - a set searched against itself: only the blocks on and above the
  diagonal are computed, and each off-diagonal block serves its row queries *and*, transposed, its
  column queries, so every distance is computed once instead of twice.

Keys rank like distances: ``|g|^2 - 2<q, g>`` for L2 (the query's own norm is constant per row and
dropped), ``-<q, g>`` for dot and cosine (on unit rows). A key is +inf for an excluded pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional import _compiled_buffer
from torchmetrics_retrieval.functional._compiled_buffer import CompiledBuffer

__all__ = [
    "BlockMemory",
    "addmm_keys",
    "buffer_width",
    "product_keys",
    "sample_size",
    "sample_thresholds",
    "stream_topk",
    "stream_topk_symmetric",
]

#: Masks the excluded pairs of a block in place: (keys, query rows, gallery columns).
MaskFn = Callable[[Tensor, slice, "slice | Tensor"], None]
#: Keys of a block of query rows against gallery columns (a slice, or an index tensor for the sample).
KeyFn = Callable[[slice, "slice | Tensor"], Tensor]


#: Width of the segments whose minima prune a block before any exact comparison.
SEGMENT = 32
#: The pre-pass that gives every query an initial threshold samples about ``SAMPLE_SCALE * (kp * G)^(1/3)``
#: gallery items: a larger sample costs more, a smaller one gives a looser threshold (more entries pass
#: it, each costing an append and a sort). Measured with ``knn``'s compiled scans at N = 10k-100k and
#: kp = 22-1030 (e.g. N = 30k, kp = 308: 2.44 s with 1024 items, 2.66 s with 2048, 2.53 s with 256).
SAMPLE_SCALE = 6.0
#: An estimated first threshold is the sample rank ``m + SIGMAS * (sqrt(m) + 1)``, where ``m`` is the
#: expected number of sample keys below the true ``kp``-th key: a miss needs a deviation of over 2.5 sigmas
#: (under 1% of the queries on random data; they are searched again). A smaller margin lets more entries
#: pass the threshold, a larger one more queries miss (measured with 1.5-3 sigmas: N = 10k, kp = 102: 0.30 s
#: with 3, 0.28 s with 2.5; N = 30k, kp = 308: 2.32 s and 2.22 s; N = 100k, kp = 1030: no difference).
SIGMAS = 2.5
#: Sample items per group when the sample is folded to its group minima (see :func:`sample_thresholds`).
FOLD = 4
#: A transposed scan gathers its passing column segments unless more than 1 in this many pass.
TRANSPOSE_SHARE = 8


def _below_by_row(keys: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(r, c, keys[r, c])`` of the entries with ``keys[r, c] < tau[r]``, sorted by row then column.

    The minima of ``SEGMENT``-wide row segments are taken first (one fast reduction); only the segments
    whose minimum is below the threshold are copied out (contiguous ``index_select``) and compared entry
    by entry.
    """
    n_rows, n_cols = keys.shape
    if n_cols % SEGMENT or not keys.is_contiguous():
        r, c = torch.nonzero(keys < tau[:, None], as_tuple=True)
        return r, c, keys[r, c]
    per_row = n_cols // SEGMENT
    segments = keys.view(n_rows * per_row, SEGMENT)
    passing = torch.nonzero((segments.amin(dim=1).view(n_rows, per_row) < tau[:, None]).view(-1)).squeeze(1)
    values = segments.index_select(0, passing)  # (P, SEGMENT)
    segment_rows = torch.div(passing, per_row, rounding_mode="floor")
    hits = torch.nonzero((values < tau.index_select(0, segment_rows)[:, None]).view(-1)).squeeze(1)
    segment = torch.div(hits, SEGMENT, rounding_mode="floor")
    rows = segment_rows.index_select(0, segment)
    cols = (passing.index_select(0, segment) - rows * per_row) * SEGMENT + hits - segment * SEGMENT
    return rows, cols, values.view(-1).index_select(0, hits)


def _below_by_column(keys: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(c, r, keys[r, c])`` of the entries with ``keys[r, c] < tau[c]``, sorted by column then row.

    The minima of ``SEGMENT``-tall column segments come from one contiguous reduction over the row-major
    block; the few passing segments are gathered with ``take``. When many pass (a loose threshold), one
    transposed copy of the block and the row-wise scan are cheaper.
    """
    n_rows, n_cols = keys.shape
    if n_rows % SEGMENT or not keys.is_contiguous():
        return _below_by_row(keys.T.contiguous(), tau)
    per_column = n_rows // SEGMENT
    minima = keys.view(per_column, SEGMENT, n_cols).amin(dim=1)  # (segments, columns)
    cols, segments = torch.nonzero((minima < tau[None, :]).T, as_tuple=True)  # sorted by column
    if cols.numel() * TRANSPOSE_SHARE > minima.numel():
        return _below_by_row(keys.T.contiguous(), tau)
    rows = segments[:, None] * SEGMENT + torch.arange(SEGMENT, device=keys.device)  # (P, SEGMENT)
    values = keys.take(rows * n_cols + cols[:, None])
    hits = torch.nonzero((values < tau.index_select(0, cols)[:, None]).view(-1)).squeeze(1)
    strip = torch.div(hits, SEGMENT, rounding_mode="floor")
    return cols.index_select(0, strip), rows.view(-1).index_select(0, hits), values.view(-1).index_select(0, hits)


def buffer_width(kp: int) -> int:
    """Slots per row: ``kp`` kept plus a slack >= ``kp`` (a dense append of <= kp fits after a compaction)."""
    return kp + max(2 * kp, 64)


class _Buffer:
    """Best candidates of ``n_rows`` queries: ``(n_rows, kp + slack)`` keys and gallery positions."""

    def __init__(self, kp: int, tau: Tensor) -> None:
        self.kp = kp
        self.width = buffer_width(kp)
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
        _add(self, rows, keys, cols.start)
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


def _new_buffer(kp: int, tau: Tensor, n_gallery: int) -> _Buffer | CompiledBuffer:
    """Compiled scans on the CPU for large searches (when numba is there), torch passes elsewhere."""
    if _compiled_buffer.available(tau.device, tau.shape[0], n_gallery):
        return CompiledBuffer(kp, tau, buffer_width(kp))
    return _Buffer(kp, tau)


def _add(buffer: _Buffer | CompiledBuffer, rows: slice, keys: Tensor, col0: int) -> None:
    if buffer.filling(rows):
        buffer.add_dense(rows, keys, col0)
    else:
        buffer.add_filtered(rows, keys, col0)


class BlockMemory:
    """One output buffer reused by every key block of a search: a block is valid until the next is made
    (no new 8 MB block for every product)."""

    def __init__(self) -> None:
        self.memory: Tensor | None = None

    def __call__(self, n_rows: int, n_cols: int, like: Tensor) -> Tensor:
        size = n_rows * n_cols
        if self.memory is None or self.memory.numel() < size:
            self.memory = torch.empty(size, dtype=like.dtype, device=like.device)
        return self.memory[:size].view(n_rows, n_cols)


def addmm_keys(query: Tensor, gallery: Tensor, bias: Tensor, alpha: float) -> KeyFn:
    """The keys ``bias[g] + alpha * <q, g>`` of query rows against gallery columns (a slice or positions),
    each block valid until the next."""
    memory = BlockMemory()

    def key_fn(rows: slice, cols: slice | Tensor) -> Tensor:
        left, right = query[rows], gallery[cols]
        out = memory(left.shape[0], right.shape[0], left)
        return torch.addmm(bias[None, cols], left, right.T, alpha=alpha, out=out)

    return key_fn


def product_keys(left: Tensor, right: Tensor) -> KeyFn:
    """The keys ``<left_i, right_j>`` of row blocks against column blocks, each valid until the next."""
    memory = BlockMemory()

    def key_fn(rows: slice, cols: slice | Tensor) -> Tensor:
        a, b = left[rows], right[cols]
        return torch.mm(a, b.T, out=memory(a.shape[0], b.shape[0], a))

    return key_fn


def sample_size(n_gallery: int, kp: int) -> int:
    """Items of the strided sample of :func:`sample_thresholds` (the whole gallery: no threshold)."""
    groups = max(round(SAMPLE_SCALE * (kp * n_gallery) ** (1 / 3) / FOLD), kp)  # whole groups of FOLD items
    return min(n_gallery, FOLD * groups)


def sample_thresholds(
    n_query: int, n_gallery: int, key_fn: KeyFn, kp: int, mask_fn: MaskFn, rows_per_chunk: int, estimate: bool
) -> tuple[Tensor, Tensor]:
    """A first threshold for each query from a strided sample of the gallery (+inf: none), and whether
    the query is *crowded*: more than twice the chosen rank of its sample keys lie below its threshold
    (ties at the threshold, e.g. many duplicates), so far more than ``kp`` items may pass it.

    The ``kp``-th key over a subset is never below the ``kp``-th key over the whole gallery, so it is a
    valid first threshold. With ``estimate`` the sample rank is lowered to ``m + SIGMAS * (sqrt(m) + 1)``,
    ``m = kp * sample / gallery`` (the expected count of sample keys below the true ``kp``-th key), which
    discards far more of every block; a query where it is too low ends with fewer than ``kp`` candidates
    and a floor that says so. Thresholds are inflated slightly (relative to the row's largest finite sample
    key, so that no threshold exceeds the scale of the row's keys) so that rounding differences between
    block shapes cannot drop an item at the bound.

    When the rank is small against the sample, the sample is first folded into ``n_sample / FOLD`` groups
    of items far apart in the gallery and the rank is taken over the group minima (a quarter of the
    selection work). The ``rank``-th smallest group minimum is never below the ``rank``-th smallest key,
    so the threshold stays valid; it is a little higher where two of the best sample keys share a group.
    """
    n_sample = sample_size(n_gallery, kp)
    tau = torch.full((n_query,), float("inf"))
    crowded = torch.zeros(n_query, dtype=torch.bool)
    if n_sample <= kp or n_sample == n_gallery:
        return tau, crowded
    rank = kp
    if estimate:
        expected = kp * n_sample / n_gallery
        rank = min(kp, math.ceil(expected + SIGMAS * (math.sqrt(expected) + 1.0)))
    sample = torch.arange(n_sample) * n_gallery // n_sample
    fold = n_sample % FOLD == 0 and n_sample >= FOLD * FOLD * rank
    for q0 in range(0, n_query, rows_per_chunk):
        rows = slice(q0, min(q0 + rows_per_chunk, n_query))
        keys = key_fn(rows, sample)
        sample, tau, crowded = sample.to(keys.device), tau.to(keys.device), crowded.to(keys.device)
        mask_fn(keys, rows, sample)
        if fold:
            keys = keys.view(keys.shape[0], FOLD, -1).amin(dim=1)
        tau[rows] = torch.topk(keys, rank, dim=1, largest=False, sorted=False).values.amax(dim=1)
        largest = torch.where(keys < float("inf"), keys.abs(), 0.0).amax(dim=1)
        tau[rows] += (tau[rows].abs() + largest) * 1e-5
        crowded[rows] = (keys < tau[rows, None]).sum(dim=1) > 2 * rank
    return tau, crowded


def stream_topk(
    query: Tensor,
    gallery: Tensor,
    bias: Tensor,
    alpha: float,
    kp: int,
    mask_fn: MaskFn,
    *,
    rows_per_chunk: int,
    cols_per_block: int,
    estimate: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``kp`` smallest keys ``bias[g] + alpha * <q, g>`` of every query against a gallery.

    Args:
        query: ``(Q, D)`` prepared query rows (float32).
        gallery: ``(G, D)`` prepared gallery rows.
        bias: ``(G,)`` per-item bias of the key.
        alpha: the factor of the inner product (-2 for L2, -1 for dot/cosine).
        kp: number of candidates to keep.
        mask_fn: sets excluded pairs of a block to +inf; called with the block's query rows and gallery
            columns (slices, or an index tensor of gallery columns for the sample pre-pass).
        rows_per_chunk, cols_per_block: block sides.
        estimate: start from estimated thresholds (see :func:`sample_thresholds`).

    Returns:
        ``(keys (Q, kp), positions (Q, kp), floors (Q,))``: +inf keys where a query has fewer candidates;
        every key of a query that is not among its candidates is >= its floor.
    """

    key_fn = addmm_keys(query, gallery, bias, alpha)
    n_query, n_gallery = query.shape[0], gallery.shape[0]
    tau, _ = sample_thresholds(n_query, n_gallery, key_fn, kp, mask_fn, rows_per_chunk, estimate)
    buffer = _new_buffer(kp, tau, n_gallery)
    for q0 in range(0, n_query, rows_per_chunk):
        rows = slice(q0, min(q0 + rows_per_chunk, n_query))
        for g0 in range(0, n_gallery, cols_per_block):
            cols = slice(g0, min(g0 + cols_per_block, n_gallery))
            keys = key_fn(rows, cols)
            mask_fn(keys, rows, cols)
            _add(buffer, rows, keys, g0)
    return buffer.result()


def stream_topk_symmetric(
    key_fn: KeyFn,
    n: int,
    kp: int,
    mask_fn: MaskFn,
    *,
    rows_per_chunk: int,
    cols_per_block: int,
    estimate: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """As :func:`stream_topk` for a set of ``n`` items searched against itself, each distance block computed once.

    ``key_fn(rows, cols)`` gives the keys of a block and must be symmetric up to rounding, e.g. half the
    squared L2 distance or ``-<x_i, x_j>``: a block's entry serves as the key of its row query and of its
    column query. ``mask_fn`` must be symmetric (same sequence, other group) and mask the diagonal of the
    diagonal blocks (the query itself).
    """
    tau, _ = sample_thresholds(n, n, key_fn, kp, mask_fn, rows_per_chunk, estimate)
    buffer = _new_buffer(kp, tau, n)
    for i0 in range(0, n, rows_per_chunk):
        rows = slice(i0, min(i0 + rows_per_chunk, n))
        diagonal = key_fn(rows, rows)
        mask_fn(diagonal, rows, rows)
        _add(buffer, rows, diagonal, i0)
        for j0 in range(rows.stop, n, cols_per_block):
            cols = slice(j0, min(j0 + cols_per_block, n))
            keys = key_fn(rows, cols)
            mask_fn(keys, rows, cols)
            buffer.add_both(rows, keys, cols)
    return buffer.result()
