r"""Score normalisation of a trial list against a cohort: z-norm, t-norm, s-norm and adaptive s-norm (AS-norm).

A trial ``i`` compares the rows ``e = enrol_index[i]`` and ``t = test_index[i]`` of ``embeddings``; its score
:math:`s_i` is minus the distance between them (higher: more alike). The *cohort scores* of an embedding
:math:`x` are minus its distances to every cohort item, and :math:`\mu(x)`, :math:`\sigma(x)` are their mean
and population standard deviation (for AS-norm: of its ``top_n`` highest cohort scores only). Then

.. math::
    z_i = \frac{s_i - \mu(e)}{\sigma(e)}, \qquad t_i = \frac{s_i - \mu(t)}{\sigma(t)}, \qquad
    \mathrm{s}_i = \mathrm{as}_i = \tfrac{1}{2}\,(z_i + t_i)

(Auckenthaler et al. 2000 for z- and t-norm; Cumani et al. 2011 and Matejka et al. 2017 for the adaptive,
top-``N`` cohort). The cohort scores are computed block by block (``distance_blocks``) for the embeddings that
appear on a normalised side of a trial only, and reduced per block to running statistics: no matrix of every
embedding against every cohort item is held. Definitions: docs/definitions.md, section Score normalisation.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_choice,
    check_embeddings,
    check_ids,
    check_positive_int,
    check_positive_int_or_none,
    check_same_length,
    describe,
)
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.blocks import block_sides
from torchmetrics_retrieval.functional._search.types import DISTANCES, Distance
from torchmetrics_retrieval.functional.search import distance_blocks

__all__ = ["SCORE_NORMS", "ScoreNorm", "normalize_scores"]

ScoreNorm = Literal["z", "t", "s", "as"]
SCORE_NORMS: tuple[str, ...] = get_args(ScoreNorm)


# ----------------------------------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------------------------------


def _check_scores(value: Any) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"`scores` must be a 1-D floating torch.Tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`scores` must be 1-D of shape (T,), got {describe(value)}.")
    if not value.is_floating_point():
        raise TypeError(f"`scores` must have a floating dtype, got {describe(value)}.")
    if not bool(torch.isfinite(value).all()):
        n_bad = int((~torch.isfinite(value)).sum())
        raise ValueError(f"`scores` must be finite, got NaN or inf in {n_bad} of {value.numel()} trials.")
    return value


#: Largest score accepted as minus a distance that is never negative: rounding leaves cos - 1 a little above 0.
_SCORE_SLACK = 1e-3


def _check_score_sign(scores: Tensor, distance: str) -> None:
    """Scores that are distances, or cosine similarities, instead of minus the distance would be normalised against
    cohort scores of the other sign or offset, silently: refuse them where the distance is never negative."""
    if distance == "dot" or not scores.numel():
        return
    largest = float(scores.max())
    if largest > _SCORE_SLACK:
        hint = " (cos - 1, not the cosine similarity)" if distance == "cosine" else ""
        raise ValueError(
            f"`scores` must be minus the {distance} distance{hint}, which is never positive, "
            f"got a largest score of {largest:.6g}."
        )


def _check_index(name: str, value: Any, n_trials: int, n_rows: int, device: torch.device) -> Tensor:
    """Row positions of ``embeddings``, one per trial, as int64 on ``device``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D integer torch.Tensor of rows of `embeddings`, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D of shape (T,), got {describe(value)}.")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"`{name}` must have an integer dtype, got {describe(value)}.")
    check_same_length(name, value, n_trials, "scores")
    if value.numel() and (int(value.min()) < 0 or int(value.max()) >= n_rows):
        raise ValueError(
            f"`{name}` must hold rows of `embeddings` in [0, {n_rows}), "
            f"got values in [{int(value.min())}, {int(value.max())}]."
        )
    return value.to(device=device, dtype=torch.int64)


def _check_top_n(method: str, top_n: Any, n_cohort: int) -> int | None:
    if method != "as":
        if top_n is not None:
            raise ValueError(f"`top_n` is used by method='as' only, got top_n={top_n!r} with method={method!r}.")
        return None
    if top_n is None:
        raise ValueError("`top_n` must be given with method='as' (the number of highest cohort scores), got None.")
    top_n = check_positive_int("top_n", top_n)
    if top_n > n_cohort:
        raise ValueError(f"`top_n` must be at most the {n_cohort} items of `cohort`, got {top_n}.")
    return top_n


