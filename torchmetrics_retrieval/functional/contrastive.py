r"""Contrastive top-k accuracy of paired views, in both directions, block by block.

Rows ``z1[i]`` and ``z2[i]`` are two views of the same sample. With the similarity
:math:`s(a, b) = \langle a, b \rangle` (of L2-normalised rows when ``normalize=True``), ``z1[i]`` is a
hit at ``k`` when fewer than ``k`` rows ``z2[j]`` are *strictly* more similar to ``z1[i]`` than its
partner ``z2[i]`` is (so ties count in its favour); the same for ``z2[i]`` against the rows of ``z1``.
The score is the mean of the two directional accuracies.

The ``(N, N)`` similarity matrix is never held: it is computed in square tiles, and every tile serves
both directions (its rows for ``z1 -> z2``, its columns for ``z2 -> z1``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import overload

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_embeddings,
    check_positive_int_or_none,
    check_top_k,
    describe,
)
from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._search.keys import largest_norm

__all__ = ["contrastive_accuracy"]

#: Side of a tile of the similarity matrix when ``chunk_size`` is not given (16 MiB in float32).
DEFAULT_CHUNK = 2048
#: Pairs whose similarity is recomputed in one piece (see ``_count_above``).
PAIR_PIECE = 2**15


def _check_inputs(z1: object, z2: object, eps: object, chunk_size: object) -> tuple[Tensor, Tensor]:
    z1 = check_embeddings("z1", z1)
    z2 = check_embeddings("z2", z2)
    if z2.shape != z1.shape:
        raise ValueError(f"`z2` must have the shape {tuple(z1.shape)} of `z1`, got {describe(z2)}.")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"`eps` must be a number >= 0, got {describe(eps)}.")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"`eps` must be a finite number >= 0, got {eps}.")
    check_positive_int_or_none("chunk_size", chunk_size)
    return z1, z2.to(z1.device)


def _prepare(z: Tensor, dtype: torch.dtype, normalize: bool, eps: float) -> Tensor:
    z = z.to(dtype)
    return torch.nn.functional.normalize(z, dim=1, eps=eps) if normalize else z


def _pair_dots(a: Tensor, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """``<a[i[p]], b[j[p]]>`` in float64 for every listed pair, each computed on its own, in bounded pieces.

    These are the canonical similarities: the rows are converted to float64 piece by piece (exactly), so no
    float64 copy of ``a`` or ``b`` is held, and a pair's value does not depend on which other pairs are listed.
    """
    pieces = [
        (a[i[s : s + PAIR_PIECE]].to(torch.float64) * b[j[s : s + PAIR_PIECE]].to(torch.float64)).sum(dim=1)
        for s in range(0, i.numel(), PAIR_PIECE)
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.float64, device=a.device)


def _rounding_bound(d: int, dtype: torch.dtype, max_norm_a: float, max_norm_b: float) -> float:
    """A bound on how far a fast similarity of two rows (a matmul in ``dtype`` over ``d`` columns) and a fast
    partner value (the canonical one rounded to ``dtype``) can be from the canonical values, for any rows of
    norms at most ``max_norm_a`` and ``max_norm_b``: valid for every subset of rows the maxima cover."""
    return 2 * (d + 2) * torch.finfo(dtype).eps * max_norm_a * max_norm_b


@ieee_float32_matmul()  # the rounding bound assumes IEEE float32 products
def _count_above(
    a: Tensor, b: Tensor, partner_a: Tensor, partner_b: Tensor, tol: float, chunk: int
) -> tuple[Tensor, Tensor]:
    """For rows ``a`` ``(R, D)`` and candidates ``b`` ``(C, D)``, how many are strictly more similar than a partner.

    Returns ``(above_a, above_b)``, int64: ``above_a[i] = #{j : s(a[i], b[j]) > partner_a[i]}`` and
    ``above_b[j] = #{i : s(b[j], a[i]) > partner_b[j]}``, with ``partner_*`` the canonical (float64, from
    :func:`_pair_dots`) similarity of each row to its partner and ``tol`` a :func:`_rounding_bound` covering
    ``a``, ``b`` and the partners. Each ``(chunk, chunk)`` tile serves both: its rows and its columns.

    Tiles are computed by a fast matmul in the compute dtype. A candidate whose fast similarity is within
    ``tol`` of the fast partner value is decided again on canonical values: the float64 dot product of the
    two rows, computed pair by pair (products of float32 numbers are exact in float64). So the counts do not
    depend on the tiling nor on which rows are counted together: counts over a split of the candidates add up
    to the counts over all of them, and identical candidates always tie with the partner.
    """
    n_rows, n_cols = a.shape[0], b.shape[0]
    fast_a, fast_b = partner_a.to(a.dtype), partner_b.to(a.dtype)
    above_a = torch.zeros(n_rows, dtype=torch.int64, device=a.device)
    above_b = torch.zeros(n_cols, dtype=torch.int64, device=a.device)
    for r in range(0, n_rows, chunk):
        rows = slice(r, min(r + chunk, n_rows))
        for c in range(0, n_cols, chunk):
            cols = slice(c, min(c + chunk, n_cols))
            sim = a[rows] @ b[cols].T
            low_1, high_1 = (fast_a[rows] - tol)[:, None], (fast_a[rows] + tol)[:, None]
            low_2, high_2 = (fast_b[cols] - tol)[None, :], (fast_b[cols] + tol)[None, :]
            sure_1, sure_2 = (sim > high_1).sum(dim=1), (sim > high_2).sum(dim=0)
            above_a[rows] += sure_1
            above_b[cols] += sure_2
            if not (
                bool(((sim >= low_1).sum(dim=1) > sure_1).any()) or bool(((sim >= low_2).sum(dim=0) > sure_2).any())
            ):
                continue  # no candidate within the rounding bound of its partner: the fast counts are exact
            near_1 = (sim >= low_1) & (sim <= high_1)
            near_2 = (sim >= low_2) & (sim <= high_2)
            i, j = torch.nonzero(near_1 | near_2, as_tuple=True)
            near_1, near_2 = near_1[i, j], near_2[i, j]
            i, j = i + r, j + c
            exact = _pair_dots(a, b, i, j)
            above_a.index_add_(0, i, (near_1 & (exact > partner_a[i])).long())
            above_b.index_add_(0, j, (near_2 & (exact > partner_b[j])).long())
    return above_a, above_b


def _count_more_similar(a: Tensor, b: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """For every i, how many candidates are strictly more similar than the partner, in each direction.

    Returns ``(above_1, above_2)``, ``(N,)`` int64: ``above_1[i] = #{j : s(a[i], b[j]) > s(a[i], b[i])}``
    and ``above_2[i] = #{j : s(b[i], a[j]) > s(b[i], a[i])}`` (:func:`_count_above` of the set against itself).
    """
    idx = torch.arange(a.shape[0], device=a.device)
    partner = _pair_dots(a, b, idx, idx)
    tol = _rounding_bound(a.shape[1], a.dtype, largest_norm(a), largest_norm(b))
    return _count_above(a, b, partner, partner, tol, chunk)


@overload
def contrastive_accuracy(
    z1: Tensor,
    z2: Tensor,
    top_k: int = 1,
    *,
    normalize: bool = True,
    eps: float = 1e-12,
    chunk_size: int | None = None,
) -> Tensor: ...


@overload
def contrastive_accuracy(
    z1: Tensor,
    z2: Tensor,
    top_k: Iterable[int],
    *,
    normalize: bool = True,
    eps: float = 1e-12,
    chunk_size: int | None = None,
) -> dict[str, Tensor]: ...


def contrastive_accuracy(
    z1: Tensor,
    z2: Tensor,
    top_k: int | Iterable[int] = 1,
    *,
    normalize: bool = True,
    eps: float = 1e-12,
    chunk_size: int | None = None,
) -> Tensor | dict[str, Tensor]:
    r"""Top-k contrastive accuracy of the pairs ``(z1[i], z2[i])``, averaged over both directions.

    .. math::
        \mathrm{acc}_k = \frac{1}{2N} \sum_i \Big( [\#\{j : s(z_1^i, z_2^j) > s(z_1^i, z_2^i)\} < k]
        + [\#\{j : s(z_2^i, z_1^j) > s(z_2^i, z_1^i)\} < k] \Big)

    with :math:`s` the dot product, of rows divided by :math:`\max(\lVert z \rVert_2, \epsilon)` when
    ``normalize=True`` (cosine similarity). Ties with the partner count as hits. Similarities are
    compared exactly: near-ties are decided on the float64 dot product of the (float32) rows, so the
    result does not depend on ``chunk_size`` and a candidate identical to the partner always ties. A
    ``k`` larger than ``N`` behaves as ``N`` (every row is a hit).

    Args:
        z1: ``(N, D)`` floating, finite: the first view.
        z2: ``(N, D)``: the second view, row ``i`` paired with ``z1[i]``.
        top_k: an int ``k >= 1``, or several.
        normalize: L2-normalise the rows first.
        eps: lower bound of the norm in the normalisation (>= 0).
        chunk_size: side of a square tile of the similarity matrix (default ``DEFAULT_CHUNK``);
            memory ``O(chunk_size**2)``, the result does not depend on it.

    Returns:
        An int ``top_k``: a 0-dim float32 tensor. Several: ``{"contrastive_accuracy/{k}": tensor}``.

    Raises:
        TypeError, ValueError: non-tensors, shapes that differ or are not 2-D, NaN/inf, ``k < 1``,
            ``normalize`` not a bool.

    Example:
        >>> z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> z2 = torch.tensor([[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]])
        >>> contrastive_accuracy(z1, z2)
        tensor(0.5000)
        >>> contrastive_accuracy(z1, z2, top_k=(1, 2))
        {'contrastive_accuracy/1': tensor(0.5000), 'contrastive_accuracy/2': tensor(0.6667)}
    """
    single = isinstance(top_k, int) and not isinstance(top_k, bool)
    ks = check_top_k("top_k", top_k, allow_empty=False)
    check_bool("normalize", normalize)
    z1, z2 = _check_inputs(z1, z2, eps, chunk_size)
    dtype = torch.promote_types(torch.promote_types(z1.dtype, z2.dtype), torch.float32)
    a = _prepare(z1, dtype, normalize, float(eps))
    b = _prepare(z2, dtype, normalize, float(eps))
    above_1, above_2 = _count_more_similar(a, b, chunk_size or DEFAULT_CHUNK)
    scores = {k: 0.5 * ((above_1 < k).float().mean() + (above_2 < k).float().mean()) for k in ks}
    if single:
        return scores[ks[0]]
    return {f"contrastive_accuracy/{k}": scores[k] for k in ks}
