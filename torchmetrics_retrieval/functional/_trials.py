"""The steps of :mod:`~torchmetrics_retrieval.functional.trials`: the checks, the trial scores computed in blocks, and
the values of given scores.

The values the all-pairs path also reports (``fnmr@fmr``, ``tar@far``, ``eer``, ``min_dcf``, ``roc_auc``) come from
its own machinery, with distance = -score: the exact passes of ``_pairs.quantiles`` over the two lists of distances
(``verification._given_distances``), and the placement of the negatives among the sorted positives of
``_pairs.auc``. Only what that path has no use for is computed here: the ROC point nearest a FAR, ``act_dcf``,
``cllr`` and ``min_cllr`` (its pool-adjacent-violators kernel in ``_pav``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_choice,
    check_costs,
    check_fractions,
    check_open_fractions,
    describe,
)
from torchmetrics_retrieval.functional._pairs.auc import _Positives
from torchmetrics_retrieval.functional._pairs.quantiles import statistics
from torchmetrics_retrieval.functional._pairs.rates import RateRequest
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional.verification import _given_distances, statistics_keys

__all__ = ["FAR_RULES", "TRIAL_BLOCK", "TrialRequest", "check_scores", "check_trials", "score_values", "trial_scores"]

#: The rules of reading TAR at a FAR (``far_rule``).
FAR_RULES = ("exact", "nearest_roc_point")
#: Trials whose scores are computed at once when no ``chunk_size`` is given: a few MiB of indices and rows.
TRIAL_BLOCK = 2**16


class TrialRequest(NamedTuple):
    """The checked options of :func:`score_values`."""

    fmr_vals: tuple[float, ...]
    rates: RateRequest
    roc_auc: bool
    cllr: bool
    act_dcf_p_target: tuple[float, ...]
    far_rule: str

    @classmethod
    def checked(
        cls,
        fmr_vals: float | Iterable[float],
        eer: Any,
        min_dcf_p_target: float | Iterable[float],
        dcf_costs: Any,
        roc_auc: Any,
        cllr: Any,
        act_dcf_p_target: float | Iterable[float],
        far_rule: Any,
    ) -> TrialRequest:
        rates = RateRequest(
            check_bool("eer", eer),
            check_open_fractions("min_dcf_p_target", min_dcf_p_target),
            check_costs("dcf_costs", dcf_costs),
        )
        return cls(
            check_fractions("fmr_vals", fmr_vals),
            rates,
            check_bool("roc_auc", roc_auc),
            check_bool("cllr", cllr),
            check_open_fractions("act_dcf_p_target", act_dcf_p_target),
            check_choice("far_rule", far_rule, FAR_RULES),
        )


# ----------------------------------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------------------------------


def _check_flags(named: str, value: Any, n: int, length_of: str) -> Tensor:
    """Target flags: bool, one per trial, both kinds present (``named``: how the messages name them)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{named} must be a 1-D bool torch.Tensor, got {describe(value)}.")
    if value.dtype != torch.bool:
        raise TypeError(f"{named} must have dtype torch.bool, got {describe(value)}.")
    if value.ndim != 1 or value.shape[0] != n:
        raise ValueError(f"{named} must be 1-D with one flag per {length_of} ({n}), got {describe(value)}.")
    n_target = int(value.sum())
    if n_target == 0 or n_target == n:
        raise ValueError(
            f"{named} must hold at least one target (True) and one non-target (False) trial, got {n_target} "
            f"target(s) among {n} trial(s)."
        )
    return value


def check_scores(scores: Any, is_target: Any) -> tuple[Tensor, Tensor]:
    """``scores`` (1-D, real, finite) and ``is_target`` (bool, one per score, both kinds present), on one device."""
    if not isinstance(scores, Tensor):
        raise TypeError(f"`scores` must be a 1-D torch.Tensor, got {describe(scores)}.")
    if scores.ndim != 1:
        raise ValueError(f"`scores` must be 1-D, got {describe(scores)}.")
    if scores.is_complex() or scores.dtype == torch.bool:
        raise TypeError(f"`scores` must have a real dtype, got {describe(scores)}.")
    if scores.is_floating_point() and not bool(torch.isfinite(scores).all()):
        raise ValueError(f"`scores` must be finite, got NaN or inf in {describe(scores)}.")
    flags = _check_flags("`is_target`", is_target, scores.shape[0], "score")
    return scores, flags.to(scores.device)


