"""PCF with OML's edge cases (``calc_pcf``), overall and per category (``calc_topological_metrics``)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.oml._inputs import (
    OVERALL_CATEGORIES_KEY,
    Categories,
    category_codes,
    check_in_unit_range,
    check_same_length,
    groups,
)
from torchmetrics_retrieval.functional.topology import pcf

__all__ = ["calc_pcf", "calc_topological_metrics"]


def _is_decomposable(embeddings: Any) -> bool:
    """Whether OML's PCA would run on it: a 2-D float32/float64 tensor of finite values."""
    return (
        isinstance(embeddings, Tensor)
        and embeddings.ndim == 2
        and embeddings.dtype in (torch.float32, torch.float64)
        and embeddings.shape[1] > 0
        and bool(torch.isfinite(embeddings).all())
    )


def _components_needed(embeddings: Tensor, fractions: tuple[float, ...]) -> Tensor:
    """OML's number of principal axes for each fraction, as float64 ``(T,)``.

    ``n = 1 + #{j <= m : cumulative share_j <= r}`` with ``m = min(N, d)`` (from :func:`pcf`), except
    where OML's arithmetic gives ``m + 1``: ``r = 1`` (every share is <= 1, so ``n`` may exceed ``d``,
    which :func:`pcf` caps), and no variance at all (fewer than 2 rows or all rows equal: OML's shares
    are 0/0 = NaN, which its search places after every eigenvalue).
    """
    n_rows, dim = embeddings.shape
    past_last = float(min(n_rows, dim) + 1)
    required = torch.tensor(fractions, dtype=torch.float64, device=embeddings.device)
    if n_rows < 2:
        return torch.full_like(required, past_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zero variance: pcf warns and returns NaN
        fraction = pcf(embeddings, fractions).to(torch.float64)
    n = (fraction * dim).round()
    return torch.where(fraction.isnan() | (required == 1.0), past_last, n)


def calc_pcf(embeddings: Any, pcf_variance: tuple[float, ...]) -> Tensor | list[Tensor]:
    r"""Principal components fraction, with open-metric-learning's edge cases (``calc_pcf``).

    For eigenvalues :math:`\lambda_1 \ge \dots \ge \lambda_m` of the covariance (``m = min(N, d)``) and a
    required explained-variance fraction ``r``, ``n = 1 + #{j : (\lambda_1 + ... + \lambda_j) / \sum \lambda \le r}``
    and the value is ``n / d`` (computed by :func:`torchmetrics_retrieval.functional.topology.pcf`).
    Reproduced quirks of OML:

    * ``r = 1`` gives ``(m + 1) / d``, which exceeds 1 when ``N >= d``;
    * no variance (one row, or all rows equal) gives ``(m + 1) / d`` for every ``r`` (no rows: ``1 / d``);
    * input OML's PCA cannot decompose (not a 2-D float32/float64 tensor, NaN or inf) gives a *list* of
      0-dim NaN tensors instead of a tensor, as OML's catch-all ``except`` does.

    Shares are computed in float64 and made robust to rounding. OML's own shares are not: where a
    share equals ``r`` exactly (always the case at ``r = 1``, where its last shares come out a little
    above or below 1), its result depends on rounding. At ``r = 1`` this function gives the exact
    arithmetic's ``(m + 1) / d``, which OML 3.1 returned for 89% of random float32 inputs.

    Args:
        embeddings: ``(N, d)`` embeddings.
        pcf_variance: required explained-variance fractions in [0, 1] (a non-empty tuple).

    Returns:
        ``(len(pcf_variance),)`` tensor in the dtype and on the device of ``embeddings`` (or the NaN
        list above).

    Raises:
        ValueError: ``pcf_variance`` empty or outside [0, 1].

    Example:
        >>> calc_pcf(torch.eye(4, 10), pcf_variance=(0.5, 1))
        tensor([0.2000, 0.5000])
        >>> calc_pcf(torch.ones(1, 10), pcf_variance=(0.5,))
        tensor([0.2000])
        >>> calc_pcf(torch.tensor([[float("nan"), 1.0]]), pcf_variance=(0.5,))
        [tensor(nan)]
    """
    fractions = check_in_unit_range("pcf_variance", pcf_variance)
    if not _is_decomposable(embeddings):
        return [torch.tensor(math.nan)] * len(fractions)
    return _components_needed(embeddings, fractions).to(embeddings) / embeddings.shape[1]


def calc_topological_metrics(
    embeddings: Tensor,
    pcf_variance: tuple[float, ...],
    categories: Categories | None = None,
    verbose: bool = False,
) -> dict[Any, Any]:
    """PCF of all embeddings and, with ``categories``, of each category (OML's ``calc_topological_metrics``).

    Args:
        embeddings: ``(N, d)`` embeddings.
        pcf_variance: required explained-variance fractions (see :func:`calc_pcf`); an empty tuple gives ``{}``.
        categories: ``(N,)`` category of each embedding (numpy array or tensor).
        verbose: ignored (OML shows a progress bar over the categories).

    Returns:
        ``{"pcf": {r: value}}``; with ``categories``: ``{"OVERALL": that, category: that of its rows}``,
        categories sorted, keyed by numpy scalars (as OML's ``np.unique`` gives them).

    Raises:
        ValueError: ``categories`` not one per embedding, ``pcf_variance`` outside [0, 1].

    Example:
        >>> import numpy as np
        >>> x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
        >>> calc_topological_metrics(x, (0.5,), categories=np.array([1, 1, 2, 2]))
        {'OVERALL': {'pcf': {0.5: tensor(0.5000)}}, np.int64(1): {'pcf': {0.5: tensor(0.5000)}}, \
np.int64(2): {'pcf': {0.5: tensor(0.5000)}}}
    """
    if categories is not None:
        check_same_length("categories", categories, len(embeddings), "embeddings")
    if not pcf_variance:
        return {}
    overall = {"pcf": dict(zip(pcf_variance, calc_pcf(embeddings, pcf_variance), strict=True))}
    if categories is None:
        return overall
    keys, codes = category_codes(categories, len(embeddings), "categories", by_first_appearance=False)
    rows = groups(codes.to(embeddings.device), len(keys))
    by_category = {
        key: {"pcf": dict(zip(pcf_variance, calc_pcf(embeddings[members], pcf_variance), strict=True))}
        for key, members in zip(keys, rows, strict=True)
    }
    return {OVERALL_CATEGORIES_KEY: overall, **by_category}
