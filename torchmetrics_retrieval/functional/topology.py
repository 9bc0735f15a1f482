r"""Geometry of an embedding space: principal components fraction, alignment and uniformity.

* :func:`pcf` (principal components fraction): how many principal axes are needed to explain a
  share of the variance, as a fraction of the dimension. It is computed from three sums over the rows
  (:func:`covariance_sums`), so a streaming metric can add the sums of its batches and ranks and call
  :func:`pcf_from_sums`: memory O(d^2), whatever the number of rows.
* :func:`alignment` and :func:`uniformity` (Wang & Isola, "Understanding Contrastive Representation
  Learning through Alignment and Uniformity on the Hypersphere", ICML 2020). Uniformity is computed
  block by block, never with an N x N matrix.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_embeddings,
    check_fractions,
    check_positive_int_or_none,
    describe,
)
from torchmetrics_retrieval.functional._precision import ieee_float32_matmul

__all__ = ["alignment", "covariance_sums", "pcf", "pcf_from_sums", "uniformity"]

#: Eigenvalues below this fraction of the mean squared row norm are rounding noise and count as 0.
EIGENVALUE_FLOOR = 1e-12
#: A cumulative share within this distance of a required fraction counts as equal to it (float64 noise).
SHARE_TOLERANCE = 1e-9
#: Rows of a block in :func:`uniformity` when ``chunk_size`` is not given (times N columns).
BLOCK_ELEMENTS = 2**22


def covariance_sums(embeddings: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The streaming state of :func:`pcf`: row count, row sum and sum of outer products, in float64.

    Sums of several batches (or ranks) add up to the sums of all their rows.

    Args:
        embeddings: ``(N, d)`` floating, finite (``N = 0`` is allowed and gives zeros).

    Returns:
        ``(count, sum, outer_sum)``: a 0-dim int64 tensor ``N``, a ``(d,)`` float64 tensor
        :math:`\\sum_i x_i` and a ``(d, d)`` float64 tensor :math:`\\sum_i x_i x_i^T`.

    Example:
        >>> count, total, outer = covariance_sums(torch.tensor([[1.0, 0.0], [1.0, 2.0]]))
        >>> count.item(), total.tolist(), outer.tolist()
        (2, [2.0, 2.0], [[2.0, 2.0], [2.0, 4.0]])
    """
    return _covariance_sums_compute(check_embeddings("embeddings", embeddings, allow_empty=True))