def check_trials(
    trials: Any, n_rows: int, device: torch.device, ids: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(enrol_index, test_index, is_target)``: integer indices of rows in ``[0, n_rows)``, bool flags, one length.
    With ``ids`` (sorted ascending, one per row: the pooled templates' ids), the indices are ids, mapped to rows."""
    if isinstance(trials, Tensor) or not isinstance(trials, (tuple, list)) or len(trials) != 3:
        raise TypeError(
            f"`trials` must be a tuple of three tensors (enrol_index, test_index, is_target), got {describe(trials)}."
        )
    enrol, test, flags = trials
    indices = []
    for part, value in (("enrol_index", enrol), ("test_index", test)):
        if (
            not isinstance(value, Tensor)
            or value.dtype == torch.bool
            or value.is_floating_point()
            or value.is_complex()
        ):
            raise TypeError(f"`trials` ({part}) must be an integer tensor, got {describe(value)}.")
        if value.ndim != 1:
            raise ValueError(f"`trials` ({part}) must be 1-D, got {describe(value)}.")
        if ids is not None:
            value = _template_rows(part, value.to(device=ids.device, dtype=torch.long), ids)
        elif value.numel() and (int(value.min()) < 0 or int(value.max()) >= n_rows):
            bad = int(torch.nonzero((value < 0) | (value >= n_rows))[0])
            raise ValueError(
                f"`trials` ({part}) must index rows of `embeddings` in [0, {n_rows}), got {int(value[bad])} at "
                f"position {bad}."
            )
        indices.append(value.to(device=device, dtype=torch.long))
    if indices[1].shape[0] != indices[0].shape[0]:
        raise ValueError(
            f"`trials` must hold one test index per enrol index, got {indices[0].shape[0]} and {indices[1].shape[0]}."
        )
    checked = _check_flags("`trials` (is_target)", flags, indices[0].shape[0], "trial")
    return indices[0], indices[1], checked.to(device)


def _template_rows(part: str, value: Tensor, ids: Tensor) -> Tensor:
    """The rows of the pooled templates that ``value`` names by id (``ids`` sorted ascending)."""
    sorted_ids = ids.to(torch.long)
    rows = torch.searchsorted(sorted_ids, value)
    known = (rows < sorted_ids.numel()) & (sorted_ids[rows.clamp(max=sorted_ids.numel() - 1)] == value)
    if not bool(known.all()):
        bad = int(torch.nonzero(~known)[0])
        raise ValueError(
            f"`trials` ({part}) must name template ids of `template_ids` when it is given, got {int(value[bad])} at "
            f"position {bad}, which no embedding carries ({int(known.numel() - known.sum())} unknown)."
        )
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# scores of trials
# ----------------------------------------------------------------------------------------------------------------------


def trial_scores(embeddings: Tensor, enrol: Tensor, test: Tensor, distance: str, chunk_size: int | None) -> Tensor:
    """``-distance`` of every trial, in the embeddings' dtype: the canonical distance (the value ``knn`` reports),
    computed pair by pair, ``chunk_size`` trials at a time; never more than a block of trials' rows at once."""
    none = Exclusions(None, None, None)
    # float64 rows read on demand: no float64 copy of the embeddings (only their float64 squared norms)
    problem = make_problem(embeddings, embeddings, distance, none, True, ("embeddings", "embeddings"), lazy64=True)
    rows = torch.arange(embeddings.shape[0], device=embeddings.device)
    out = torch.empty(enrol.shape[0], dtype=embeddings.dtype, device=embeddings.device)
    step = chunk_size or TRIAL_BLOCK
    for start in range(0, enrol.shape[0], step):
        block = slice(start, start + step)
        out[block] = canonical_distances(problem, rows, enrol[block], test[block]).to(embeddings.dtype)
    return out.neg_()


# ----------------------------------------------------------------------------------------------------------------------
# values of given scores
# ----------------------------------------------------------------------------------------------------------------------


def score_values(scores: Tensor, is_target: Tensor, request: TrialRequest) -> dict[str, Tensor]:
    """Every value ``request`` asks for (float32, 0-dim, on the scores' device) from checked scores and flags."""
    fmr_vals, rates, roc_auc, cllr, act_p, far_rule = request
    # the distances of the all-pairs path (its rule: accept a pair at distance <= t), a positive pair a target trial
    source, buckets = _given_distances(-scores[is_target], -scores[~is_target])
    pos, neg = (block.distances for block in source())
    nearest = far_rule == "nearest_roc_point" and bool(fmr_vals)
    tied = _tied_counts(pos, neg) if nearest or cllr else None
    out: dict[str, Tensor] = {}
    exact = () if nearest else fmr_vals
    if exact or rates.eer or rates.p_targets:
        found = statistics(source, buckets, exact, rates, scores.device)
        out.update(statistics_keys(found, exact))
    if nearest:
        assert tied is not None
        tar = _nearest_roc_tar(*tied[1:], fmr_vals).to(scores.device)
        out = {
            **{f"fnmr@fmr/{f}": 1 - tar[i] for i, f in enumerate(fmr_vals)},
            **{f"tar@far/{f}": tar[i] for i, f in enumerate(fmr_vals)},
            **out,
        }
    if roc_auc:  # the placement of the all-pairs path: positives strictly closer, and ties counting one half
        below, equal = _Positives(pos).place(neg)
        area = (below + 0.5 * equal) / (pos.numel() * neg.numel())
        out["roc_auc"] = torch.tensor(area, dtype=torch.float32, device=scores.device)
    llr_tar, llr_non = -pos.to(torch.float64), -neg.to(torch.float64)
    for p in act_p:
        out[f"act_dcf/{p}"] = _act_dcf(llr_tar, llr_non, p, rates.costs).to(torch.float32)
    if cllr:
        assert tied is not None
        out["cllr"] = _cllr(llr_tar, llr_non).to(torch.float32)
        out["min_cllr"] = _min_cllr(*tied[1:]).to(device=scores.device, dtype=torch.float32)
    return out


def _tied_counts(pos: Tensor, neg: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct distances (ascending: from the highest score down) and, at each, the numbers of target and
    non-target trials (int64). numpy's sorts of the values alone, far faster than an argsort, and a merge by
    ``searchsorted`` of sorted values (its reads then go forward)."""
    pos_sorted, neg_sorted = np.sort(pos.cpu().numpy()), np.sort(neg.cpu().numpy())
    both = np.sort(np.concatenate([pos_sorted, neg_sorted]))
    first = np.ones(both.size, dtype=np.bool_)
    np.not_equal(both[1:], both[:-1], out=first[1:])
    distinct = both[first]
    n_tar = np.bincount(np.searchsorted(distinct, pos_sorted), minlength=distinct.size)
    n_non = np.bincount(np.searchsorted(distinct, neg_sorted), minlength=distinct.size)
    return distinct, n_tar, n_non


def _nearest_roc_tar(n_tar: np.ndarray, n_non: np.ndarray, fmr_vals: tuple[float, ...]) -> Tensor:
    """TAR (float32, per FAR value) at the ROC point nearest it, as insightface's IJB tables read it, from the trials'
    counts at each distinct score, from the highest down (:func:`_tied_counts`).

    The points are scikit-learn's ``roc_curve`` (with its default ``drop_intermediate``): one per distinct score
    (accept the trials scoring at least that), the points inside a run of equal steps dropped, (0, 0) first. Ties in
    ``|FAR - f|`` go to the point of larger FAR (the rates' order from the most accepting point on, the first one
    found)."""
    tps = torch.from_numpy(n_tar).cumsum(0).to(torch.float64)
    fps = torch.from_numpy(n_non).cumsum(0).to(torch.float64)
    if tps.numel() > 2:  # the middle of three points with equal steps lies on the line between the other two
        keep = torch.ones_like(tps, dtype=torch.bool)
        keep[1:-1] = (torch.diff(fps, 2) != 0) | (torch.diff(tps, 2) != 0)
        tps, fps = tps[keep], fps[keep]
    zero = torch.zeros(1, dtype=torch.float64)
    far = torch.cat([zero, fps]) / fps[-1]
    tar = torch.cat([zero, tps]) / tps[-1]
    far, tar = far.flip(0), tar.flip(0)  # argmin returns the first of the nearest: the one of larger FAR
    at = torch.stack([torch.argmin((far - f).abs()) for f in fmr_vals])  # a few FAR values, each a pass
    return tar[at].to(torch.float32)


def _act_dcf(llr_tar: Tensor, llr_non: Tensor, p: float, costs: tuple[float, float]) -> Tensor:
    """Normalised DCF at the Bayes threshold of the log-likelihood ratios: accept a trial when its score is
    ``>= log(C_fa (1 - p) / (C_miss p))`` (``-logit(p)`` with unit costs)."""
    c_miss, c_fa = costs
    threshold = math.log(c_fa * (1 - p) / (c_miss * p))
    miss = (llr_tar < threshold).sum().to(torch.float64) / llr_tar.numel()
    false_alarm = (llr_non >= threshold).sum().to(torch.float64) / llr_non.numel()
    return (c_miss * p * miss + c_fa * (1 - p) * false_alarm) / min(c_miss * p, c_fa * (1 - p))


def _softplus(x: Tensor) -> Tensor:
    """``log(1 + e^x)`` without overflow, exact in both tails (torch's softplus returns ``x`` above a threshold)."""
    return x.clamp(min=0) + torch.log1p(torch.exp(-x.abs()))


def _cllr(llr_tar: Tensor, llr_non: Tensor) -> Tensor:
    """``(mean log2(1 + e^-s) over targets + mean log2(1 + e^s) over non-targets) / 2`` (float64)."""
    return (_softplus(-llr_tar).mean() + _softplus(llr_non).mean()) / (2 * math.log(2))


def _min_cllr(n_tar: np.ndarray, n_non: np.ndarray) -> Tensor:
    """Cllr after the best monotonic calibration, from the trials' counts at each distinct score, from the highest
    down (:func:`_tied_counts`): the target rate ``q`` of each PAV block (tied scores share one block) is the
    posterior, at the empirical prior ``P / (P + N)``; the log-likelihood ratio is ``logit(q) - log(P / N)``. A block
    of targets alone (``q = 1``) or non-targets alone (``q = 0``) costs nothing."""
    targets = n_tar[::-1].copy()  # ascending score (a copy: positive strides)
    block_targets, block_totals = np.empty_like(targets), np.empty_like(targets)
    kernel = importlib.import_module("torchmetrics_retrieval.functional._pav")
    n_blocks = kernel.pav(targets, targets + n_non[::-1], block_targets, block_totals)
    tar = torch.from_numpy(block_targets[:n_blocks])
    non = torch.from_numpy(block_totals[:n_blocks]) - tar
    q = tar / (tar + non)  # float64
    n_target, n_nontarget = int(tar.sum()), int(non.sum())
    prior_odds = n_target / n_nontarget  # P / N: the calibrated LLR is logit(q) - log(P / N)
    # target cost log(1 + e^-llr) = log(1 + (1 - q) / q * P / N), non-target cost log(1 + q / (1 - q) * N / P);
    # only where they occur (q > 0 in a block holding a target, q < 1 in a block holding a non-target)
    tar_cost = torch.where(tar > 0, torch.log1p((1 - q) / q.clamp(min=1e-300) * prior_odds), 0.0)
    non_cost = torch.where(non > 0, torch.log1p(q / (1 - q).clamp(min=1e-300) / prior_odds), 0.0)
    total = (tar * tar_cost).sum() / n_target + (non * non_cost).sum() / n_nontarget
    return total / (2 * math.log(2))
