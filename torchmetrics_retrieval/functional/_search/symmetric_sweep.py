"""Stage 1 of a large set searched against itself, group by group, most distances computed once.

``stream_topk.stream_topk_symmetric`` computes every distance once
but holds the candidates of every query at once. When they do not fit (N = 100k, K = 999 would take
2.5 GB), the queries are taken in consecutive groups of ``plan.GROUP_ROWS``, each with its own buffer, and the
key blocks of a group against the next ``window`` groups also serve those groups' queries: their entries
below the column query's first threshold are *spilled*, grouped by query, until that query's group comes.
A group then appends what was spilled to it and computes only the blocks that no earlier group spilled
to it, its own square, and the columns after it. Pairs closer than the window are computed once, the others
twice, and the spill stays within a byte budget: a group whose spill outgrows it spills nothing (its pairs
are then computed again by the later groups, which is always correct).

Compiled kernels only (CPU, numba); every query's candidates and floor mean what they mean for
``stream_topk.stream_topk_symmetric``.
"""

from __future__ import annotations

import math
import mmap

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.compiled.buffer import (
    CompiledBuffer,
    kernel_threads,
    load_kernels,
    mapped_empty,
    marks,
)
from torchmetrics_retrieval.functional._search.stream_topk import KeyFn, MaskFn, sample_thresholds

__all__ = ["SymmetricSweep", "window_groups"]

Spill = tuple[np.ndarray, np.ndarray, np.ndarray]  # (column queries, items, keys): listed entries
Piece = tuple[np.ndarray, np.ndarray, np.ndarray]  # (CSR offsets over a group's rows, items, keys)


