"""The steps of :mod:`~torchmetrics_retrieval.functional.trials`: the checks, the trial scores computed in blocks, and
the values of given scores (:func:`score_values`, in ``_score_values``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    describe,
)
from torchmetrics_retrieval.functional._score_values import score_values
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional._trial_request import FAR_RULES, TrialRequest

__all__ = ["FAR_RULES", "TRIAL_BLOCK", "TrialRequest", "check_scores", "check_trials", "score_values", "trial_scores"]

#: Trials whose scores are computed at once when no ``chunk_size`` is given: a few MiB of indices and rows.
TRIAL_BLOCK = 2**16


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
    # (a bool sum is far slower on CPU; numpy's count there, as torch's would wake its thread pool, whose threads
    # then spin on the cores the score passes' own threads are about to take)
    on_cpu = value.device.type == "cpu"
    n_target = int(np.count_nonzero(value.numpy()) if on_cpu else torch.count_nonzero(value))
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
    if scores.is_floating_point() and not _all_finite(scores):
        raise ValueError(f"`scores` must be finite, got NaN or inf in {describe(scores)}.")
    flags = _check_flags("`is_target`", is_target, scores.shape[0], "score")
    return scores, flags.to(scores.device)


def _all_finite(scores: Tensor) -> bool:
    """No NaN or inf in ``scores`` (numpy's check on CPU: torch's ``isfinite`` is several times slower there)."""
    if scores.device.type == "cpu" and scores.dtype != torch.bfloat16:
        return bool(np.isfinite(scores.detach().numpy()).all())
    return bool(torch.isfinite(scores).all())


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
    """``-distance`` of every trial, in the embeddings' dtype (float32 for half precision, whose distances rounded
    to float16 would tie trials that differ): the canonical distance (the value ``knn`` reports), computed pair by
    pair, ``chunk_size`` trials at a time; never more than a block of trials' rows at once."""
    none = Exclusions(None, None, None)
    # float64 rows read on demand: no float64 copy of the embeddings (only their float64 squared norms)
    problem = make_problem(embeddings, embeddings, distance, none, True, ("embeddings", "embeddings"), lazy64=True)
    rows = torch.arange(embeddings.shape[0], device=embeddings.device)
    out = torch.empty(enrol.shape[0], dtype=problem.dtype, device=embeddings.device)
    step = chunk_size or TRIAL_BLOCK
    for start in range(0, enrol.shape[0], step):
        block = slice(start, start + step)
        out[block] = canonical_distances(problem, rows, enrol[block], test[block]).to(problem.dtype)
    return out.neg_()
