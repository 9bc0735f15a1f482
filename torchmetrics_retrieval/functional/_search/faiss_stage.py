"""Stage 1 with a faiss flat inner-product index: exact float32 top-k, or a range search below estimated
thresholds for large K (CPU; faiss-gpu for CUDA tensors when installed)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.problem import Candidates, Problem, rounding_terms
from torchmetrics_retrieval.functional._search.stream_topk import addmm_keys, sample_size, sample_thresholds
from torchmetrics_retrieval.functional._search.types import Exclusions

__all__ = ["FaissStage"]


class FaissStage:
    """Stage 1 with a faiss flat inner-product index (exact search in float32) on augmented rows.

    The index holds ``g' = [2g, -|g|^2, 1]`` (L2) or ``[g, 1]`` (dot, cosine) and a query is sent as
    ``q' = [q, 1, t]`` or ``[q, t]``, so that ``<q', g'> = t - key(q, g)``: with ``t = 0`` a top-k search
    by inner product ranks by key, and a range search ``<q', g'> > 0`` keeps exactly the items whose key
    is below a per-query threshold ``t``. The first round of a large search (``kp >= plan.RANGE_MIN_KP``, CPU)
    takes that range search with thresholds estimated from a gallery sample: one fused product-and-compare
    pass in faiss, instead of a top-k selection that is expensive for large K. Later rounds, and rows the
    sample shows crowded at their threshold, take the top-k search.

    Faiss cannot exclude items during the search: the top-k search fetches ``kp`` plus the largest number
    of excluded items of any query, and the excluded items are dropped from both answers.
    """

    def __init__(self, problem: Problem, *, use_gpu: bool) -> None:
        faiss = plan.faiss_module()
        self.problem = problem
        gallery, gallery_sq = problem.stage_gallery()
        self.l2 = gallery_sq is not None
        self.gallery, self.bias = gallery, gallery_sq if gallery_sq is not None else torch.zeros_like(gallery[:, 0])
        self.alpha = -2.0 if self.l2 else -1.0
        ones = torch.ones_like(gallery[:, :1])
        augmented = torch.cat([2.0 * gallery, -self.bias[:, None], ones] if self.l2 else [gallery, ones], dim=1)
        index = faiss.IndexFlatIP(augmented.shape[1])
        index.add(augmented.detach().cpu().contiguous().numpy())
        self.index = faiss.index_cpu_to_all_gpus(index) if use_gpu else index
        self.use_range = not use_gpu
        self.n_excluded = problem.gallery.shape[0] - problem.n_eligible

    def _augmented(self, query: Tensor, thresholds: Tensor | None = None) -> Any:
        """Prepared float32 query rows as the augmented numpy rows ``[q, 1, t]`` / ``[q, t]`` (default t = 0)."""
        t = torch.zeros_like(query[:, :1]) if thresholds is None else thresholds[:, None].to(query.dtype)
        parts = [query, torch.ones_like(t), t] if self.l2 else [query, t]
        return torch.cat(parts, dim=1).detach().cpu().contiguous().numpy()

    def __call__(self, rows: Tensor, kp: int, first_round: bool) -> Candidates:
        n_gallery = self.problem.gallery.shape[0]
        large = kp >= plan.RANGE_MIN_KP and n_gallery >= plan.RANGE_GALLERY_PER_KP * kp
        if first_round and self.use_range and large and sample_size(n_gallery, kp) < n_gallery:
            return self._range(rows, kp)
        return self._top(rows, kp)

    def _top(self, rows: Tensor, kp: int) -> Candidates:
        """Exact float32 top-k selection: the largest candidate key is the floor of a full row."""
        problem = self.problem
        n_fetch = min(problem.gallery.shape[0], kp + int(self.n_excluded[rows].max()))
        query = problem.stage_query(rows)
        values_np, labels_np = self.index.search(self._augmented(query), n_fetch)
        device = rows.device
        labels = torch.from_numpy(labels_np).to(device)
        keys = -torch.from_numpy(values_np).to(device, torch.float64)
        found = labels >= 0
        labels = labels.clamp(min=0)
        keys = keys.masked_fill(~found | ~_pair_eligible(problem.exclusions.take(rows), labels), float("inf"))
        top = torch.topk(keys, min(kp, n_fetch), dim=1, largest=False)
        ok = top.values < float("inf")
        # A row with fewer than kp candidates has them all (faiss fetched past every excluded item).
        floor = torch.where(ok.all(dim=1), top.values[:, -1], float("inf"))
        return Candidates(labels.gather(1, top.indices), ok, floor, top.values, rounding_terms(query.shape[1]))

    def _range(self, rows: Tensor, kp: int) -> Candidates:
        """Candidates below estimated per-query thresholds ``tau``.

        Every row keeps its best ``kp`` plus as many as it may have excluded items (dropped afterwards).
        A non-candidate either failed the range test (key >= ``tau``, up to the float32 rounding the
        certificate allows for) or passed it with a key >= the last kept one: the floor is that key for
        a row with more passing items than it keeps, else ``tau``. Crowded rows get no candidates and
        floor -inf: they are searched again.
        """
        problem, device = self.problem, rows.device
        query = problem.stage_query(rows)
        exclusions = problem.exclusions.take(rows)
        key_fn = addmm_keys(query, self.gallery, self.bias, self.alpha)
        mask = functools.partial(exclusions.fill_excluded_, value=float("inf"))
        tau, crowded = sample_thresholds(
            rows.numel(), problem.gallery.shape[0], key_fn, kp, mask, plan.STAGE1_ROWS, True
        )
        crowded |= torch.isinf(tau)  # no threshold: fewer than ``rank`` eligible sample items
        tau = tau.masked_fill(crowded, torch.finfo(tau.dtype).min)  # nothing passes, floor ~ -inf
        lims_np, values_np, labels_np = self.index.range_search(self._augmented(query, tau), 0.0)
        lims = torch.from_numpy(lims_np.astype("int64")).to(device)
        counts = lims.diff()
        # Dense (rows, most passing) inner products t - key, -inf padded; the best are the largest.
        n_keep = kp + int(self.n_excluded[rows].max())
        width = max(n_keep, int(counts.max()))
        row_start = torch.arange(rows.numel(), device=device) * width - lims[:-1]
        flat = torch.arange(int(lims[-1]), device=device) + row_start.repeat_interleave(counts)
        dense = torch.full((rows.numel(), width), -float("inf"), device=device)
        dense.view(-1)[flat] = torch.from_numpy(values_np).to(device)
        top = torch.topk(dense, n_keep, dim=1, sorted=False)
        found = top.indices < counts[:, None]
        padded = torch.cat([torch.from_numpy(labels_np).to(device), torch.zeros(1, dtype=torch.long, device=device)])
        items = padded[(lims[:-1, None] + top.indices).clamp(max=int(lims[-1]))].masked_fill_(~found, 0)
        ok = found & _pair_eligible(exclusions, items)
        tau64 = tau.to(torch.float64)
        floor = torch.where(counts > n_keep, tau64 - top.values.amin(dim=1).to(torch.float64), tau64)
        keys = tau64[:, None] - top.values.to(torch.float64)
        return Candidates(items, ok, floor, keys, rounding_terms(query.shape[1], threshold_in_product=True))


def _pair_eligible(exclusions: Exclusions, items: Tensor) -> Tensor:
    """``(R, n)`` bool: whether row r may retrieve the gallery item ``items[r, j]``."""
    return exclusions.fill_excluded_(torch.ones_like(items, dtype=torch.bool), slice(None), items, False)
