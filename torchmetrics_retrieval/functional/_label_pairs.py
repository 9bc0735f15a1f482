"""The eligible relevant pairs of a checked problem, listed from its labels: the thresholds of the full-ranking
count (``_ranks``) and the positive pairs of ROC AUC and the pair sample (``_pairs``)."""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search.problem import Problem
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn, _label_match_compute

__all__ = ["relevant_pairs"]

#: Query x gallery label comparisons per chunk under a ``label_comparison_fn`` (bool entries).
LISTED_ENTRIES = 1 << 20


def relevant_pairs(
    qg: QueryGallery, problem: Problem, rows: Tensor, label_comparison_fn: LabelComparisonFn | None
) -> tuple[Tensor, Tensor]:
    """Eligible relevant pairs (row in ``rows``' order, gallery position), row-major, positions increasing."""
    device = rows.device
    if label_comparison_fn is None:  # group the gallery by label: no query x gallery comparison
        labels = torch.cat([qg.query_labels[rows], qg.gallery_labels])
        _, ids = torch.unique(labels, dim=0 if labels.ndim == 2 else None, return_inverse=True)
        query_ids, gallery_ids = ids[: rows.numel()], ids[rows.numel() :]
        gallery_order = torch.argsort(gallery_ids, stable=True)
        sorted_ids = gallery_ids[gallery_order]
        starts = torch.searchsorted(sorted_ids, query_ids)
        sizes = torch.searchsorted(sorted_ids, query_ids, right=True) - starts
        pair_rows = torch.repeat_interleave(torch.arange(rows.numel(), device=device), sizes)
        offsets = torch.cumsum(sizes, 0) - sizes
        within = torch.arange(pair_rows.numel(), device=device) - offsets[pair_rows]
        pair_cols = gallery_order[starts[pair_rows] + within]
    else:
        parts = []
        step = max(1, LISTED_ENTRIES // max(1, qg.gallery.shape[0]))
        for s in range(0, rows.numel(), step):
            chunk = rows[s : s + step]
            match = _label_match_compute(qg.query_labels[chunk], qg.gallery_labels, label_comparison_fn)
            r, c = torch.nonzero(match, as_tuple=True)
            parts.append((r + s, c))
        pair_rows, pair_cols = (torch.cat(side) for side in zip(*parts, strict=True))
    keep = torch.ones(pair_rows.numel(), 1, dtype=torch.bool, device=device)
    problem.exclusions.take(rows).fill_excluded_(keep, pair_rows, pair_cols[:, None], False)
    keep = keep[:, 0]
    return pair_rows[keep], pair_cols[keep]
