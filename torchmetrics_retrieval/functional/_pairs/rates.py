"""EER and minDCF over every pair, exact, from the two passes of ``quantiles``.

For a threshold t (accept a pair when its distance is <= t): FMR(t) = #negatives <= t / N and FNMR(t) =
#positives > t / P, over t in {-inf} and every distinct pair distance (docs/definitions.md).

* ``eer``: g(t) = FMR(t) - FNMR(t) grows strictly from one distinct distance to the next, so |g| is smallest
  at the last t with g < 0 or the first with g >= 0 (the smaller t on a tie). The first pass's histograms give g
  at the end of every bucket: the bucket where g turns non-negative holds the second candidate; the first is
  the last distance before that bucket, whose rates the histograms give exactly.
* ``min_dcf/{p}``: DCF(t) = C_miss p FNMR(t) + C_fa (1 - p) FMR(t), over min(C_miss p, C_fa (1 - p)). The
  histograms give DCF exactly at the end of every bucket and a lower bound inside it (FNMR at least that at its
  end, FMR at least that at its start): only the buckets whose bound is below the best bucket end can hold the
  minimum, and their pairs are read exactly in the second pass.

The second pass reads both signs of the chosen buckets (``wanted_buckets``); the values come back as distinct
distances with multiplicities.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_bool, check_costs, check_open_fractions

__all__ = ["RateRequest", "rates", "wanted_buckets"]


class RateRequest(NamedTuple):
    """Which rates to compute: ``eer``, and minDCF at the targets ``p_targets`` with costs (C_miss, C_fa)."""

    eer: bool
    p_targets: tuple[float, ...]
    costs: tuple[float, float]

    @classmethod
    def checked(cls, eer: Any, min_dcf_p_target: float | Iterable[float], dcf_costs: Any) -> RateRequest:
        """The request of the options ``eer``, ``min_dcf_p_target`` and ``dcf_costs``, each checked under its name."""
        return cls(
            check_bool("eer", eer),
            check_open_fractions("min_dcf_p_target", min_dcf_p_target),
            check_costs("dcf_costs", dcf_costs),
        )


class Counted(NamedTuple):
    """Distinct distances (sorted) and their multiplicities."""

    values: Tensor
    counts: Tensor


def _ends(negative_hist: Tensor, positive_hist: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """FMR and FNMR (float64) at the end of every bucket (t = the bucket's largest distance), and N, P."""
    n_negative, n_positive = int(negative_hist.sum()), int(positive_hist.sum())
    fmr = negative_hist.cumsum(0).to(torch.float64) / n_negative
    fnmr = (n_positive - positive_hist.cumsum(0)).to(torch.float64) / n_positive
    return fmr, fnmr, n_negative, n_positive


def _weights(request: RateRequest, device: torch.device) -> tuple[Tensor, Tensor]:
    """Per target p: the weights (C_miss p, C_fa (1 - p)) of FNMR and FMR, already divided by their minimum."""
    p = torch.tensor(request.p_targets, dtype=torch.float64, device=device)
    miss, false_alarm = request.costs[0] * p, request.costs[1] * (1 - p)
    scale = torch.minimum(miss, false_alarm)
    return miss / scale, false_alarm / scale


def wanted_buckets(negative_hist: Tensor, positive_hist: Tensor, request: RateRequest) -> Tensor:
    """Bool ``(n_buckets,)``: the buckets whose pairs the rates need exactly (both signs)."""
    fmr, fnmr, _, _ = _ends(negative_hist, positive_hist)
    wanted = torch.zeros_like(fmr, dtype=torch.bool)
    if request.eer:
        wanted[int(torch.searchsorted(fmr - fnmr, torch.zeros(1, dtype=torch.float64, device=fmr.device)))] = True
    if request.p_targets:
        miss, false_alarm = _weights(request, fmr.device)
        at_ends = miss[:, None] * fnmr[None, :] + false_alarm[:, None] * fmr[None, :]
        best = torch.minimum(at_ends.min(dim=1).values, miss)  # t = -inf: FNMR 1, FMR 0
        fmr_before = torch.cat([torch.zeros_like(fmr[:1]), fmr[:-1]])
        bound = miss[:, None] * fnmr[None, :] + false_alarm[:, None] * fmr_before[None, :]
        occupied = (negative_hist + positive_hist) > 0
        wanted |= ((bound < best[:, None]) & occupied[None, :]).any(dim=0)
    return wanted


def _inside(counted: Counted, values: Tensor, ids: Tensor, counted_ids: Tensor) -> Tensor:
    """For each of ``values`` (in the buckets ``ids``): how many counted distances of its bucket are <= it
    (``counted_ids``: the buckets of the counted distances, sorted like them)."""
    running = torch.cat([torch.zeros(1, dtype=torch.int64, device=values.device), counted.counts.cumsum(0)])
    at_or_below = running[torch.searchsorted(counted.values.to(torch.float64), values, right=True)]
    bucket_start = running[torch.searchsorted(counted_ids, ids)]
    return at_or_below - bucket_start


def rates(
    negative_hist: Tensor,
    positive_hist: Tensor,
    negatives: Counted,
    positives: Counted,
    bucket_of: Callable[[Tensor], Tensor],
    request: RateRequest,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``{"eer": ..., "min_dcf/{p}": ...}`` (float64, 0-dim) from the histograms (``bucket_of`` their bucket
    function) and the distinct distances the second pass read, which include both signs of every bucket of
    :func:`wanted_buckets` (the others may be there with one sign only: they are left out); and, per key, the
    operating point ``(FMR, FNMR)`` where it is reached (for plots)."""
    fmr_end, fnmr_end, n_negative, n_positive = _ends(negative_hist, positive_hist)
    device = fmr_end.device
    whole = wanted_buckets(negative_hist, positive_hist, request)
    values = torch.unique(torch.cat([negatives.values, positives.values])).to(torch.float64)
    ids = bucket_of(values).long()
    values, ids = values[whole[ids]], ids[whole[ids]]
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    cum_neg_before = torch.cat([zero, negative_hist.cumsum(0)])[ids]
    cum_pos_before = torch.cat([zero, positive_hist.cumsum(0)])[ids]
    neg_inside = _inside(negatives, values, ids, bucket_of(negatives.values).long())
    pos_inside = _inside(positives, values, ids, bucket_of(positives.values).long())
    # the rates at every distance of the wanted buckets, exact
    fmr = (cum_neg_before + neg_inside).to(torch.float64) / n_negative
    fnmr = (n_positive - cum_pos_before - pos_inside).to(torch.float64) / n_positive
    out: dict[str, Tensor] = {}
    points: dict[str, Tensor] = {}
    if request.eer:
        out["eer"], points["eer"] = _eer(fmr_end, fnmr_end, fmr, fnmr, ids)
    if request.p_targets:
        miss, false_alarm = _weights(request, device)
        # candidates: t = -inf (FMR 0, FNMR 1), every bucket end, every distance of the wanted buckets
        candidate_fmr = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), fmr_end, fmr])
        candidate_fnmr = torch.cat([torch.ones(1, dtype=torch.float64, device=device), fnmr_end, fnmr])
        costs = miss[:, None] * candidate_fnmr[None, :] + false_alarm[:, None] * candidate_fmr[None, :]
        best, at = costs.min(dim=1)
        for i, p in enumerate(request.p_targets):
            out[f"min_dcf/{p}"] = best[i]
            points[f"min_dcf/{p}"] = torch.stack([candidate_fmr[at[i]], candidate_fnmr[at[i]]])
    return out, points


def _eer(fmr_end: Tensor, fnmr_end: Tensor, fmr: Tensor, fnmr: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """The EER and its ``(FMR, FNMR)`` point, from the rates at the bucket ends and at the distances of the
    crossing bucket (collected)."""
    g_end = fmr_end - fnmr_end
    crossing = int(torch.searchsorted(g_end, torch.zeros(1, dtype=g_end.dtype, device=g_end.device)))
    # the last t before the crossing bucket (-inf when there is none): its rates are the previous bucket end's
    before_fmr = fmr_end[crossing - 1] if crossing > 0 else torch.zeros((), dtype=torch.float64, device=fmr.device)
    before_fnmr = fnmr_end[crossing - 1] if crossing > 0 else torch.ones((), dtype=torch.float64, device=fmr.device)
    inside = ids == crossing
    candidate_fmr = torch.cat([before_fmr.reshape(1), fmr[inside]])  # ascending t
    candidate_fnmr = torch.cat([before_fnmr.reshape(1), fnmr[inside]])
    best = int(torch.argmin((candidate_fmr - candidate_fnmr).abs()))  # the first, i.e. the smallest t, on a tie
    point = torch.stack([candidate_fmr[best], candidate_fnmr[best]])
    return point.mean(), point
