"""FNMR@FMR from given pair distances, OML's ``calc_fnmr_at_fmr``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.oml._inputs import check_in_unit_range
from torchmetrics_retrieval.functional.verification import fnmr_at_fmr_from_distances

__all__ = ["calc_fnmr_at_fmr"]


def calc_fnmr_at_fmr(pos_dist: Any, neg_dist: Any, fmr_vals: tuple[float, ...] = (0.1,)) -> Tensor:
    r"""False non-match rate at given false match rates (OML's ``calc_fnmr_at_fmr``).

    The threshold for a rate ``f`` is the ``f``-quantile of the negative distances (linear
    interpolation, numpy's default), and FNMR is the fraction of positive distances at or above it.
    Computed exactly by :func:`torchmetrics_retrieval.functional.verification.fnmr_at_fmr_from_distances`.

    Args:
        pos_dist: 1-D distances of relevant pairs (numpy array or tensor, any real dtype).
        neg_dist: 1-D distances of non-relevant pairs.
        fmr_vals: false match rates in [0, 1] (a non-empty tuple).

    Returns:
        ``(len(fmr_vals),)`` float32 tensor.

    Empty ``pos_dist`` or ``neg_dist`` gives NaN with a warning (OML: NaN, or an ``IndexError`` for
    empty negatives).

    Raises:
        ValueError: ``fmr_vals`` empty or outside [0, 1], distances not 1-D or not finite.

    Example:
        >>> import numpy as np
        >>> pos_dist = np.array([0, 0, 1, 1, 2, 2, 5, 5, 9, 9])
        >>> neg_dist = np.array([3, 3, 4, 4, 6, 6, 7, 7, 8, 8])
        >>> calc_fnmr_at_fmr(pos_dist, neg_dist, fmr_vals=(0.1, 0.5))
        tensor([0.4000, 0.2000])
    """
    fractions = check_in_unit_range("fmr_vals", fmr_vals)
    positive = torch.as_tensor(pos_dist)
    negative = torch.as_tensor(neg_dist, device=positive.device)
    return fnmr_at_fmr_from_distances(positive, negative, fractions)
