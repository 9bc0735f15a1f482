r"""Percentile bootstrap of a mean over rows (queries), vectorised over resamples.

A resample draws :math:`Q` row indices uniformly with replacement. Its statistic is the mean of the resampled
rows, column by column (all :math:`M` columns share the row indices, so the keys of one call share their
resamples), or, with ``groups``, the average of per-group means: the mean over the groups that still have a
resampled row of the mean of that group's resampled rows (pytorch-metric-learning's "average of per-label
averages", recomputed on every resample). The interval is the pair of :math:`(1 - c)/2` and :math:`(1 + c)/2`
quantiles of the :math:`R` resampled statistics, with numpy's default (linear) interpolation.

Draws. The indices come from a CPU ``torch.Generator`` seeded with ``seed`` and are moved to the values' device,
so a seed gives the same resamples on every device. They are drawn in blocks of ``(block, Q)`` with
``block * Q <= _DRAW_BUDGET`` (never a loop over queries); torch draws CPU integers one after the other, so the
indices are those of a single ``torch.randint(Q, (R, Q))`` call whatever the block size (the tests check it).
Each block becomes a ``(block, Q)`` matrix of counts (how often each row was drawn), and the statistics are
``counts @ values / Q``, or per-group sums by ``index_add_`` over (resample, group). Sums are in float64.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_positive_int, check_same_length, describe

__all__ = ["bootstrap_interval", "check_confidence_level", "check_seed"]

# Row indices drawn per block: the (block, Q) int64 indices and float64 counts take 32 MiB each.
_DRAW_BUDGET = 2**22


def check_confidence_level(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is a number strictly between 0 and 1 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number in (0, 1), got {describe(value)}.")
    if not 0.0 < value < 1.0:  # NaN fails too
        raise ValueError(f"`{name}` must be a number in (0, 1), got {value}.")
    return float(value)


def check_seed(name: str, value: Any) -> int:
    """Return ``value`` if it is an int in [0, 2**63) (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int >= 0, got {describe(value)}.")
    if not 0 <= value < 2**63:
        raise ValueError(f"`{name}` must be an int in [0, 2**63), got {value}.")
    return value


def _block_sizes(n_rows: int, n_draws: int) -> Iterator[int]:
    """Numbers of resamples per block: ``block * n_rows <= _DRAW_BUDGET`` (at least one resample a block)."""
    block = max(1, _DRAW_BUDGET // n_rows)
    for start in range(0, n_draws, block):
        yield min(block, n_draws - start)


def _resample_indices(n_rows: int, n_resamples: int, seed: int) -> Iterator[Tensor]:
    """The row indices of the resamples, block by block: ``(block, n_rows)`` int64 tensors on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    for block in _block_sizes(n_rows, n_resamples):
        yield torch.randint(n_rows, (block, n_rows), generator=generator)


def _bootstrap_means(values: Tensor, n_resamples: int, seed: int, groups: Tensor | None = None) -> Tensor:
    """The ``(n_resamples, M)`` float64 statistics of checked ``(Q, M)`` float64 ``values`` (see the module)."""
    n_rows, n_cols = values.shape
    device = values.device
    n_groups = int(groups.max()) + 1 if groups is not None else 1
    blocks = []
    for indices in _resample_indices(n_rows, n_resamples, seed):
        indices = indices.to(device)
        counts = torch.zeros(indices.shape, dtype=torch.float64, device=device)
        counts.scatter_add_(1, indices, torch.ones_like(counts))
        if groups is None:
            blocks.append(counts @ values / n_rows)
            continue
        sizes = torch.zeros((indices.shape[0], n_groups), dtype=torch.float64, device=device)
        sizes.index_add_(1, groups, counts)
        present = sizes > 0
        n_present = present.sum(dim=1, dtype=torch.float64)
        means = torch.empty((indices.shape[0], n_cols), dtype=torch.float64, device=device)
        for col in range(n_cols):  # one (block, Q) product per column, never (block, Q, M) in memory
            sums = torch.zeros_like(sizes).index_add_(1, groups, counts * values[:, col])
            means[:, col] = torch.where(present, sums / sizes.clamp(min=1), 0.0).sum(dim=1) / n_present
        blocks.append(means)
    return torch.cat(blocks)


def _quantiles(stats: Tensor, confidence_level: float) -> tuple[Tensor, Tensor]:
    """The ``(1 - c)/2`` and ``(1 + c)/2`` quantiles along dim 0, numpy's linear rule (``torch.lerp`` is numpy's
    two-sided ``_lerp``)."""
    ordered = stats.sort(dim=0).values
    last = ordered.shape[0] - 1
    ends = []
    for q in ((1.0 - confidence_level) / 2, (1.0 + confidence_level) / 2):
        position = last * q
        below = min(math.floor(position), last)
        above = min(below + 1, last)
        ends.append(torch.lerp(ordered[below], ordered[above], position - below))
    return ends[0], ends[1]


def _check_values(values: Any) -> Tensor:
    if not isinstance(values, Tensor):
        raise TypeError(f"`values` must be a torch.Tensor of shape (Q,) or (Q, M), got {describe(values)}.")
    if values.ndim not in (1, 2) or values.shape[0] == 0:
        raise ValueError(f"`values` must be 1-D or 2-D with at least one row, got {describe(values)}.")
    if not values.is_floating_point():
        raise TypeError(f"`values` must have a floating dtype, got {describe(values)}.")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"`values` must be finite, got NaN or inf in {describe(values)}.")
    return values


def _check_groups(groups: Any, n_rows: int) -> Tensor:
    if not isinstance(groups, Tensor):
        raise TypeError(f"`groups` must be a 1-D integer torch.Tensor or None, got {describe(groups)}.")
    if groups.ndim != 1:
        raise ValueError(f"`groups` must be 1-D, got {describe(groups)}.")
    if groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool:
        raise TypeError(f"`groups` must have an integer dtype, got {describe(groups)}.")
    check_same_length("groups", groups, n_rows, "values")
    low, high = int(groups.min()), int(groups.max())
    if low < 0 or high >= n_rows:
        raise ValueError(f"`groups` must hold dense group ids in [0, {n_rows}), got values in [{low}, {high}].")
    return groups.long()


def bootstrap_interval(
    values: Tensor,
    *,
    confidence_level: float = 0.95,
    n_bootstrap: int = 1000,
    seed: int = 0,
    groups: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval of the mean over rows (see the module for the resamples and the rule).

    Args:
        values: ``(Q,)`` or ``(Q, M)`` finite floating values, one row per query.
        confidence_level: the interval's nominal coverage, in (0, 1).
        n_bootstrap: number of resamples, >= 1.
        seed: seed of the CPU generator of the row indices.
        groups: ``(Q,)`` dense group ids in ``[0, Q)`` (e.g. the inverse of ``torch.unique``): the statistic is
            then the average of per-group means, groups without a resampled row left out.

    Returns:
        ``(low, high)``, 0-dim for 1-D ``values`` else ``(M,)``, in the values' dtype and on their device.

    Example:
        >>> low, high = bootstrap_interval(torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0]), n_bootstrap=200)
        >>> 0.0 <= low.item() <= 0.6 <= high.item() <= 1.0
        True
    """
    values = _check_values(values)
    confidence_level = check_confidence_level("confidence_level", confidence_level)
    n_bootstrap = check_positive_int("n_bootstrap", n_bootstrap)
    seed = check_seed("seed", seed)
    ids = None if groups is None else _check_groups(groups, values.shape[0]).to(values.device)
    table = values.to(torch.float64).reshape(values.shape[0], -1)
    low, high = _quantiles(_bootstrap_means(table, n_bootstrap, seed, ids), confidence_level)
    shape = values.shape[1:]
    return low.reshape(shape).to(values.dtype), high.reshape(shape).to(values.dtype)
