"""The numba kernel of ``min_cllr`` (``_trials``): pool-adjacent-violators over groups of tied scores, compiled on
first use and cached on disk.

The groups come sorted by score; group ``g`` holds ``totals[g]`` trials, ``targets[g]`` of them targets. The fit
is the non-decreasing sequence of target rates closest to ``targets / totals`` in weighted least squares: each group
enters as a block, and a block whose rate is not below the next one's is merged with it, until none is. Counts stay
int64, and rates are compared by cross-multiplying them, so that no rounding decides a merge.
"""

from __future__ import annotations

import numba

njit = numba.njit(cache=True, nogil=True)


@njit
def pav(targets, totals, block_targets, block_totals):
    """Pool the groups into blocks of non-decreasing target rate; write each block's targets and trials into
    ``block_targets`` and ``block_totals`` (int64, as long as the groups) and return the number of blocks. The
    cost of the fit is a function of the blocks alone, which are often far fewer than the groups."""
    top = -1
    for g in range(targets.size):
        top += 1
        block_targets[top], block_totals[top] = targets[g], totals[g]
        # rate[top - 1] >= rate[top]: the two blocks violate the order (or tie), merge them
        while top > 0 and block_targets[top - 1] * block_totals[top] >= block_targets[top] * block_totals[top - 1]:
            block_targets[top - 1] += block_targets[top]
            block_totals[top - 1] += block_totals[top]
            top -= 1
    return top + 1
