"""The order-preserving integer of a float32, written once for every kernel and tensor library that needs it.

``ordered_key`` maps the bits of a float32 (its int32 pattern, held in an int64) to an int64 that increases with
the float's value; -0.0 and +0.0 share the key 0, as they compare equal. It is branch-free integer arithmetic,
so the same function serves Python ints, numpy arrays, torch tensors and, compiled by numba, the kernels; and
it is its own inverse: applied to a key it gives back the bits (+0.0 for the key 0).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ordered_key"]


def ordered_key(bits: Any) -> Any:
    """The key of a float32 whose int32 bits ``bits`` holds as int64 (and the bits of a key).

    A non-negative float keeps its bits; a negative one maps to minus its magnitude's bits, so that a larger
    magnitude sorts lower.

    Example:
        >>> import numpy as np
        >>> bits = np.array([-1.0, -0.0, 0.0, 1e-45, 1.0], dtype=np.float32).view(np.int32).astype(np.int64)
        >>> ordered_key(bits).tolist()
        [-1065353216, 0, 0, 1, 1065353216]
        >>> ordered_key(ordered_key(bits)).astype(np.int32).view(np.float32).tolist()
        [-1.0, 0.0, 0.0, 1.401298464324817e-45, 1.0]
    """
    sign = bits >> 63  # -1 for a negative float, else 0
    return (bits ^ sign) - sign + sign * 2**31