def _warn_shared_ids(embedding_ids: Any, cohort_ids: Any, rows: Tensor, n_rows: int, cohort: Tensor) -> None:
    """Warn when cohort items carry the id of an embedding of the trials (a speaker of the test in the cohort)."""
    if embedding_ids is None and cohort_ids is None:
        return
    if embedding_ids is None or cohort_ids is None:
        missing, given = ("embedding_ids", "cohort_ids") if embedding_ids is None else ("cohort_ids", "embedding_ids")
        raise ValueError(f"`{missing}` must be given with `{given}` (the ids are compared), got None.")
    device = cohort.device
    trial_ids = check_ids("embedding_ids", embedding_ids, n_rows, "embeddings").to(device)[rows].to(torch.int64)
    cohort_side = check_ids("cohort_ids", cohort_ids, cohort.shape[0], "cohort").to(device).to(torch.int64)
    shared = torch.isin(cohort_side, trial_ids)
    n_shared = int(shared.sum())
    if n_shared:
        n_ids = int(torch.unique(cohort_side[shared]).numel())
        warnings.warn(
            f"{n_shared} of {cohort.shape[0]} cohort items share an id ({n_ids} distinct id(s)) with the embeddings "
            "of the trials (`cohort_ids`, `embedding_ids`): a cohort should hold other identities, or the "
            "normalisation sees the trial speakers themselves.",
            UserWarning,
            stacklevel=3,
        )


# ----------------------------------------------------------------------------------------------------------------------
# cohort statistics
# ----------------------------------------------------------------------------------------------------------------------


