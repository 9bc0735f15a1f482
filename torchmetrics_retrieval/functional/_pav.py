"""The numba kernel of ``min_cllr`` (``_trials``): pool-adjacent-violators over groups of tied scores, compiled on
first use and cached on disk.

The groups come sorted by score; group ``g`` holds ``totals[g]`` trials, ``targets[g]`` of them targets. The fit
is the non-decreasing sequence of target rates closest to ``targets / totals`` in weighted least squares: each group
enters as a block, and a block whose rate is not below the next one's is merged with it, until none is. Counts stay
int64, and rates are compared by cross-multiplying them, so that no rounding decides a merge.
"""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True)


@njit
def pav(targets, totals, fitted):
    """Write into ``fitted`` (float64, one per group) the target rate of the block each group ends up in."""
    n = targets.size
    block_targets = np.empty(n, dtype=np.int64)
    block_totals = np.empty(n, dtype=np.int64)
    block_start = np.empty(n, dtype=np.int64)
    top = -1
    for g in range(n):
        top += 1
        block_targets[top], block_totals[top], block_start[top] = targets[g], totals[g], g
        # rate[top - 1] >= rate[top]: the two blocks violate the order (or tie), merge them
        while top > 0 and block_targets[top - 1] * block_totals[top] >= block_targets[top] * block_totals[top - 1]:
            block_targets[top - 1] += block_targets[top]
            block_totals[top - 1] += block_totals[top]
            top -= 1
    for b in range(top + 1):
        end = block_start[b + 1] if b < top else n
        rate = block_targets[b] / block_totals[b]
        for g in range(block_start[b], end):
            fitted[g] = rate
