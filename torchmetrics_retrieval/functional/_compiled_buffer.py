"""Per-query candidate buffers filled by compiled scans (numba): stage 1 of the torch backend on the CPU.

A block of keys is scanned entry by entry in compiled code: an entry below its query's threshold ``tau``
is appended to that query's buffer, and a full buffer is cut back to its best ``kp`` entries, which lowers
``tau`` to the ``kp``-th key. One pass over the block, no temporaries: the same running-threshold selection
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

    @jit
    def scan_rows(block, row0, col0, keys, items, fill, tau, kp):
        width = keys.shape[1]
        for a in range(block.shape[0]):
            row, line = row0 + a, block[a]
            threshold, slot = tau[row], fill[row]
            for b in range(block.shape[1]):
                if line[b] < threshold:
                    if slot == width:  # full: keep the best kp, lower the threshold
                        fill[row] = slot
                        compact(keys, items, fill, tau, row, kp)
                        threshold, slot = tau[row], kp
                        if not line[b] < threshold:
                            continue
                    keys[row, slot] = line[b]
                    items[row, slot] = col0 + b
                    slot += 1
            fill[row] = slot

    @jit
    def scan_columns(block, row0, col0, keys, items, fill, tau, kp):
        width = keys.shape[1]
        thresholds = tau[col0 : col0 + block.shape[1]]  # a view: follows the compactions
        for a in range(block.shape[0]):
            line = block[a]
            for b in range(block.shape[1]):
                if line[b] < thresholds[b]:
                    row = col0 + b
                    if fill[row] == width:
                        compact(keys, items, fill, tau, row, kp)
                        if not line[b] < thresholds[b]:
                            continue
                    keys[row, fill[row]] = line[b]
                    items[row, fill[row]] = row0 + a
                    fill[row] += 1

    @jit
    def finish(keys, items, fill, tau, kp):
        for row in range(keys.shape[0]):
            if fill[row] > kp:
                compact(keys, items, fill, tau, row, kp)

    _KERNELS.update(scan_rows=scan_rows, scan_columns=scan_columns, finish=finish)
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
        self.kernels = _kernels()

    def filling(self, rows: slice) -> bool:
        return False

    def add_filtered(self, rows: slice, block: Tensor, col0: int) -> None:
        """Append the entries of the block (rows ``rows``, items from ``col0``) below their row's threshold."""
        state = (self.keys, self.items, self.fill, self.tau, self.kp)
        self.kernels["scan_rows"](_numpy(block), rows.start, col0, *state)

    def add_filtered_transposed(self, items: slice, block: Tensor, queries: slice) -> None:
        """Append the entries below their column query's threshold (symmetric keys: the row is the item)."""
        state = (self.keys, self.items, self.fill, self.tau, self.kp)
        self.kernels["scan_columns"](_numpy(block), items.start, queries.start, *state)

    # With a running threshold from the start, "the best kp of each row" is what the scan keeps anyway.
    add_dense = add_filtered
    add_dense_transposed = add_filtered_transposed

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(keys (R, kp), gallery positions (R, kp), floors (R,))`` as :meth:`_Buffer.result`."""
        self.kernels["finish"](self.keys, self.items, self.fill, self.tau, self.kp)
        keys = torch.from_numpy(self.keys[:, : self.kp].copy())
        return keys, torch.from_numpy(self.items[:, : self.kp]).long(), torch.from_numpy(self.tau.copy())


def _numpy(block: Tensor) -> np.ndarray:
    return block.detach().contiguous().numpy()
