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

from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._search.float_order import ordered_key
from torchmetrics_retrieval.functional._search.plan import HAS_NUMBA

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
    :func:`canonical_dots` and :func:`self_dots` (which read the stored rows, in float64 pair by pair) or
    :func:`stage_rows` (block by block); a pair's canonical dot product does not depend on which other rows are
    present, so the values are those of the copy.
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
#: The running sums of a canonical dot product (:func:`canonical_dots`).
LANES = 4
#: Pairs whose rows :func:`canonical_dots` gathers at once where the compiled kernel cannot read them as stored.
_LAZY_PAIRS = 2**13
#: Shorter lists of pairs take torch (the same values): loading the compiled kernel costs more than it saves.
_COMPILED_PAIRS = 2**12
#: Row dtypes the compiled kernel reads as stored.
_KERNEL_DTYPES = (torch.float32, torch.float64)


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
    """``<query64[rows[i]], gallery64[cols[i]]>`` in float64, each pair computed on its own, in one order.

    A pair's ``D`` products are exact float64 products (of float32 or half entries; rounded once for float64
    rows), summed into ``LANES = 4`` running sums (entry ``d`` into sum ``d % 4``, in order of ``d``) that are
    combined as ``(s0 + s1) + (s2 + s3)``. The value depends on the pair alone: not on the other pairs, the
    backend, the chunk size, the number of threads, nor on which side is the query (the products commute).

    On the CPU the compiled kernel (``compiled.dot_kernels``) reads the rows as stored, float32 or float64,
    without a float64 copy; elsewhere (or for small lists, half rows, without numba) torch computes the same
    sums with the same elementwise operations, ``_LAZY_PAIRS`` pairs at a time.
    """
    n_pairs = rows.numel()
    x, y = _stored(query64), _stored(gallery64)
    out = torch.empty(n_pairs, dtype=torch.float64, device=x.device)
    if not n_pairs:
        return out
    if _compiled(x, y, n_pairs):
        _kernel_dots(x, y, rows, cols, out)
        return out
    for start in range(0, n_pairs, _LAZY_PAIRS):
        block = slice(start, start + _LAZY_PAIRS)
        left, right = _readable(x[rows[block]]), _readable(y[cols[block]])
        if _compiled(left, right, n_pairs):  # half rows: the block's rows in float32 (exact)
            at = torch.arange(left.shape[0], device=left.device)
            _kernel_dots(left, right, at, at, out[block])
        else:
            out[block] = _summed(left.to(torch.float64) * right.to(torch.float64))
    return out


def _kernel_dots(x: Tensor, y: Tensor, rows: Tensor, cols: Tensor, out: Tensor) -> None:
    """:func:`canonical_dots` by the compiled kernel into ``out``, the rows read as they are (strided too)."""
    from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads
    from torchmetrics_retrieval.functional._search.compiled.dot_kernels import pair_dots

    pair_dots(*(t.detach().numpy() for t in (x, y, rows, cols, out)), kernel_threads())


def _readable(rows: Tensor) -> Tensor:
    """Rows the compiled kernel reads: half rows in float32 (exact), float32 and float64 rows as they are."""
    return rows if rows.dtype in _KERNEL_DTYPES else rows.to(torch.float32)


def _stored(rows64: Rows64) -> Tensor:
    """The rows as stored: a float64 tensor, or the tensor that :class:`Float64Rows` reads on demand."""
    return rows64.x if isinstance(rows64, Float64Rows) else rows64


def _compiled(x: Tensor, y: Tensor, n_pairs: int) -> bool:
    """Whether the compiled kernel serves a list of ``n_pairs`` pairs of these rows (the same values either way)."""
    plain = x.dtype in _KERNEL_DTYPES and y.dtype in _KERNEL_DTYPES
    return HAS_NUMBA and x.device.type == "cpu" and plain and n_pairs >= _COMPILED_PAIRS


def _summed(products: Tensor) -> Tensor:
    """Each row's products summed in the canonical order (:func:`canonical_dots`), by elementwise float64 adds."""
    n, dim = products.shape
    full = dim - dim % LANES
    sums = torch.zeros((n, LANES), dtype=torch.float64, device=products.device)
    for start in range(0, full, LANES):  # D / 4 adds of (n, 4) columns: a loop over entries, not over pairs
        sums += products[:, start : start + LANES]
    sums[:, : dim - full] += products[:, full:]
    return (sums[:, 0] + sums[:, 1]) + (sums[:, 2] + sums[:, 3])


def largest_norm(rows: Tensor) -> float:
    """The largest L2 norm of the rows, from float64 (0 without rows)."""
    return float(rows.to(torch.float64).norm(dim=1).max()) if rows.shape[0] else 0.0


def self_dots(x64: Rows64) -> Tensor:
    """``<x_i, x_i>`` by :func:`canonical_dots` (so exact duplicates get distance 0)."""
    idx = torch.arange(x64.shape[0], device=x64.device)
    return canonical_dots(idx, idx, x64, x64)


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