def _covariance_sums_compute(embeddings: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`covariance_sums` of checked embeddings."""
    x = embeddings.to(torch.float64)
    count = torch.tensor(x.shape[0], dtype=torch.int64, device=x.device)
    return count, x.sum(dim=0), x.T @ x


def _check_sums(count: Tensor, total: Tensor, outer_sum: Tensor) -> int:
    """Validate the three sums and return the row count as an int (at least 2)."""
    for name, value in (("count", count), ("sum", total), ("outer_sum", outer_sum)):
        if not isinstance(value, Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {describe(value)}.")
    if count.numel() != 1:
        raise ValueError(f"`count` must hold one number, got {describe(count)}.")
    if total.ndim != 1 or outer_sum.shape != (total.shape[0], total.shape[0]):
        raise ValueError(f"`sum` must be (d,) and `outer_sum` (d, d), got {describe(total)} and {describe(outer_sum)}.")
    n = int(count.item())
    if n < 2:
        raise ValueError(f"`count` must be at least 2: PCF needs at least 2 samples, got {n}.")
    return n


def _sorted_eigenvalues(n: int, total: Tensor, outer_sum: Tensor) -> Tensor:
    """The ``min(n, d)`` largest eigenvalues of the covariance, descending, noise set to 0."""
    total, outer_sum = total.to(torch.float64), outer_sum.to(torch.float64)
    scatter = outer_sum - torch.outer(total, total) / n
    covariance = (scatter + scatter.T) / (2 * (n - 1))
    eigenvalues = torch.linalg.eigvalsh(covariance).flip(0)[: min(n, total.shape[0])]
    floor = EIGENVALUE_FLOOR * float(torch.diagonal(outer_sum).sum()) / n
    return torch.where(eigenvalues > floor, eigenvalues, torch.zeros_like(eigenvalues))


def pcf_from_sums(count: Tensor, sum: Tensor, outer_sum: Tensor, pcf_variance: Iterable[float] = (0.5,)) -> Tensor:
    r"""Principal components fraction from the sums of :func:`covariance_sums` (see :func:`pcf`).

    Args:
        count: number of rows N (>= 2), a one-element tensor.
        sum: ``(d,)`` sum of the rows.
        outer_sum: ``(d, d)`` sum of the outer products of the rows.
        pcf_variance: required explained-variance fractions, each in [0, 1].

    Returns:
        ``(len(pcf_variance),)`` float32 tensor on the device of ``sum``; NaN (with a warning)
        when every row is the same, as there is no variance to explain.

    Example:
        >>> pcf_from_sums(*covariance_sums(torch.eye(4, 10)), pcf_variance=(0.5, 1.0))
        tensor([0.2000, 0.5000])
    """
    fractions = check_fractions("pcf_variance", pcf_variance)
    n = _check_sums(count, sum, outer_sum)
    return _pcf_from_sums_compute(n, sum, outer_sum, fractions, stacklevel=3)


def _pcf_from_sums_compute(
    n: int, sum: Tensor, outer_sum: Tensor, fractions: tuple[float, ...], stacklevel: int = 2
) -> Tensor:
    """:func:`pcf_from_sums` of checked sums of ``n >= 2`` rows and checked fractions; ``stacklevel`` of the
    zero-variance warning counts from this function."""
    d = sum.shape[0]
    eigenvalues = _sorted_eigenvalues(n, sum, outer_sum)
    variance = float(eigenvalues.sum())
    if variance <= 0.0:
        warnings.warn("PCF is NaN: every embedding is the same (zero variance).", UserWarning, stacklevel=stacklevel)
        return torch.full((len(fractions),), float("nan"), dtype=torch.float32, device=sum.device)
    shares = eigenvalues.cumsum(0) / variance
    shares[-1] = 1.0
    required = torch.tensor(fractions, dtype=torch.float64, device=sum.device)
    n_components = 1 + (shares[None, :] <= required[:, None] + SHARE_TOLERANCE).sum(dim=1)
    return (n_components.clamp(max=d) / d).to(torch.float32)


def pcf(embeddings: Tensor, pcf_variance: Iterable[float] = (0.5,)) -> Tensor:
    r"""Principal components fraction: the share of dimensions needed to explain a share of the variance.

    Let :math:`\lambda_1 \ge \dots \ge \lambda_m` be the :math:`m = \min(N, d)` largest eigenvalues of
    the covariance of the ``N`` embeddings of dimension ``d`` (an SVD of the centred rows has no more),
    negative ones (rounding) set to 0. For a required fraction ``r``,

    .. math:: n = 1 + \#\{j \le m : (\lambda_1 + \dots + \lambda_j) / (\lambda_1 + \dots + \lambda_m) \le r\}

    and the value is :math:`\min(n, d) / d`. The last cumulative share is exactly 1, so ``r = 1`` asks
    for one more axis than there are eigenvalues (as in open-metric-learning); the cap at ``d`` keeps
    the value a fraction. Computed in float64 from :func:`covariance_sums`; eigenvalues below
    ``EIGENVALUE_FLOOR`` times the mean squared row norm count as 0 and a share within
    ``SHARE_TOLERANCE`` of ``r`` as equal to it, so rounding noise cannot move ``n`` (``eye(3, 10)``
    has shares (0.5, 1, 1) and gives 0.2 at ``r = 0.5``).

    Args:
        embeddings: ``(N, d)`` floating, finite, ``N >= 2``.
        pcf_variance: required explained-variance fractions, each in [0, 1].

    Returns:
        ``(len(pcf_variance),)`` float32 tensor; NaN with a warning when all rows are equal.

    Raises:
        ValueError: fewer than 2 rows, a fraction outside [0, 1], bad embeddings.

    Example:
        >>> pcf(torch.eye(4, 10), pcf_variance=(0.5, 1))
        tensor([0.2000, 0.5000])
    """
    fractions = check_fractions("pcf_variance", pcf_variance)
    x = check_embeddings("embeddings", embeddings, allow_empty=True)
    if x.shape[0] < 2:
        raise ValueError(
            f"`embeddings` must have at least 2 rows: PCF needs at least 2 samples, got {x.shape[0]} ({describe(x)})."
        )
    return _pcf_compute(x, fractions, stacklevel=3)


def _pcf_compute(embeddings: Tensor, fractions: tuple[float, ...], stacklevel: int = 2) -> Tensor:
    """:func:`pcf` of checked embeddings (at least 2 rows) and checked fractions; ``stacklevel`` of the
    zero-variance warning counts from this function."""
    _, total, outer_sum = _covariance_sums_compute(embeddings)
    return _pcf_from_sums_compute(embeddings.shape[0], total, outer_sum, fractions, stacklevel=stacklevel + 1)


def alignment(x: Tensor, y: Tensor, alpha: float = 2.0) -> Tensor:
    r"""Alignment of positive pairs: :math:`\frac{1}{N}\sum_i \lVert x_i - y_i \rVert_2^{\alpha}`.

    Lower is better. The embeddings are used as given (the paper L2-normalises them first).

    Args:
        x: ``(N, d)`` floating, finite.
        y: ``(N, d)``, the positive partner of each row of ``x``.
        alpha: exponent > 0.

    Returns:
        0-dim tensor.

    Example:
        >>> alignment(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
        tensor(1.)
    """
    check_embeddings("x", x)
    check_embeddings("y", y)
    if y.shape != x.shape:
        raise ValueError(f"`y` must have the shape {tuple(x.shape)} of `x`, got {describe(y)}.")
    _check_positive_float("alpha", alpha)
    sq_dist = (x - y).pow(2).sum(dim=1)
    return (sq_dist if alpha == 2 else sq_dist.sqrt().pow(alpha)).mean()


def _check_positive_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number > 0, got {describe(value)}.")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"`{name}` must be a finite number > 0, got {value}.")
    return float(value)


def _row_blocks(n_rows: int, n_cols: int, chunk_size: int | None) -> Iterator[slice]:
    rows = chunk_size if chunk_size is not None else max(1, BLOCK_ELEMENTS // max(n_cols, 1))
    for start in range(0, n_rows, rows):
        yield slice(start, min(start + rows, n_rows))


def uniformity(x: Tensor, t: float = 2.0, *, chunk_size: int | None = None) -> Tensor:
    r"""Uniformity: :math:`\log \frac{1}{N(N-1)} \sum_{i \ne j} e^{-t \lVert x_i - x_j \rVert_2^2}`.

    The mean over the ordered pairs ``i != j`` equals the paper's mean over the pairs ``i < j``. Lower
    is better. Computed block by block (``chunk_size`` rows against all rows) with a stable
    log-sum-exp carried across blocks: exact, and memory ``O(chunk_size * N)``.

    Args:
        x: ``(N, d)`` floating, finite, ``N >= 2``.
        t: temperature > 0.
        chunk_size: rows per block (default: about 4M distances per block).

    Returns:
        0-dim tensor in the dtype of ``x`` (float32 at least).

    Example:
        >>> uniformity(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), t=1.0)
        tensor(-2.)
    """
    check_embeddings("x", x)
    if x.shape[0] < 2:
        raise ValueError(f"`x` must have at least 2 rows for uniformity, got {describe(x)}.")
    t = _check_positive_float("t", t)
    check_positive_int_or_none("chunk_size", chunk_size)
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    n = x.shape[0]
    sq_norms = (x * x).sum(dim=1)
    partial = []
    for rows in _row_blocks(n, n, chunk_size):
        with ieee_float32_matmul():
            sq_dist = torch.addmm(sq_norms[rows, None] + sq_norms[None, :], x[rows], x.T, alpha=-2.0).clamp_(min=0.0)
        logits = sq_dist.mul_(-t)
        diagonal = torch.arange(rows.start, rows.stop, device=x.device)
        logits[diagonal - rows.start, diagonal] = -math.inf
        partial.append(torch.logsumexp(logits.flatten(), dim=0))
    return torch.logsumexp(torch.stack(partial), dim=0) - math.log(n * (n - 1))
