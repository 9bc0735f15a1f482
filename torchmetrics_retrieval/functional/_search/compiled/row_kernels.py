"""The numba kernel of ``keys.stage_rows`` for cosine: unit float32 rows from float32 or float64 rows and their
float64 norms, parallel over rows, compiled on first use and cached on disk (module-level functions only: see
``kernels``)."""

from __future__ import annotations

import numpy as np
from numba import prange

from torchmetrics_retrieval.functional._search.compiled.kernels import jit, pjit


@pjit
def unit_rows(x, norms, out, n_threads):
    # out[i, j] = float32(float64(x[i, j]) / norms[i]): the float64 quotient is correctly rounded (IEEE division,
    # no fast-math), then rounded to float32, as torch's float64 division followed by ``.to(float32)``
    n_rows = x.shape[0]
    for t in prange(n_threads):
        unit_rows_range(x, norms, out, n_rows * t // n_threads, n_rows * (t + 1) // n_threads)


@jit
def unit_rows_range(x, norms, out, r0, r1):
    for i in range(r0, r1):
        norm = norms[i]
        for j in range(x.shape[1]):
            out[i, j] = np.float32(np.float64(x[i, j]) / norm)