def _cohort_statistics(
    embeddings: Tensor, rows: Tensor, cohort: Tensor, distance: Distance, top_n: int | None, chunk_size: int | None
) -> tuple[Tensor, Tensor]:
    """``(mean, std)`` of the cohort scores of ``embeddings[rows]``, float64 ``(R,)`` each; population standard
    deviation; with ``top_n``, of each row's ``top_n`` highest cohort scores.

    Rows are taken ``step`` at a time (no copy of every row), each step's cohort scores in blocks from
    :func:`distance_blocks`, and each block is reduced at once: to its ``top_n`` smallest distances, merged with the
    running ``top_n``; or to its mean and sum of squared deviations, merged with the running ones in float64 (the
    pairwise update of Chan et al., free of the cancellation of E[x^2] - E[x]^2).
    """
    n_cohort, device = cohort.shape[0], cohort.device
    step = block_sides(rows.numel(), n_cohort, chunk_size)[0]
    if top_n is not None:  # the running top_n of a step stays within one block's budget too
        step = max(1, min(step, plan.BLOCK_BYTES // (16 * top_n)))
    mean = torch.empty(rows.numel(), dtype=torch.float64, device=device)
    std = torch.empty_like(mean)
    for start in range(0, rows.numel(), step):
        chunk = embeddings[rows[start : start + step]]
        n = chunk.shape[0]
        if top_n is None:
            # Distances minus the row's distance to cohort item 0: equal distances give exactly a zero spread.
            shift = torch.zeros(n, dtype=chunk.dtype, device=device)
            moments = torch.zeros(3, n, dtype=torch.float64, device=device)  # count, mean, sum of squared deviations
        else:
            best = torch.full((n, top_n), float("inf"), dtype=chunk.dtype, device=device)
        for block in distance_blocks(chunk, cohort, distance=distance, chunk_size=chunk_size):
            rs, d = block.query_slice, block.distances
            if top_n is not None:  # the highest scores are the smallest distances
                candidates = torch.cat([best[rs], d.topk(min(top_n, d.shape[1]), dim=1, largest=False).values], 1)
                best[rs] = candidates.topk(top_n, dim=1, largest=False).values
                continue
            if block.gallery_slice.start == 0:
                shift[rs] = d[:, 0]
            # In place: each block is a new tensor, ours alone (a fresh one would cost more than the reductions).
            d.sub_(shift[rs, None])
            block_mean = d.sum(dim=1) / d.shape[1]
            block_m2 = torch.linalg.vector_norm(d.sub_(block_mean[:, None]), dim=1).square()
            _merge_moments(moments[:, rs], d.shape[1], block_mean.to(torch.float64), block_m2.to(torch.float64))
        if top_n is None:
            chunk_mean, chunk_var = shift.to(torch.float64) + moments[1], moments[2] / moments[0]
        else:  # a few columns per row: float64 directly, around the row's highest score for the same exact zero
            best64 = best.to(torch.float64)
            shifted = best64 - best64[:, :1]
            chunk_mean = best64[:, 0] + shifted.mean(dim=1)
            chunk_var = (shifted - shifted.mean(dim=1, keepdim=True)).square().mean(dim=1)
        mean[start : start + n] = -chunk_mean  # scores are minus the distances: same spread, opposite mean
        std[start : start + n] = chunk_var.sqrt()
    return mean, std


def _merge_moments(moments: Tensor, n_block: int, block_mean: Tensor, block_m2: Tensor) -> None:
    """Merge a block's mean and sum of squared deviations (over ``n_block`` columns) into the running
    ``(count, mean, sum of squared deviations)`` rows of ``moments``, in place."""
    count, mean, m2 = moments
    total = count + n_block
    delta = block_mean - mean
    mean += delta * (n_block / total)
    m2 += block_m2 + delta.square() * (count * n_block / total)
    count += n_block  # last: the updates above read the count before this block


# ----------------------------------------------------------------------------------------------------------------------
# public
# ----------------------------------------------------------------------------------------------------------------------


def normalize_scores(
    scores: Tensor,
    embeddings: Tensor,
    enrol_index: Tensor,
    test_index: Tensor,
    cohort: Tensor,
    *,
    method: ScoreNorm,
    top_n: int | None = None,
    distance: Distance = "cosine",
    embedding_ids: Tensor | None = None,
    cohort_ids: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    r"""Normalise the scores of a trial list against a cohort: z-, t-, s- or adaptive s-norm.

    Trial ``i`` compares rows ``enrol_index[i]`` and ``test_index[i]`` of ``embeddings``, and ``scores[i]`` must be
    minus their ``distance`` (a higher score means more alike), on the scale of the cohort scores, which are
    minus the distance too. For ``"cosine"`` that is :math:`\cos - 1`, not the cosine similarity itself: the
    normalisation subtracts a cohort mean, so both must share the offset. Except for ``"dot"`` such scores are
    never positive, and a score above ``1e-3`` is refused (distances, or similarities, passed by mistake).

    With :math:`\mu(x)`, :math:`\sigma(x)` the mean and the population standard deviation of the cohort scores of
    embedding :math:`x` (minus its distances to every row of ``cohort``):

    * ``"z"``: :math:`(s - \mu(e)) / \sigma(e)`, the enrolment side's statistics;
    * ``"t"``: :math:`(s - \mu(t)) / \sigma(t)`, the test side's;
    * ``"s"``: the mean of the two;
    * ``"as"`` (adaptive s-norm): ``"s"`` with each side's statistics over its own ``top_n`` highest cohort
      scores. Cohort items tied at the ``top_n`` boundary have equal scores, so whichever of them is taken the
      statistics are the same.

    Where a side's spread :math:`\sigma` is 0 (a cohort of one item, ``top_n=1``, or all cohort scores equal) the
    normalised score is NaN, with a ``UserWarning`` that counts those trials. The statistics come from the blocked
    distances of :func:`distance_blocks` (float32 matmul for float32 inputs), for the embeddings on a normalised side
    of a trial only: each block is reduced in its own dtype and the blocks are merged in float64, so memory is a few
    blocks of rows x cohort items. The cost is about one pass of :func:`distance_blocks` over those rows (more with
    ``"as"``, for the ``top_n`` selection).

    Args:
        scores: ``(T,)`` floating, finite: minus the distance of each trial's two embeddings.
        embeddings: ``(N, D)`` floating, finite.
        enrol_index: ``(T,)`` integer rows of ``embeddings`` in ``[0, N)``.
        test_index: ``(T,)`` integer rows of ``embeddings`` in ``[0, N)``.
        cohort: ``(C, D)`` floating, finite, on the device of ``embeddings``: impostors of no trial's identity.
        method: ``"z"``, ``"t"``, ``"s"`` or ``"as"``.
        top_n: int in ``[1, C]``: the cohort scores kept per side by ``"as"``; required by it, refused by the others.
        distance: one of ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"``, ``"dot"``.
        embedding_ids: ``(N,)`` integer identity of each embedding; with ``cohort_ids``, cohort items that share an
            id with an embedding of the trials are counted in a ``UserWarning`` (they are kept).
        cohort_ids: ``(C,)`` integer identity of each cohort item, given with ``embedding_ids``.
        chunk_size: int >= 1, caps both sides of a block (testing, memory); the result does not depend on it.

    Returns:
        ``(T,)`` normalised scores in the dtype of ``scores``, on the device of ``embeddings``.

    Raises:
        TypeError, ValueError: naming the argument, for malformed inputs.

    Example:
        1-D embeddings, ``dot`` distance (scores are dot products). Against the cohort (1, -1), embedding 1 has
        cohort scores 1, -1 (mean 0, spread 1) and embedding 2 has 2, -2 (mean 0, spread 2); the trial (1, 2)
        scores 2:

        >>> x, cohort = torch.tensor([[1.0], [2.0]]), torch.tensor([[1.0], [-1.0]])
        >>> enrol, test, scores = torch.tensor([0]), torch.tensor([1]), torch.tensor([2.0])
        >>> [normalize_scores(scores, x, enrol, test, cohort, method=m, distance="dot").item() for m in "zts"]
        [2.0, 1.0, 1.5]

        With the cohort (1, -1, 3) and ``top_n=2``, embedding 1 keeps 3, 1 (mean 2, spread 1) and embedding 2 keeps
        6, 2 (mean 4, spread 2): (0 + (-1)) / 2.

        >>> cohort = torch.tensor([[1.0], [-1.0], [3.0]])
        >>> normalize_scores(scores, x, enrol, test, cohort, method="as", top_n=2, distance="dot")
        tensor([-0.5000])
    """
    scores = _check_scores(scores)
    embeddings = check_embeddings("embeddings", embeddings)
    cohort = check_embeddings("cohort", cohort)
    if cohort.shape[1] != embeddings.shape[1]:
        raise ValueError(f"`cohort` must have {embeddings.shape[1]} columns like `embeddings`, got {describe(cohort)}.")
    if cohort.device != embeddings.device:
        raise ValueError(f"`cohort` must be on the device of `embeddings` ({embeddings.device}), got {cohort.device}.")
    check_choice("method", method, SCORE_NORMS)
    check_choice("distance", distance, DISTANCES)
    _check_score_sign(scores, distance)
    top_n = _check_top_n(method, top_n, cohort.shape[0])
    check_positive_int_or_none("chunk_size", chunk_size)
    n_trials, n_rows, device = scores.shape[0], embeddings.shape[0], embeddings.device
    enrol = _check_index("enrol_index", enrol_index, n_trials, n_rows, device)
    test = _check_index("test_index", test_index, n_trials, n_rows, device)
    _warn_shared_ids(embedding_ids, cohort_ids, torch.cat([enrol, test]), n_rows, cohort)

    # Statistics once per distinct embedding on a normalised side: it may be enrolled in one trial, tested in another.
    sides = {"z": [enrol], "t": [test]}.get(method, [enrol, test])
    rows, where = torch.unique(torch.cat(sides), return_inverse=True)
    mean, std = _cohort_statistics(embeddings, rows, cohort, distance, top_n, chunk_size)
    std = torch.where(std > 0, std, torch.nan)  # a zero spread has no scale to normalise by: NaN, counted below
    s = scores.to(device=device, dtype=torch.float64)
    normalised = torch.stack([(s - mean[w]) / std[w] for w in where.split(n_trials)]).mean(dim=0)
    n_undefined = int(normalised.isnan().sum())
    if n_undefined:
        warnings.warn(
            f"{n_undefined} of {n_trials} normalised scores are NaN: the cohort scores of one of their normalised "
            "sides all have the same value (spread 0; always so with a cohort of one item or top_n=1).",
            UserWarning,
            stacklevel=2,
        )
    return normalised.to(scores.dtype)
