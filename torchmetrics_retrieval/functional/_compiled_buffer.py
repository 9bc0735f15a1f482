"""Per-query candidate buffers filled by compiled scans (numba): stage 1 of the torch backend on the CPU.

A block of keys is scanned in compiled code: an entry below its query's threshold ``tau`` is appended to
that query's buffer, and a full buffer is cut back to its best ``kp`` entries, which lowers ``tau`` to the
``kp``-th key. A block of symmetric keys serves its row and its column queries in the same pass. At the end
every row is radix-sorted by (key, position) and cut to ``kp``. No temporaries: the same running-threshold selection
as :class:`~torchmetrics_retrieval.functional._stream_topk._Buffer`, which needs several torch passes
(compare, nonzero, gather, topk) per block and costs more than the matrix product at large ``kp``.

The block's keys come from torch (a matrix product on the CPU); numba compiles the scans on first use and
caches them on disk. Without numba, off the CPU or for small searches, the torch buffer is used.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["CompiledBuffer", "available", "cached_njit"]

#: numba is a dependency, but the torch buffer still works without it; it is imported on first use only.
HAS_NUMBA = importlib.util.find_spec("numba") is not None


#: Smallest search (query x gallery pairs) that takes the compiled kernels: below it, loading them (about
#: 1 s per process from numba's on-disk cache, about 6 s to compile on first use) costs more than they save.
MIN_PAIRS = 2**26


def available(device: torch.device, n_query: int, n_gallery: int) -> bool:
    """Whether compiled kernels serve a search of ``n_query`` x ``n_gallery`` on ``device`` (positions are
    stored as int32)."""
    return HAS_NUMBA and device.type == "cpu" and n_query * n_gallery >= MIN_PAIRS and n_gallery < 2**31


def cached_njit() -> Callable[[Any], Any]:
    """numba's ``njit`` as our kernels use it: cached on disk, without the GIL."""
    import numba  # imported here: a second's worth of import for processes that never need it

    return numba.njit(cache=True, nogil=True)


