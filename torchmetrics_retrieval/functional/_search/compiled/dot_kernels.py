"""The numba kernel of ``keys.canonical_dots`` on the CPU: one float64 dot product per listed pair, read straight
from float32 or float64 rows (no float64 copy of either side), parallel over pairs, compiled on first use and
cached on disk (module-level functions only: see ``kernels``).

Each value is summed in the canonical order (``keys.LANES`` running sums, entry ``d`` into sum ``d % 4``, then
``(s0 + s1) + (s2 + s3)``), without fast-math: no reordering, no fused multiply-add, so every value is that of
``keys.canonical_dots``' torch path, bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from torchmetrics_retrieval.functional._search.compiled.kernels import jit, pjit


@pjit
def pair_dots(x, y, rows, cols, out, n_threads):
    # out[p] = <x[rows[p]], y[cols[p]]>; a thread takes a contiguous range of pairs (grouped by row, its rows of
    # x stay in cache)
    n_pairs = rows.shape[0]
    for t in prange(n_threads):
        for p in range(n_pairs * t // n_threads, n_pairs * (t + 1) // n_threads):
            out[p] = dot(x[rows[p]], y[cols[p]])


@jit
def dot(a, b):
    s0 = s1 = s2 = s3 = 0.0
    dim = a.shape[0]
    full = dim - dim % 4
    for d in range(0, full, 4):
        s0 += np.float64(a[d]) * np.float64(b[d])
        s1 += np.float64(a[d + 1]) * np.float64(b[d + 1])
        s2 += np.float64(a[d + 2]) * np.float64(b[d + 2])
        s3 += np.float64(a[d + 3]) * np.float64(b[d + 3])
    if dim > full:
        s0 += np.float64(a[full]) * np.float64(b[full])
    if dim > full + 1:
        s1 += np.float64(a[full + 1]) * np.float64(b[full + 1])
    if dim > full + 2:
        s2 += np.float64(a[full + 2]) * np.float64(b[full + 2])
    return (s0 + s1) + (s2 + s3)
