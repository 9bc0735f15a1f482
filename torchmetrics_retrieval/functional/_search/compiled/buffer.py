"""Per-query candidate buffers filled by compiled scans (numba): stage 1 of the torch backend on the CPU.

A block of keys is scanned in compiled code: an entry below its query's threshold ``tau`` is appended to
that query's buffer, and a full buffer is cut back to its best ``kp`` entries, which lowers ``tau`` to the
``kp``-th key. A block of symmetric keys serves its row and its column queries in the same pass. At the end
every row is radix-sorted by (key, position) and cut to ``kp``. No temporaries: the same running-threshold selection
as ``torch_buffer.TorchBuffer``, which needs several torch passes
(compare, nonzero, gather, topk) per block and costs more than the matrix product at large ``kp``.

The block's keys come from torch (a matrix product on the CPU); the scans are the numba kernels of
``compiled.kernels``. Without numba, off the CPU or for small searches (``plan.use_compiled``), the torch
buffer is used.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import Tensor

__all__ = ["CompiledBuffer", "kernel_threads", "load_kernels", "mapped_empty", "marks"]


def load_kernels() -> ModuleType:
    """The compiled kernels (:mod:`.kernels`, imported on first use so that importing this module never loads
    numba)."""
    from torchmetrics_retrieval.functional._search.compiled import kernels as compiled_kernels

    return compiled_kernels


def kernel_threads() -> int:
    """Threads of the compiled kernels: torch's intra-op thread count (what the user gave torch, e.g. with
    ``torch.set_num_threads``), capped by numba's pool; numba's count is set to it.

    Starting numba's OpenMP pool (its first ``set_num_threads``) resets the process's OpenMP thread count,
    which torch reads as its own: torch's count is put back, so using the kernels never changes it.
    """
    import numba

    torch_threads = torch.get_num_threads()
    n_threads = max(1, min(torch_threads, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n_threads)
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
    return n_threads


def mapped_empty(shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
    """``np.empty(shape, dtype)`` with its memory mapped now, by one write per 4 KiB page in order.

    The kernels write a buffer's rows in scattered order from every thread, and memory the process touches
    first that way (a page fault per page, taken under the kernel's lock) costs far more than this one ordered
    pass over the pages.

    >>> mapped_empty((3, 2048), np.int32).shape
    (3, 2048)
    """
    array: np.ndarray = np.empty(shape, dtype)
    array.reshape(-1)[:: max(1, 4096 // array.itemsize)] = 0
    return array


def marks(passing: np.ndarray, n_threads: int, n_cols: int) -> np.ndarray:
    """Per-thread mark rows of at least ``n_cols`` entries in whole 8-byte words (``passing`` when it fits)."""
    if passing.shape[0] >= n_threads and passing.shape[1] >= n_cols:
        return passing
    return np.zeros((n_threads, -(-n_cols // 8) * 8), dtype=np.uint8)


class CompiledBuffer:
    """Best candidates of ``n_rows`` queries, filled by compiled scans of key blocks (CPU, float32 keys).

    The interface of ``torch_buffer.TorchBuffer`` that the drivers use.
    ``filling`` is always False: a query without a threshold appends until its buffer is full.
    """

    def __init__(self, kp: int, tau: Tensor, width: int, memory: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """``memory``: key and item arrays of at least ``(len(tau), width)`` to reuse (their contents do not
        matter: only the first ``fill`` slots of a row are ever read)."""
        self.kp = kp
        n_rows = tau.shape[0]
        if memory is None:
            memory = mapped_empty((n_rows, width), np.float32), mapped_empty((n_rows, width), np.int32)
        self.keys, self.items = memory[0][:n_rows, :width], memory[1][:n_rows, :width]
        self.fill = np.zeros(n_rows, dtype=np.int64)
        self.tau = tau.to(torch.float32).numpy().copy()
        self.passing = np.zeros((0, 0), dtype=np.uint8)  # per-thread marks of one block row, grown on demand
        self.kernels = load_kernels()

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
        self.passing = marks(self.passing, kernel_threads(), values.shape[1])
        state = (self.keys, self.items, self.fill, self.tau, self.kp, self.passing, columns)
        self.kernels.scan(values, rows.start, col0, *state)

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(keys (R, kp), gallery positions (R, kp), floors (R,))`` as ``TorchBuffer.result``, each row
        sorted by (key, position)."""
        self.kernels.finish(self.keys, self.items, self.fill, self.tau, self.kp, kernel_threads())
        keys = torch.from_numpy(self.keys[:, : self.kp].copy())
        return keys, torch.from_numpy(self.items[:, : self.kp]).long(), torch.from_numpy(self.tau.copy())
