"""Rows, inner products and distances: the arithmetic every stage shares.

* *Stage rows* (:func:`stage_rows`): the float32 rows and squared norms a stage-1 search multiplies, each entry
  the rounding of its float64 value (so the certificate's rounding bound holds).
* *Canonical* values (:func:`canonical_dots`, :func:`distances_from_dots`): every reported distance is computed
  in float64, pair by pair, by one formula, so it does not depend on the backend, the block or the order of
  the queries. Exact duplicates get distance exactly 0.
* The *order key* (:func:`order_key`): float32 distances and gallery positions as one int64 that sorts like
  (distance, position). The compiled kernels (``compiled/kernels.py``) encode keys by the same bit map.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._search.float_order import ordered_key

#: Float64 temporaries of :func:`stage_rows` (one block of rows at a time).
_STAGE_BLOCK_BYTES = 32 * 2**20

__all__ = [
    "Float64Rows",
    "Rows64",
    "block_distances",
    "canonical_dots",
    "compute_dtype",
    "distances_from_dots",
    "exact_block",
    "largest_norm",
    "order_key",
    "prepare",
    "self_dots",
    "stage_rows",
]


def compute_dtype(x: Tensor) -> torch.dtype:
    """Float32 at least: half-precision inputs are computed in float32, float64 stays float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class Float64Rows:
    """The rows of a float32 (or half) tensor read as float64 when indexed: the exact values of a float64 copy
    (every float32 is a float64) without holding one, for a set too large to copy whole.

    Every reader of a problem's float64 rows indexes them (``rows64[index]``) or passes them to
    :func:`canonical_dots`, :func:`self_dots` and :func:`stage_rows`, which read them block by block; a pair's
    canonical dot product does not depend on which other rows are present, so the values are those of the copy.
    """

    def __init__(self, x: Tensor) -> None:
        self.x = x

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def device(self) -> torch.device:
        return self.x.device

    def __getitem__(self, index: Tensor | slice) -> Tensor:
        return self.x[index].to(torch.float64)


#: Float64 rows (a tensor, or :class:`Float64Rows` read on demand).
Rows64 = Tensor | Float64Rows
#: Pairs whose rows are read at once from :class:`Float64Rows` in :func:`canonical_dots` (a few MiB of rows).
_LAZY_PAIRS = 2**13
#: Float64 rows of :func:`self_dots` read at once from :class:`Float64Rows`: a few large blocks (each product is a
#: parallel region, whose start costs more than a smaller block saves when the cores are shared).
_SELF_DOTS_BYTES = 48 * 2**20


def prepare(x: Tensor, distance: str, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor | None]:
    """Rows in ``dtype`` (default: the compute dtype; unit rows for cosine) and their squared norms (L2 only)."""
    x = x.to(dtype or compute_dtype(x))
    if distance == "cosine":
        return torch.nn.functional.normalize(x, dim=1), None
    if distance in ("euclidean", "sqeuclidean"):
        return x, (x * x).sum(dim=1)
    return x, None


