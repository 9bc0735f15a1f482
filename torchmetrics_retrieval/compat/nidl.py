r"""nidl's ``contrastive_accuracy_score``: same call, same result types, computed block by block.

nidl builds the full ``(N, N)`` similarity matrix; here the score comes from
:func:`torchmetrics_retrieval.functional.contrastive.contrastive_accuracy`, which never holds it.
"""

from __future__ import annotations

from numbers import Real
from typing import Any, overload

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings, describe
from torchmetrics_retrieval.functional.contrastive import contrastive_accuracy

__all__ = ["contrastive_accuracy_score"]


def _check_arguments(z1: Any, z2: Any, topk: Any) -> None:
    """nidl's checks, in nidl's order: ``topk``, then the types, then the shapes."""
    if isinstance(topk, bool) or not isinstance(topk, Real):
        raise TypeError(f"`topk` must be an int >= 1, got {describe(topk)}.")
    if topk < 1:
        raise ValueError(f"`topk` must be >= 1, got {topk}.")
    both_torch = isinstance(z1, Tensor) and isinstance(z2, Tensor)
    both_numpy = isinstance(z1, np.ndarray) and isinstance(z2, np.ndarray)
    if not (both_torch or both_numpy):
        raise TypeError(
            "`z1` and `z2` must both be torch.Tensors or both numpy.ndarrays, "
            f"got {type(z1).__name__} and {type(z2).__name__}."
        )
    if tuple(z1.shape) != tuple(z2.shape):
        raise ValueError(f"`z1` and `z2` must have the same shape, got {tuple(z1.shape)} and {tuple(z2.shape)}.")
    if z1.ndim != 2:
        raise ValueError(f"`z1` and `z2` must be 2-D (n_samples, n_features), got ndim={z1.ndim}.")
    if z1.shape[0] == 0:
        raise ValueError(f"`z1` and `z2` must have at least one row, got shape {tuple(z1.shape)}.")


def _prepare_numpy(name: str, z: np.ndarray, normalize: bool, eps: float) -> Tensor:
    """nidl's numpy path: float32, rows divided by ``norm + eps`` (finite values checked first)."""
    z = z.astype(np.float32)
    check_embeddings(name, torch.from_numpy(z))
    if normalize:
        z = z / (np.linalg.norm(z, axis=1, keepdims=True) + eps)
    return torch.from_numpy(np.ascontiguousarray(z))


def _prepare_torch(z: Tensor, normalize: bool, eps: float) -> Tensor:
    """nidl's torch path: integers to float32, rows divided by ``max(norm, eps)``."""
    z = z if z.is_floating_point() else z.float()
    return torch.nn.functional.normalize(z, dim=1, eps=eps) if normalize else z


def _exact_fraction(score: Tensor, n: int) -> np.float64:
    """The score as nidl's float64: it is a multiple of 1 / (2n), recovered exactly from the float32 value."""
    return np.float64(round(float(score) * 2 * n) / (2 * n))


@overload
def contrastive_accuracy_score(
    z1: Tensor, z2: Tensor, normalize: bool = ..., topk: int = ..., eps: float = ...
) -> Tensor: ...


@overload
def contrastive_accuracy_score(
    z1: np.ndarray, z2: np.ndarray, normalize: bool = ..., topk: int = ..., eps: float = ...
) -> np.float64: ...


def contrastive_accuracy_score(
    z1: Tensor | np.ndarray, z2: Tensor | np.ndarray, normalize: bool = True, topk: int = 1, eps: float = 1e-12
) -> Tensor | np.float64:
    r"""Top-k contrastive accuracy of paired views, averaged over both directions (nidl's signature).

    Row ``z1[i]`` is a hit when its partner ``z2[i]`` is among its ``k`` most similar rows of ``z2``;
    likewise ``z2[i]`` against the rows of ``z1``; the score is the mean of the two directional
    accuracies. Similarity is the dot product, of L2-normalised rows when ``normalize=True``.
    ``topk`` larger than the number of rows is clipped to it.

    Ties: nidl takes the ``k`` indices ``topk``/``argpartition`` happen to return, so a partner tied with
    other candidates at the k-th place may or may not count. Here a row is a hit when fewer than ``k``
    candidates are *strictly* more similar than its partner (ties count in its favour). Without ties
    the two agree.

    Numpy input follows nidl's numpy path (float32, rows divided by ``norm + eps``) and returns a
    ``numpy.float64``; torch input follows its torch path (integers cast to float32, rows divided by
    ``max(norm, eps)``) and returns a 0-dim float32 tensor on the input's device. Unlike nidl, NaN or
    inf embeddings raise a ``ValueError`` instead of giving an arbitrary score.

    Args:
        z1: ``(N, D)`` tensor or array: the first view.
        z2: ``(N, D)``, the same type as ``z1``: the second view, row ``i`` paired with ``z1[i]``.
        normalize: L2-normalise the rows first (cosine similarity).
        topk: the ``k`` of top-k, ``>= 1``.
        eps: guard against division by zero in the normalisation.

    Returns:
        The score in [0, 1]: a 0-dim tensor for tensors, a ``numpy.float64`` for arrays.

    Raises:
        TypeError: ``z1`` and ``z2`` not both tensors or both arrays; ``topk`` not a number.
        ValueError: ``topk < 1``; shapes that differ, are not 2-D or have no row; NaN or inf.

    Example:
        >>> z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> z2 = torch.tensor([[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]])
        >>> contrastive_accuracy_score(z1, z2)
        tensor(0.5000)
        >>> contrastive_accuracy_score(z1.numpy(), z2.numpy(), topk=2)
        np.float64(0.6666666666666666)
    """
    _check_arguments(z1, z2, topk)
    n = z1.shape[0]
    k = min(int(topk), n)
    if isinstance(z1, np.ndarray):
        a, b = _prepare_numpy("z1", z1, normalize, eps), _prepare_numpy("z2", np.asarray(z2), normalize, eps)
        return _exact_fraction(contrastive_accuracy(a, b, k, normalize=False), n)
    a, b = _prepare_torch(z1, normalize, eps), _prepare_torch(torch.as_tensor(z2), normalize, eps)
    return contrastive_accuracy(a, b, k, normalize=False)