def _kernels() -> dict[str, Any]:
    """The compiled kernels (defined on first use so that importing this module never compiles)."""
    if _KERNELS:
        return _KERNELS
    jit = cached_njit()

    @jit
    def encode(bits, item):
        # (float32 key bits, position < 2**31) -> a non-negative int64 code ordered like (key, position)
        bits = np.int64(bits)
        ordered = bits if bits >= 0 else -(bits & 0x7FFFFFFF)  # monotone in the float value (-0.0 -> +0.0)
        return ((ordered + 2**31) << 31) + item

    @jit
    def decode(code):
        ordered = (code >> 31) - 2**31
        return np.int32(ordered if ordered >= 0 else (-ordered) | -0x80000000), code & 0x7FFFFFFF

    @jit
    def radix_sort(codes, scratch, counts):
        # Least-significant-digit radix sort of non-negative int64 codes, 8 bits per pass; digits that are
        # the same in every code are skipped (a row's keys share their high bits).
        varying = 0
        for j in range(codes.shape[0]):
            varying |= codes[j] ^ codes[0]
        source, target, shift = codes, scratch, 0
        while shift < 64 and varying >> shift:
            if (varying >> shift) & 0xFF:
                counts[:] = 0
                for j in range(codes.shape[0]):
                    counts[(source[j] >> shift) & 0xFF] += 1
                total = 0
                for digit in range(256):
                    total, counts[digit] = total + counts[digit], total
                for j in range(codes.shape[0]):
                    digit = (source[j] >> shift) & 0xFF
                    target[counts[digit]] = source[j]
                    counts[digit] += 1
                source, target = target, source
            shift += 8
        if source is not codes:
            codes[:] = source

    @jit
    def compact(keys, items, fill, tau, row, kp):
        # The kp-th smallest key by partition, then one stable pass: every key below it, then ties with it.
        line, line_items, n = keys[row], items[row], fill[row]
        kth = np.partition(line[:n].copy(), kp - 1)[kp - 1]
        below = 0
        for j in range(n):
            below += line[j] < kth
        ties = kp - below
        kept = 0
        for j in range(n):
            value = line[j]
            if value < kth or (value == kth and ties > 0):
                ties -= value == kth
                line[kept], line_items[kept] = value, line_items[j]
                kept += 1
        line[kp:] = np.inf
        fill[row] = kp
        tau[row] = kth

    byte_ones = np.uint64(0x0101010101010101)  # bit 0 of every byte of a word
    byte_index = np.uint64(0x0001020304050607)  # (2**(8 j) * byte_index) >> 56 == j
    one, top_byte = np.uint64(1), np.uint64(56)

    @jit
    def scan(block, row0, col0, keys, items, fill, tau, kp, passing, columns):
        # One pass over each block row: a vectorised compare marks the entries below their row's threshold
        # (bit 1) and, with ``columns``, below their column's (bit 2); then only the 8-entry words with a
        # mark are visited, mark by mark (lowest set bit first). Thresholds only fall, so a mark is checked
        # again before its append. (The row and column appends are written out: a shared helper, even
        # inlined, made the scan twice as slow in numba 0.68.)
        width, n_cols = keys.shape[1], block.shape[1]
        column_tau = tau[col0 : col0 + n_cols]  # a view: follows the compactions
        words = passing.view(np.uint64)
        for a in range(block.shape[0]):
            row, line = row0 + a, block[a]
            row_tau = tau[row]
            if columns:
                for b in range(n_cols):
                    passing[b] = (line[b] < row_tau) | ((line[b] < column_tau[b]) << 1)
            else:
                for b in range(n_cols):
                    passing[b] = line[b] < row_tau
            passing[n_cols : 8 * ((n_cols + 7) // 8)] = 0
            for w in range((n_cols + 7) // 8):
                word = words[w]
                if word == 0:
                    continue
                marks = word & byte_ones
                while marks:
                    lowest = marks & (~marks + one)
                    marks ^= lowest
                    entry = 8 * w + int((lowest * byte_index) >> top_byte)
                    if fill[row] == width:  # full: keep the best kp, lower the threshold
                        compact(keys, items, fill, tau, row, kp)
                    if line[entry] < tau[row]:
                        keys[row, fill[row]] = line[entry]
                        items[row, fill[row]] = col0 + entry
                        fill[row] += 1
                marks = (word >> one) & byte_ones
                while marks:
                    lowest = marks & (~marks + one)
                    marks ^= lowest
                    entry = 8 * w + int((lowest * byte_index) >> top_byte)
                    column = col0 + entry
                    if fill[column] == width:
                        compact(keys, items, fill, tau, column, kp)
                    if line[entry] < tau[column]:
                        keys[column, fill[column]] = line[entry]
                        items[column, fill[column]] = row0 + a
                        fill[column] += 1

    @jit
    def finish(keys, items, fill, tau, kp):
        # Every row sorted by (key, position) and cut to its best kp (the kp-th key is the new threshold).
        width = keys.shape[1]
        codes, scratch, counts = np.empty(width, np.int64), np.empty(width, np.int64), np.empty(256, np.int64)
        for row in range(keys.shape[0]):
            n, bits = fill[row], keys[row].view(np.int32)
            for j in range(n):
                codes[j] = encode(bits[j], items[row, j])
            radix_sort(codes[:n], scratch[:n], counts)
            kept = min(n, kp)
            for j in range(kept):
                bits[j], items[row, j] = decode(codes[j])
            keys[row, kept:] = np.inf
            if n > kp:
                tau[row] = keys[row, kp - 1]
            fill[row] = kept

    _KERNELS.update(scan=scan, finish=finish, encode=encode, decode=decode, radix_sort=radix_sort)
    return _KERNELS


_KERNELS: dict[str, Any] = {}


class CompiledBuffer:
    """Best candidates of ``n_rows`` queries, filled by compiled scans of key blocks (CPU, float32 keys).

    The interface of :class:`~torchmetrics_retrieval.functional._stream_topk._Buffer` that the drivers use.
    ``filling`` is always False: a query without a threshold appends until its buffer is full.
    """

    def __init__(self, kp: int, tau: Tensor, width: int) -> None:
        self.kp = kp
        n_rows = tau.shape[0]
        self.keys = np.full((n_rows, width), np.inf, dtype=np.float32)
        self.items = np.zeros((n_rows, width), dtype=np.int32)
        self.fill = np.zeros(n_rows, dtype=np.int64)
        self.tau = tau.to(torch.float32).numpy().copy()
        self.passing = np.zeros(0, dtype=np.uint8)  # per-entry marks of one block row, grown on demand
        self.kernels = _kernels()

    def filling(self, rows: slice) -> bool:
        return False

    def add_filtered(self, rows: slice, block: Tensor, col0: int) -> None:
        """Append the entries of the block (rows ``rows``, items from ``col0``) below their row's threshold."""
        self._scan(rows, block, col0, columns=False)

    add_dense = add_filtered  # with a running threshold from the start, a scan keeps the best kp anyway

    def add_both(self, rows: slice, block: Tensor, cols: slice) -> None:
        """:meth:`add_filtered` for the row queries and, in the same pass, for the column queries ``cols``
        of a block of symmetric keys (the row is then the item)."""
        self._scan(rows, block, cols.start, columns=True)

    def _scan(self, rows: slice, block: Tensor, col0: int, columns: bool) -> None:
        values = block.detach().contiguous().numpy()
        if self.passing.shape[0] < values.shape[1]:
            self.passing = np.zeros(-(-values.shape[1] // 8) * 8, dtype=np.uint8)  # whole 8-byte words
        state = (self.keys, self.items, self.fill, self.tau, self.kp, self.passing, columns)
        self.kernels["scan"](values, rows.start, col0, *state)

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(keys (R, kp), gallery positions (R, kp), floors (R,))`` as :meth:`_Buffer.result`, each row
        sorted by (key, position)."""
        self.kernels["finish"](self.keys, self.items, self.fill, self.tau, self.kp)
        keys = torch.from_numpy(self.keys[:, : self.kp].copy())
        return keys, torch.from_numpy(self.items[:, : self.kp]).long(), torch.from_numpy(self.tau.copy())