def stage_rows(x64: Rows64, sq64: Tensor, distance: str, compiled: bool = False) -> tuple[Tensor, Tensor | None]:
    """Float32 rows of a stage-1 search and their squared norms (L2 only), each entry the rounding of its
    float64 value: cosine rows are normalised in float64, the norms are the canonical ones. So every
    stage input is within one rounding of its exact value, as ``certify.key_tolerance`` assumes.

    ``compiled`` (CPU): cosine rows by the numba kernel ``compiled.row_kernels.unit_rows``, the same values bit for
    bit without a float64 temporary of every entry (a search large enough for the compiled kernels decides it).
    """
    if distance == "cosine":  # in row blocks: a float64 quotient of every row would double the memory
        rows = torch.empty(x64.shape, dtype=torch.float32, device=x64.device)
        norms = ieee_sqrt(sq64)
        if compiled and x64.device.type == "cpu":
            _unit_rows(x64, norms, rows)
            return rows, None
        step = max(1, _STAGE_BLOCK_BYTES // (8 * max(1, x64.shape[1])))
        for start in range(0, x64.shape[0], step):
            block = slice(start, start + step)
            rows[block] = x64[block] / norms[block, None]  # rounded to float32 as ``.to`` rounds
        return rows, None
    if isinstance(x64, Float64Rows):  # float32 rows are their own rounding; half rows are rounded exactly
        rows = x64.x.to(torch.float32)
    else:
        rows = x64.to(torch.float32)
    return rows, sq64.to(torch.float32) if distance in ("euclidean", "sqeuclidean") else None


def _unit_rows(x64: Rows64, norms: Tensor, out: Tensor) -> None:
    """``out = float32(x64 / norms[:, None])`` by the compiled kernel: float32 and float64 rows as they are, half
    rows made float32 (exactly) block by block."""
    from torchmetrics_retrieval.functional._search.compiled import row_kernels
    from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

    x = x64.x if isinstance(x64, Float64Rows) else x64
    n_threads = kernel_threads()
    if x.dtype in (torch.float32, torch.float64):
        row_kernels.unit_rows(x.contiguous().numpy(), norms.numpy(), out.numpy(), n_threads)
        return
    step = max(1, _STAGE_BLOCK_BYTES // (4 * max(1, x.shape[1])))
    for start in range(0, x.shape[0], step):
        block = slice(start, start + step)
        row_kernels.unit_rows(x[block].to(torch.float32).numpy(), norms[block].numpy(), out[block].numpy(), n_threads)


def block_distances(q: Tensor, q_sq: Tensor | None, g: Tensor, g_sq: Tensor | None, distance: str) -> Tensor:
    """Distances of prepared rows by matmul expansion, ``(rows, cols)``."""
    if distance in ("cosine", "dot"):
        scores = q @ g.T
        return 1.0 - scores if distance == "cosine" else scores.neg_()
    assert q_sq is not None and g_sq is not None
    d = torch.addmm(q_sq[:, None] + g_sq[None, :], q, g.T, alpha=-2.0).clamp_(min=0.0)
    return ieee_sqrt(d, out=d) if distance == "euclidean" else d


def canonical_dots(rows: Tensor, cols: Tensor, query64: Rows64, gallery64: Rows64) -> Tensor:
    """``<query64[rows[i]], gallery64[cols[i]]>`` in float64, each pair computed on its own.

    A sampled dense-dense product (one dot product per listed pair, no gathered copies): the value of a
    pair does not depend on which other pairs are computed with it, so it is the same for every backend,
    chunk size and query order. It is faster than a compiled per-pair loop (both are limited by fetching the
    rows of random items). The pairs are grouped by the side with more rows, so that the rows fetched at
    random come from the smaller side, which stays in cache. Both groupings give the same values bit for bit:
    the kernel sums the elementwise products of the two rows in the same order either way.
    """
    n_pairs = rows.numel()
    if n_pairs == 0:
        return torch.zeros(0, dtype=torch.float64, device=query64.device)
    if isinstance(query64, Float64Rows) or isinstance(gallery64, Float64Rows):
        return _lazy_dots(rows, cols, query64, gallery64)
    if gallery64.shape[0] > query64.shape[0]:
        rows, cols, query64, gallery64 = cols, rows, gallery64, query64
    # CSR needs the pairs grouped by row (columns within a row may come in any order; each value is its
    # own dot product). Pairs from ``nonzero`` are already row-major: sort only when they are not.
    in_order = bool((rows[1:] >= rows[:-1]).all())
    if in_order:
        order = torch.arange(n_pairs, device=rows.device)
    else:  # (int32 keys: half the bytes for the sort to move than int64 ones)
        order = torch.sort(rows.int() if query64.shape[0] < 2**31 else rows, stable=True).indices
    r, c = (rows, cols) if in_order else (rows[order], cols[order])
    crow = torch.zeros(query64.shape[0] + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=query64.shape[0]), 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        pattern = torch.sparse_csr_tensor(
            crow,
            c,
            torch.zeros(n_pairs, dtype=torch.float64, device=rows.device),
            size=(query64.shape[0], gallery64.shape[0]),
            check_invariants=False,
        )
        values = torch.sparse.sampled_addmm(pattern, query64, gallery64.T, beta=0.0).values()
    if in_order:
        return values
    out = torch.empty_like(values)
    out[order] = values
    return out


def _lazy_dots(rows: Tensor, cols: Tensor, query64: Rows64, gallery64: Rows64) -> Tensor:
    """:func:`canonical_dots` of rows read on demand: the pairs in blocks (by row), each block's rows made float64
    once and its columns pair by pair (the values do not depend on the rows around them), in buffers kept for the
    next block. The columns are not de-duplicated: a block's are mostly distinct (candidates of different
    queries), and the sort that would find the repeats cost more than the rows it saves."""
    out = torch.empty(rows.numel(), dtype=torch.float64, device=rows.device)
    n_pairs = rows.numel()
    # pairs listed by ``nonzero`` (the usual callers) are already grouped by row: blocks are then slices
    in_order = bool((rows[1:] >= rows[:-1]).all())
    blocks = [slice(s, s + _LAZY_PAIRS) for s in range(0, n_pairs, _LAZY_PAIRS)] if in_order else None
    query_rows, gallery_rows = _Gathered(query64), _Gathered(gallery64)
    every = torch.arange(min(_LAZY_PAIRS, n_pairs), device=rows.device)
    for block in blocks or torch.argsort(rows, stable=True).split(_LAZY_PAIRS):
        used_rows, local_rows = torch.unique_consecutive(rows[block], return_inverse=True)
        local_cols = every[: local_rows.numel()]
        out[block] = canonical_dots(local_rows, local_cols, query_rows(used_rows), gallery_rows(cols[block]))
    return out


class _Gathered:
    """Float64 rows of a set gathered block after block into the same buffers: a new float64 block per block of
    pairs cost more in page faults than the products. The buffers grow to the largest block asked for (a block's
    distinct query rows are often a small share of its pairs)."""

    def __init__(self, x64: Rows64) -> None:
        self.x64 = x64
        self.rows64: Tensor | None = None
        self.rows: Tensor | None = None

    def __call__(self, index: Tensor) -> Tensor:
        """``x64[index]``, valid until the next call."""
        n, dim, device = index.numel(), self.x64.shape[1], self.x64.device
        if self.rows64 is None or self.rows64.shape[0] < n:
            self.rows64 = torch.empty((n, dim), dtype=torch.float64, device=device)
            if isinstance(self.x64, Float64Rows):
                self.rows = torch.empty((n, dim), dtype=self.x64.x.dtype, device=device)
        if isinstance(self.x64, Float64Rows):
            assert self.rows is not None
            return self.rows64[:n].copy_(torch.index_select(self.x64.x, 0, index, out=self.rows[:n]))
        return torch.index_select(self.x64, 0, index, out=self.rows64[:n])


def largest_norm(rows: Tensor) -> float:
    """The largest L2 norm of the rows, from float64 (0 without rows)."""
    return float(rows.to(torch.float64).norm(dim=1).max()) if rows.shape[0] else 0.0


def self_dots(x64: Rows64) -> Tensor:
    """``<x_i, x_i>`` by the same kernel as :func:`canonical_dots` (so exact duplicates get distance 0)."""
    if isinstance(x64, Float64Rows):
        return _lazy_self_dots(x64)
    idx = torch.arange(x64.shape[0], device=x64.device)
    return canonical_dots(idx, idx, x64, x64)


def _lazy_self_dots(x64: Float64Rows) -> Tensor:
    """:func:`self_dots` of rows read on demand: block by block, each block's float64 rows written into one buffer,
    mapped once (a new float64 block per block cost more in page faults than the products). A row's value does not
    depend on the rows computed with it."""
    n, dim, device = x64.shape[0], x64.shape[1], x64.device
    step = max(1, _SELF_DOTS_BYTES // (8 * max(1, dim)))
    out = torch.empty(n, dtype=torch.float64, device=device)
    buffer = torch.empty((min(step, n), dim), dtype=torch.float64, device=device)
    idx = torch.arange(buffer.shape[0], device=device)
    for start in range(0, n, step):
        block = x64.x[start : start + step]
        rows, at = buffer[: block.shape[0]].copy_(block), idx[: block.shape[0]]
        out[start : start + block.shape[0]] = canonical_dots(at, at, rows, rows)
    return out


def distances_from_dots(
    dots: Tensor, q_sq: Tensor, g_sq: Tensor, distance: str, direct_sq: Callable[[tuple[Tensor, ...]], Tensor]
) -> Tensor:
    """The canonical float64 distance from canonical inner products (pairs or a block, broadcast).

    ``dot``: ``-<q,g>``; ``cosine``: ``1 - <q,g> / sqrt(<q,q><g,g>)``; ``sqeuclidean``:
    ``<q,q> + <g,g> - 2<q,g>`` (clamped at 0), or ``direct_sq`` (``sum((q - g)^2)`` of the entries at the
    given indices) where that expansion cancels badly (near-duplicates); ``euclidean``: its square root.
    Exact duplicates get exactly 0.
    """
    if distance == "dot":
        return -dots
    if distance == "cosine":
        return 1.0 - dots / ieee_sqrt(q_sq * g_sq)
    scale = q_sq + g_sq
    squared = (scale - 2.0 * dots).clamp_(min=0.0)
    close = torch.nonzero(squared < scale * 2.0**-10, as_tuple=True)
    if close[0].numel():
        squared[close] = direct_sq(close)
    return ieee_sqrt(squared, out=squared) if distance == "euclidean" else squared


def exact_block(q64: Tensor, q_sq: Tensor, g64: Tensor, g_sq: Tensor, distance: str) -> Tensor:
    """Canonical float64 distances of a block (the formula :func:`knn` reports)."""

    def direct_sq(close: tuple[Tensor, ...]) -> Tensor:
        diff = q64[close[0]] - g64[close[1]]
        return (diff * diff).sum(dim=1)

    return distances_from_dots(q64 @ g64.T, q_sq[:, None], g_sq[None, :], distance, direct_sq)


def order_key(distances: Tensor, positions: Tensor) -> Tensor:
    """Int64 keys that sort like (distance, position): the float32 bits of the distance, mapped to a signed
    integer monotone in the float value (+inf last, -0.0 equal to +0.0), above the position (< 2**31)."""
    bits = distances.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return ordered_key(bits) * 2**32 + positions