def window_groups(n: int, kp: int, spill_bytes: int, group_rows: int | None = None) -> int:
    """Groups after its own that a group spills to: the spill in flight is about ``P W^2 / (2 n)`` entries
    for a window of ``W`` rows and ``P`` entries per query, which must fit ``spill_bytes``."""
    per_query = plan.SPILL_PER_KP * kp
    group_rows = group_rows or plan.GROUP_ROWS
    window_rows = math.sqrt(2.0 * n * (spill_bytes / 8) / per_query)
    return int(window_rows // group_rows)


def _mapped_copy(array: np.ndarray) -> np.ndarray:
    """A copy in memory of its own (an anonymous mapping, unmapped when the copy is freed).

    Spilled pieces live for many groups: in the allocator's heap, between short-lived temporaries, they kept
    freed memory from being returned to the system, which raised the peak memory of large sweeps.
    """
    if array.nbytes == 0:
        return array.copy()
    copy = np.frombuffer(mmap.mmap(-1, array.nbytes), dtype=array.dtype)
    copy[:] = array
    return copy


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` ranges (in increasing order) joined where one ends as the next starts."""
    joined: list[tuple[int, int]] = []
    for start, stop in ranges:
        if joined and joined[-1][1] == start:
            start = joined.pop()[0]
        joined.append((start, stop))
    return joined


class SymmetricSweep:
    """The candidates of a set searched against itself, for consecutive query ranges asked in order.

    ``key_fn`` gives symmetric keys as for ``stream_topk_symmetric``; the thresholds of every query come from
    one sample pass when the sweep is created.

    Example:
        >>> from torchmetrics_retrieval.functional._search.stream_topk import product_keys
        >>> x = torch.randn(5000, 8)
        >>> sweep = SymmetricSweep(product_keys(x, -x), 5000, 10, lambda keys, rows, cols: None,
        ...                        rows_per_chunk=512, cols_per_block=1024, spill_bytes=2**20, group_rows=1024)
        >>> keys, positions, floor = sweep.take(0, 1500)
        >>> keys.shape, sweep.take(0, 10)  # only the next rows can be asked for
        (torch.Size([1500, 10]), None)
    """

    def __init__(
        self,
        key_fn: KeyFn,
        n: int,
        kp: int,
        mask_fn: MaskFn,
        *,
        rows_per_chunk: int,
        cols_per_block: int,
        spill_bytes: int | None = None,
        group_rows: int | None = None,
    ) -> None:
        spill_bytes = plan.SPILL_BYTES if spill_bytes is None else spill_bytes
        group_rows = group_rows or plan.GROUP_ROWS
        self.kp, self.mask_fn, self.key_fn, self.n = kp, mask_fn, key_fn, n
        self.rows, self.cols, self.group_rows = rows_per_chunk, cols_per_block, group_rows
        tau, _ = sample_thresholds(n, n, key_fn, kp, mask_fn, rows_per_chunk, estimate=True)
        self.tau = tau.to(torch.float32)
        self.column_tau = self.tau.numpy()
        self.window = window_groups(n, kp, spill_bytes, group_rows)
        self.spill_bytes = spill_bytes
        self.spilled_bytes = 0
        self.pending: dict[int, list[Piece]] = {}  # target group -> pieces spilled to it
        self.spilled_from: dict[int, set[int]] = {}  # target group -> the groups that spilled to it
        self.done: list[tuple[int, tuple[Tensor, Tensor, Tensor]]] = []  # (first row, result) of each group
        self.position = 0  # the next query row that may be asked for
        self.next_group = 0
        self.kernels = load_kernels()
        self.width = 2 * kp  # a row ends with about 1.6 kp entries: it rarely needs a compaction
        # one buffer serves every group in turn
        shape = (group_rows, self.width)
        self.memory = mapped_empty(shape, np.float32), mapped_empty(shape, np.int32)

    def take(self, start: int, stop: int) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(keys, positions, floors)`` of the queries ``start .. stop - 1`` as ``stream_topk_symmetric``
        gives them, or None unless ``start`` is where the previous range stopped (0 at first)."""
        if start != self.position or stop <= start or stop > self.n:
            return None
        while self.next_group * self.group_rows < stop:
            self.done.append((self.next_group * self.group_rows, self._run_group(self.next_group)))
            self.next_group += 1
        parts = []
        for first, result in self.done:
            last = first + result[0].shape[0]
            lo, hi = max(start, first) - first, min(stop, last) - first
            if lo < hi:
                parts.append(tuple(part[lo:hi] for part in result))
        self.done = [(first, result) for first, result in self.done if first + result[0].shape[0] > stop]
        self.position = stop
        keys, positions, floor = (torch.cat([part[i] for part in parts]) for i in range(3))
        return keys, positions, floor

    def _bounds(self, group: int) -> tuple[int, int]:
        return group * self.group_rows, min(self.n, (group + 1) * self.group_rows)

    def _keys(self, rows: slice, cols: slice) -> Tensor:
        keys = self.key_fn(rows, cols)
        self.mask_fn(keys, rows, cols)
        return keys

    def _run_group(self, group: int) -> tuple[Tensor, Tensor, Tensor]:
        g0, g1 = self._bounds(group)
        buffer = CompiledBuffer(self.kp, self.tau[g0:g1], self.width, self.memory)
        for offsets, items, keys in self.pending.pop(group, []):
            self.kernels.append_spilled(
                buffer.keys, buffer.items, buffer.fill, buffer.tau, self.kp, offsets, items, keys, kernel_threads()
            )
            self.spilled_bytes -= keys.nbytes + items.nbytes
        spilled_from = self.spilled_from.pop(group, set())
        own = _merged([self._bounds(source) for source in range(group) if source not in spilled_from] + [(g0, g1)])
        last_group = (self.n - 1) // self.group_rows
        targets = range(group + 1, min(last_group, group + self.window) + 1)
        spill_stop = self._bounds(targets[-1])[1] if targets else g1
        own.append((spill_stop, self.n))
        spill, count = self._new_spill(g1, spill_stop), 0
        for r0 in range(g0, g1, self.rows):
            rows = slice(r0, min(r0 + self.rows, g1))
            local = slice(r0 - g0, rows.stop - g0)
            for c0, c1 in own:
                for j0 in range(c0, c1, self.cols):
                    buffer.add_filtered(local, self._keys(rows, slice(j0, min(j0 + self.cols, c1))), j0)
            for j0 in range(g1, spill_stop, self.cols):
                block = self._keys(rows, slice(j0, min(j0 + self.cols, spill_stop)))
                if spill is None:
                    buffer.add_filtered(local, block, j0)
                    continue
                spill, count = self._scan_spill(buffer, local, rows.start, block, j0, spill, count)
        if spill is not None and targets:
            self._keep_spill(group, targets, spill, count, g1, spill_stop)
        return buffer.result()

    def _new_spill(self, start: int, stop: int) -> Spill | None:
        """Empty entry lists for a group's spill to the queries ``start .. stop - 1`` (None: no room)."""
        room = (self.spill_bytes - self.spilled_bytes) // 12
        expected = int(2 * plan.SPILL_PER_KP * self.kp * self.group_rows * (stop - start) // self.n)
        capacity = min(room, max(expected, self.cols))
        if stop == start or capacity < self.cols:
            return None
        return np.empty(capacity, np.int32), np.empty(capacity, np.int32), np.empty(capacity, np.float32)

    def _scan_spill(
        self, buffer: CompiledBuffer, local: slice, row0: int, block: Tensor, col0: int, spill: Spill, count: int
    ) -> tuple[Spill | None, int]:
        """Scan a block for its rows and spill its columns; when the lists would outgrow the budget, drop
        the group's whole spill and finish the block for its rows only."""
        values = block.detach().contiguous().numpy()
        n_threads = kernel_threads()
        buffer.passing = marks(buffer.passing, n_threads, values.shape[1])
        column_tau = self.column_tau[col0 : col0 + values.shape[1]]
        # one thread: the plain scan; more: the same lists from row ranges, after a pass counting each row's entries
        scan, passing = (
            (self.kernels.scan_spill, buffer.passing[0])
            if n_threads == 1
            else (self.kernels.scan_spill_rows, buffer.passing[:n_threads])
        )
        state = (buffer.keys, buffer.items, buffer.fill, buffer.tau, self.kp, passing, column_tau)
        done = 0
        while True:
            part = values[done:]
            scanned, count = scan(part, local.start + done, row0 + done, col0, *state, spill, count)
            done += scanned
            if done == values.shape[0]:
                return spill, count
            room = (self.spill_bytes - self.spilled_bytes) // 12
            if room < count + values.shape[1]:  # over budget: the later groups compute these pairs
                buffer.add_filtered(slice(local.start + done, local.stop), block[done:], col0)
                return None, 0
            capacity = min(room, 2 * spill[0].shape[0])
            spill = tuple(np.concatenate([array[:count], np.empty(capacity - count, array.dtype)]) for array in spill)  # type: ignore[assignment]

    def _keep_spill(self, group: int, targets: range, spill: Spill, count: int, start: int, stop: int) -> None:
        """Group the listed entries by query and file them under each target group."""
        offsets, items, keys = self.kernels.group_spill(spill, count, start, stop - start, kernel_threads())
        for target in targets:
            t0, t1 = self._bounds(target)
            lo, hi = offsets[t0 - start], offsets[t1 - start]
            piece = (offsets[t0 - start : t1 - start + 1] - lo, _mapped_copy(items[lo:hi]), _mapped_copy(keys[lo:hi]))
            self.pending.setdefault(target, []).append(piece)
            self.spilled_from.setdefault(target, set()).add(group)
            self.spilled_bytes += piece[1].nbytes + piece[2].nbytes
