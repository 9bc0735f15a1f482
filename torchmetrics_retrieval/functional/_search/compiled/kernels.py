"""The numba kernels of the compiled stage-1 buffers (``compiled.buffer``, ``symmetric_sweep``), compiled on first
use and cached on disk (the stage-2 ordering's are in ``order_kernels``).

Importing this module imports numba: the modules that use it import it on first use only
(``compiled.buffer.load_kernels``). The kernels are module-level functions, never closures: numba keys its
disk cache by a function's closure variables too, and a closure's callee pickles with a per-process id, so a
kernel calling a kernel from a closure would miss the cache in every new process and compile again.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from torchmetrics_retrieval.functional._search.float_order import ordered_key

jit = numba.njit(cache=True, nogil=True)
#: Kernels parallel over rows (``prange``): the callers set numba's thread count from torch's (``buffer.threads``).
pjit = numba.njit(cache=True, nogil=True, parallel=True)
_ordered_key = numba.njit(cache=True, nogil=True, inline="always")(ordered_key)
#: Rows of at most this many codes are sorted by insertion (:func:`radix_sort`, :func:`finish_rows`).
SHORT_ROW = 64


@jit
def encode(bits, item):
    # (float32 key bits, position < 2**31) -> a non-negative int64 code ordered like (key, position)
    return ((_ordered_key(np.int64(bits)) + 2**31) << 31) + item


@jit
def decode(code):
    return np.int32(_ordered_key((code >> 31) - 2**31)), code & 0x7FFFFFFF


@jit
def smallest_by_insertion(codes, kp):
    # The kp smallest codes, sorted, at the front (what follows them is left unspecified): an insertion sort
    # that skips a code as soon as the front is full of smaller ones.
    m = 0
    for j in range(codes.shape[0]):
        code = codes[j]
        if m == kp:
            if code >= codes[kp - 1]:
                continue
            i = kp - 2
        else:
            i, m = m - 1, m + 1
        while i >= 0 and codes[i] > code:
            codes[i + 1] = codes[i]
            i -= 1
        codes[i + 1] = code


@jit
def radix_sort(codes, scratch, counts):
    # Least-significant-digit radix sort of non-negative int64 codes, 8 bits per pass; digits that are
    # the same in every code are skipped (a row's keys share their high bits). A short row takes an
    # insertion sort instead: each radix pass costs two sweeps of the 256 counts, whatever the length.
    if codes.shape[0] <= SHORT_ROW:
        smallest_by_insertion(codes, codes.shape[0])
        return
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
def scan_block(block, a0, a1, b0, b1, row0, item0, col0, keys, items, fill, tau, kp, passing, column_tau, spill, count):
    # The tile (rows a0..a1, columns b0..b1) of a key block for its row queries (the item: the column
    # ``col0 + b0 + entry``) and, unless ``column_tau`` is None, for its column queries (the item: ``item0 + a``)
    # in one pass over each tile row: a vectorised compare marks the entries below the row's threshold with bit 1,
    # below the column's with bit 2, then only the 8-entry words with a mark are visited, mark by mark (lowest
    # set bit first). Thresholds only fall, so a mark is checked again before its append. With ``spill`` a column
    # entry is listed as (column query, item, key) from ``count`` on instead of appended, and the scan stops
    # before a row whose columns might not fit the lists; returns (that row or a1, count).
    #
    # The one body of ``scan_rows``, ``scan_fused`` and ``scan_spill``: its ``is None`` tests are on arguments,
    # which numba prunes when it compiles, so each of them gets a kernel with only its own code. (The appends are
    # written out: a shared helper, even an inlined one, made the scans markedly slower.)
    width, n_cols = keys.shape[1], b1 - b0
    words = passing.view(np.uint64)
    for a in range(a0, a1):
        if spill is not None and count + n_cols > spill[0].shape[0]:
            return a, count
        row, line = row0 + a, block[a, b0:b1]
        row_tau = tau[row]
        if column_tau is None:
            for b in range(n_cols):
                passing[b] = line[b] < row_tau
        else:
            for b in range(n_cols):
                passing[b] = (line[b] < row_tau) | ((line[b] < column_tau[b]) << 1)
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
                    items[row, fill[row]] = col0 + b0 + entry
                    fill[row] += 1
            if column_tau is None:
                continue
            marks = (word >> one) & byte_ones
            while marks:
                lowest = marks & (~marks + one)
                marks ^= lowest
                entry = 8 * w + int((lowest * byte_index) >> top_byte)
                column = col0 + b0 + entry
                if spill is not None:
                    spill[0][count], spill[1][count], spill[2][count] = column, item0 + a, line[entry]
                    count += 1
                    continue
                if fill[column] == width:
                    compact(keys, items, fill, tau, column, kp)
                if line[entry] < tau[column]:
                    keys[column, fill[column]] = line[entry]
                    items[column, fill[column]] = item0 + a
                    fill[column] += 1
    return a1, count


@jit
def scan_rows(block, a0, a1, row0, col0, keys, items, fill, tau, kp, passing):
    # Block rows a0..a1 for their row queries.
    scan_block(block, a0, a1, 0, block.shape[1], row0, row0, col0, keys, items, fill, tau, kp, passing, None, None, 0)


@jit
def scan_fused(block, a0, a1, b0, b1, row0, col0, keys, items, fill, tau, kp, passing):
    # The tile (rows a0..a1, columns b0..b1) of a symmetric block for its row queries and its column queries.
    column_tau = tau[col0 + b0 : col0 + b1]  # a view: follows the compactions
    scan_block(block, a0, a1, b0, b1, row0, row0, col0, keys, items, fill, tau, kp, passing, column_tau, None, 0)


@pjit
def scan(block, row0, col0, keys, items, fill, tau, kp, passing, columns):
    # The entries of a key block below their query's threshold appended to that query's buffer, by
    # ``n_threads = len(passing)`` threads, each with its own marks ``passing[t]``.
    #
    # Row queries only: the rows are split among the threads. A symmetric block (``columns``: the column
    # queries take the entries too, the row then being the item) is cut into n_threads x n_threads tiles,
    # scanned in n_threads steps: at step s thread t takes the tile (row part t, column part (t + s) mod
    # n_threads) with the fused scan. The tiles of a step share no row query and no column query (row and
    # column queries of an off-diagonal block are distinct), and every entry is read once. A query may
    # receive its entries in another order than a serial scan gives them: that can change which of several
    # exactly tied keys a full buffer keeps at its threshold, never a certified answer (``certify``), so
    # results do not depend on the number of threads.
    n_threads, (n_rows, n_cols) = passing.shape[0], block.shape
    if not columns:
        for t in prange(n_threads):
            a0, a1 = n_rows * t // n_threads, n_rows * (t + 1) // n_threads
            scan_rows(block, a0, a1, row0, col0, keys, items, fill, tau, kp, passing[t])
        return
    for step in range(n_threads):
        for t in prange(n_threads):
            part = (t + step) % n_threads
            a0, a1 = n_rows * t // n_threads, n_rows * (t + 1) // n_threads
            b0, b1 = n_cols * part // n_threads, n_cols * (part + 1) // n_threads
            scan_fused(block, a0, a1, b0, b1, row0, col0, keys, items, fill, tau, kp, passing[t])


@jit
def scan_spill(block, row0, item0, col0, keys, items, fill, tau, kp, passing, column_tau, spill, count):
    # ``scan`` with the column side spilled: an entry below its column query's (fixed) threshold
    # ``column_tau`` is listed as (column query, item ``item0 + row``, key) in ``spill`` (three arrays) from
    # ``count`` on. Stops before a row whose columns might not fit the lists; returns (that row, count).
    n_rows, n_cols = block.shape
    state = (keys, items, fill, tau, kp, passing, column_tau, spill, count)
    return scan_block(block, 0, n_rows, 0, n_cols, row0, item0, col0, *state)


@pjit
def scan_spill_rows(block, row0, item0, col0, keys, items, fill, tau, kp, passing, column_tau, spill, count):
    # ``scan_spill`` by ``n_threads = len(passing)`` threads over row ranges, with the very same result: the
    # column entries of each row are counted first, so that every row knows where its entries go in the lists
    # (in row order, as one thread lists them) and where a serial scan would stop.
    n_threads, (n_rows, n_cols) = passing.shape[0], block.shape
    ends = np.empty(n_rows, np.int64)
    for t in prange(n_threads):
        for a in range(n_rows * t // n_threads, n_rows * (t + 1) // n_threads):
            line, found = block[a], 0
            for b in range(n_cols):
                found += line[b] < column_tau[b]
            ends[a] = found
    stop, end = n_rows, count
    for a in range(n_rows):
        if end + n_cols > spill[0].shape[0]:
            stop = a
            break
        end += ends[a]
        ends[a] = end
    for t in prange(n_threads):
        a0, a1 = min(stop, n_rows * t // n_threads), min(stop, n_rows * (t + 1) // n_threads)
        if a0 < a1:
            start = count if a0 == 0 else ends[a0 - 1]
            state = (keys, items, fill, tau, kp, passing[t], column_tau, spill)
            scan_spill(block[a0:a1], row0 + a0, item0 + a0, col0, *state, start)
    return stop, end


@pjit
def group_spill(spill, count, base, n_targets, n_threads):
    # The listed entries grouped by column query (a stable counting sort): CSR offsets over the queries
    # ``base .. base + n_targets - 1``, and the items and keys in that order. Each thread counts, then places, a
    # range of the entries; a query's entries from an earlier range go first, so the order is the one a single
    # pass gives.
    targets, sources, values = spill
    counts = np.zeros((n_threads, n_targets), np.int64)
    for t in prange(n_threads):
        for e in range(count * t // n_threads, count * (t + 1) // n_threads):
            counts[t, targets[e] - base] += 1
    offsets = np.zeros(n_targets + 1, np.int64)
    for target in range(n_targets):  # counts[t, target] becomes thread t's first slot for the query
        slot = offsets[target]
        for t in range(n_threads):
            slot, counts[t, target] = slot + counts[t, target], slot
        offsets[target + 1] = slot
    grouped_sources, grouped_values = np.empty(count, np.int32), np.empty(count, np.float32)
    for t in prange(n_threads):
        slots = counts[t]
        for e in range(count * t // n_threads, count * (t + 1) // n_threads):
            target = targets[e] - base
            grouped_sources[slots[target]], grouped_values[slots[target]] = sources[e], values[e]
            slots[target] += 1
    return offsets, grouped_sources, grouped_values


@pjit
def append_spilled(keys, items, fill, tau, kp, offsets, sources, values, n_threads):
    # Entries grouped by row (CSR ``offsets`` over the rows of the buffer) appended as a scan would; rows
    # split among the threads.
    n_rows = offsets.shape[0] - 1
    for t in prange(n_threads):
        append_spilled_rows(
            keys, items, fill, tau, kp, offsets, sources, values, n_rows * t // n_threads, n_rows * (t + 1) // n_threads
        )


@jit
def append_spilled_rows(keys, items, fill, tau, kp, offsets, sources, values, r0, r1):
    width = keys.shape[1]
    for row in range(r0, r1):
        for e in range(offsets[row], offsets[row + 1]):
            if fill[row] == width:
                compact(keys, items, fill, tau, row, kp)
            if values[e] < tau[row]:
                keys[row, fill[row]] = values[e]
                items[row, fill[row]] = sources[e]
                fill[row] += 1


@pjit
def finish(keys, items, fill, tau, kp, n_threads):
    # Every row sorted by (key, position) and cut to its best kp (the kp-th key is the new threshold); rows
    # split among the threads.
    n_rows = keys.shape[0]
    for t in prange(n_threads):
        finish_rows(keys, items, fill, tau, kp, n_rows * t // n_threads, n_rows * (t + 1) // n_threads)


@jit
def finish_rows(keys, items, fill, tau, kp, r0, r1):
    width = keys.shape[1]
    codes, scratch, counts = np.empty(width, np.int64), np.empty(width, np.int64), np.empty(256, np.int64)
    for row in range(r0, r1):
        n, bits = fill[row], keys[row].view(np.int32)
        for j in range(n):
            codes[j] = encode(bits[j], items[row, j])
        if n <= SHORT_ROW:
            smallest_by_insertion(codes[:n], kp)
        else:
            radix_sort(codes[:n], scratch[:n], counts)
        kept = min(n, kp)
        for j in range(kept):
            bits[j], items[row, j] = decode(codes[j])
        keys[row, kept:] = np.inf
        items[row, kept:kp] = 0
        if n > kp:
            tau[row] = keys[row, kp - 1]
        fill[row] = kept
