"""Open-set identification (1:N search with probes that may have no mate): ``dir@fpir/{f}`` and ``fnir@fpir/{f}``.

Queries are probes, the gallery is the enrolled set (definitions: docs/definitions.md). A probe with a relevant
item in its gallery (n(q) > 0) is *mated*, one without is *non-mated*. s(q) is the distance to the probe's
nearest gallery item. For a false positive identification rate f, the threshold t_f is the f-quantile (numpy's
linear rule) of s over the non-mated probes; DIR is the fraction of mated probes whose nearest item is relevant
and closer than t_f, FNIR = 1 - DIR. Only each probe's nearest item is needed: it comes from the kNN pass that
serves the ranking metrics, its distance recomputed canonically (the value ``knn`` reports).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

__all__: list[str] = []


def _dir_at_fpir_compute(
    nearest: Tensor, nearest_relevant: Tensor, n_relevant: Tensor, fpir_vals: tuple[float, ...]
) -> dict[str, Tensor]:
    """``{"dir@fpir/{f}": ..., "fnir@fpir/{f}": ...}`` (float32, 0-dim) from each probe's nearest distance
    (+inf without an eligible item), whether that item is relevant, and n(q)."""
    mated = n_relevant > 0
    scores = nearest[~mated].to(torch.float64)
    if scores.numel() == 0 or not bool(mated.any()):
        which = "non-mated probe (every query has a relevant item)" if scores.numel() == 0 else "mated probe"
        warnings.warn(f"dir@fpir is NaN: there is no {which}.", UserWarning, stacklevel=4)
        nan = torch.full((len(fpir_vals),), float("nan"), dtype=torch.float64, device=nearest.device)
        detection = nan
    else:
        f = torch.tensor(fpir_vals, dtype=torch.float64, device=nearest.device)
        thresholds = torch.quantile(scores, f, interpolation="linear")  # numpy's default rule
        hits = (nearest_relevant & mated)[None, :] & (nearest.to(torch.float64)[None, :] < thresholds[:, None])
        detection = hits.sum(dim=1).to(torch.float64) / mated.sum()
    detection = detection.to(torch.float32)
    out = {f"dir@fpir/{f}": detection[i] for i, f in enumerate(fpir_vals)}
    out.update({f"fnir@fpir/{f}": 1 - detection[i] for i, f in enumerate(fpir_vals)})
    return out
