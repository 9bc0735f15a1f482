"""Streaming top-k selection over a blocked key matrix: the torch backend's stage 1 of ``knn``.

Each query keeps a running buffer of candidates and a threshold ``tau``: every key of the query that
is not in the buffer is >= ``tau``. A new block of keys is compared once against ``tau`` and only the
few entries below it are extracted and appended; the buffer is cut back to its best ``kp`` by one
``topk`` when it fills up, which lowers ``tau`` to the ``kp``-th key. While ``tau`` is +inf (no
threshold yet) a query's block rows go through a dense ``topk``. For large searches on the CPU the same
buffer is a ``compiled.buffer.CompiledBuffer``, whose compiled
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

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.compiled.buffer import CompiledBuffer
from torchmetrics_retrieval.functional._search.half_rows import BlockRows, StageRows
from torchmetrics_retrieval.functional._search.torch_buffer import TorchBuffer

__all__ = [
    "BlockMemory",
    "addmm_keys",
    "product_keys",
    "sample_size",
    "sample_thresholds",
    "stream_topk",
    "stream_topk_symmetric",
]

#: Masks the excluded pairs of a block in place: (keys, query rows, gallery columns).
MaskFn = Callable[[Tensor, slice, "slice | Tensor"], object]
#: Keys of a block of query rows against gallery columns (a slice, or an index tensor for the sample).
KeyFn = Callable[[slice, "slice | Tensor"], Tensor]


def _new_buffer(kp: int, tau: Tensor, n_gallery: int, compiled: bool | None = None) -> TorchBuffer | CompiledBuffer:
    """Compiled scans on the CPU for large searches (when numba is there), torch passes elsewhere; ``compiled``
    (None: decided by the size of this search) when the caller decided it for a larger search."""
    if plan.use_compiled(tau.device, tau.shape[0], n_gallery) if compiled is None else compiled:
        return CompiledBuffer(kp, tau, plan.buffer_width(kp))
    return TorchBuffer(kp, tau)


def _add(buffer: TorchBuffer | CompiledBuffer, rows: slice, keys: Tensor, col0: int) -> None:
    if buffer.filling(rows):
        buffer.add_dense(rows, keys, col0)
    else:
        buffer.add_filtered(rows, keys, col0)


class BlockMemory:
    """One output buffer reused by every key block of a search: a block is valid until the next is made
    (no new 8 MB block for every product). ``aligned``: each row of a block starts a multiple of
    ``plan.ALIGNED_COLUMNS`` entries after the last (a block of another width is then a strided view), for the
    consumers that read strided blocks.

    Example:
        >>> memory = BlockMemory(aligned=True)
        >>> memory(2, 5, torch.zeros(1)).stride(), memory(2, 32, torch.zeros(1)).is_contiguous()
        ((16, 1), True)
    """

    def __init__(self, aligned: bool = False) -> None:
        self.memory: Tensor | None = None
        self.aligned = aligned

    def __call__(self, n_rows: int, n_cols: int, like: Tensor) -> Tensor:
        stride = -(-n_cols // plan.ALIGNED_COLUMNS) * plan.ALIGNED_COLUMNS if self.aligned else n_cols
        size = n_rows * stride
        if self.memory is None or self.memory.numel() < size:
            self.memory = torch.empty(size, dtype=like.dtype, device=like.device)
        return self.memory[:size].view(n_rows, stride)[:, :n_cols]


def addmm_keys(query: StageRows, gallery: StageRows, bias: Tensor, alpha: float, aligned: bool = False) -> KeyFn:
    """The keys ``bias[g] + alpha * <q, g>`` of query rows against gallery columns (a slice or positions),
    each block valid until the next (``aligned``: in rows of an aligned stride, ``BlockMemory``). Rows stored in
    half precision (``half_rows.BlockRows``) are made float32 block by block as the products need them
    (``query`` and ``gallery`` must then be distinct objects: each block lives in its object's buffer)."""
    memory = BlockMemory(aligned)

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
    groups = max(
        round(plan.SAMPLE_SCALE * (kp * n_gallery) ** (1 / 3) / plan.FOLD), kp
    )  # whole groups of plan.FOLD items
    return min(n_gallery, plan.FOLD * groups)


def sample_thresholds(
    n_query: int, n_gallery: int, key_fn: KeyFn, kp: int, mask_fn: MaskFn, rows_per_chunk: int, estimate: bool
) -> tuple[Tensor, Tensor]:
    """A first threshold for each query from a strided sample of the gallery (+inf: none), and whether
    the query is *crowded*: more than twice the chosen rank of its sample keys lie below its threshold
    (ties at the threshold, e.g. many duplicates), so far more than ``kp`` items may pass it.

    The ``kp``-th key over a subset is never below the ``kp``-th key over the whole gallery, so it is a
    valid first threshold. With ``estimate`` the sample rank is lowered to ``m + plan.SIGMAS * (sqrt(m) + 1)``,
    ``m = kp * sample / gallery`` (the expected count of sample keys below the true ``kp``-th key), which
    discards far more of every block; a query where it is too low ends with fewer than ``kp`` candidates
    and a floor that says so. Thresholds are inflated slightly (relative to the row's largest finite sample
    key, so that no threshold exceeds the scale of the row's keys) so that rounding differences between
    block shapes cannot drop an item at the bound.

    When the rank is small against the sample, the sample is first folded into ``n_sample / plan.FOLD`` groups
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
        rank = min(kp, math.ceil(expected + plan.SIGMAS * (math.sqrt(expected) + 1.0)))
    sample = torch.arange(n_sample) * n_gallery // n_sample
    fold = n_sample % plan.FOLD == 0 and n_sample >= plan.FOLD * plan.FOLD * rank
    for q0 in range(0, n_query, rows_per_chunk):
        rows = slice(q0, min(q0 + rows_per_chunk, n_query))
        keys = key_fn(rows, sample)
        sample, tau, crowded = sample.to(keys.device), tau.to(keys.device), crowded.to(keys.device)
        mask_fn(keys, rows, sample)
        if fold:
            keys = keys.reshape(keys.shape[0], plan.FOLD, -1).amin(dim=1)
        tau[rows] = torch.topk(keys, rank, dim=1, largest=False, sorted=False).values.amax(dim=1)
        largest = torch.where(keys < float("inf"), keys.abs(), 0.0).amax(dim=1)
        tau[rows] += (tau[rows].abs() + largest) * 1e-5
        crowded[rows] = (keys < tau[rows, None]).sum(dim=1) > 2 * rank
    return tau, crowded


def _first_thresholds(
    n_query: int,
    n_gallery: int,
    key_fn: KeyFn,
    kp: int,
    mask_fn: MaskFn,
    rows_per_chunk: int,
    estimate: bool,
    ceiling: Tensor | None,
) -> Tensor:
    """The thresholds a search starts from: the sample's (:func:`sample_thresholds`), lowered to ``ceiling``."""
    if ceiling is not None and bool(torch.isfinite(ceiling).all()):
        return ceiling.clone()
    tau, _ = sample_thresholds(n_query, n_gallery, key_fn, kp, mask_fn, rows_per_chunk, estimate)
    return tau if ceiling is None else torch.minimum(tau, ceiling.to(tau))


def stream_topk(
    query: StageRows,
    gallery: StageRows,
    bias: Tensor,
    alpha: float,
    kp: int,
    mask_fn: MaskFn,
    *,
    rows_per_chunk: int,
    cols_per_block: int,
    estimate: bool = False,
    compiled: bool | None = None,
    ceiling: Tensor | None = None,
    key_fn: KeyFn | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``kp`` smallest keys ``bias[g] + alpha * <q, g>`` of every query against a gallery.

    Args:
        query: ``(Q, D)`` prepared query rows (float32, or half rows made float32 per block).
        gallery: ``(G, D)`` prepared gallery rows (likewise).
        bias: ``(G,)`` per-item bias of the key.
        alpha: the factor of the inner product (-2 for L2, -1 for dot/cosine).
        kp: number of candidates to keep.
        mask_fn: sets excluded pairs of a block to +inf; called with the block's query rows and gallery
            columns (slices, or an index tensor of gallery columns for the sample pre-pass).
        rows_per_chunk, cols_per_block: block sides.
        estimate: start from estimated thresholds (see :func:`sample_thresholds`).
        compiled: scan with the compiled kernels (None: when these queries alone are a large search); a
            search taken in groups of queries decides it once for all of them.
        ceiling: ``(Q,)`` float32 first thresholds known beforehand (+inf: none), e.g. from the caps of a sharded
            search; the sample is taken only when some query has none.
        key_fn: the keys of a block (default :func:`addmm_keys` of the arguments), e.g. from bfloat16 rows.

    Returns:
        ``(keys (Q, kp), positions (Q, kp), floors (Q,))``: +inf keys where a query has fewer candidates;
        every key of a query that is not among its candidates is >= its floor.
    """

    key_fn = key_fn or addmm_keys(query, gallery, bias, alpha, aligned=True)
    n_query, n_gallery = query.shape[0], gallery.shape[0]
    tau = _first_thresholds(n_query, n_gallery, key_fn, kp, mask_fn, rows_per_chunk, estimate, ceiling)
    buffer = _new_buffer(kp, tau, n_gallery, compiled)
    # A gallery of half rows made per block serves a group of query chunks before the next block is made (made
    # once per group, not per chunk). Each chunk still meets the same blocks in the same order, and a query's
    # candidates depend on its own keys only, so the result is the same.
    group = rows_per_chunk * (plan.HALF_QUERY_CHUNKS if isinstance(gallery, BlockRows) else 1)
    for s0 in range(0, n_query, group):
        chunks = [
            slice(q0, min(q0 + rows_per_chunk, n_query)) for q0 in range(s0, min(s0 + group, n_query), rows_per_chunk)
        ]
        if isinstance(query, BlockRows) and query is not gallery:  # the group's rows made once; chunks are views
            query[s0 : chunks[-1].stop]
        for g0 in range(0, n_gallery, cols_per_block):
            cols = slice(g0, min(g0 + cols_per_block, n_gallery))
            for rows in chunks:
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
    split: int | None = None,
    ceiling: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """As :func:`stream_topk` for a set of ``n`` items searched against itself, each distance block computed once.

    ``key_fn(rows, cols)`` gives the keys of a block and must be symmetric up to rounding, e.g. half the
    squared L2 distance or ``-<x_i, x_j>``: a block's entry serves as the key of its row query and of its
    column query. ``mask_fn`` must be symmetric (same sequence, other group) and mask the diagonal of the
    diagonal blocks (the query itself). With ``split`` (a bipartite search, ``mask_fn`` masking each side
    against itself) only the rectangle of rows ``[0, split)`` and columns ``[split, n)`` is computed.
    ``ceiling`` as in :func:`stream_topk`, in the keys of ``key_fn``.
    """
    tau = _first_thresholds(n, n, key_fn, kp, mask_fn, rows_per_chunk, estimate, ceiling)
    buffer = _new_buffer(kp, tau, n)
    for i0 in range(0, n if split is None else split, rows_per_chunk):
        rows = slice(i0, min(i0 + rows_per_chunk, n if split is None else split))
        if split is None:
            diagonal = key_fn(rows, rows)
            mask_fn(diagonal, rows, rows)
            _add(buffer, rows, diagonal, i0)
        for j0 in range(rows.stop if split is None else split, n, cols_per_block):
            cols = slice(j0, min(j0 + cols_per_block, n))
            keys = key_fn(rows, cols)
            mask_fn(keys, rows, cols)
            buffer.add_both(rows, keys, cols)
    return buffer.result()
