"""Every (query, gallery item) pair of a checked problem, streamed: the pair source of FNMR@FMR and the DET curve.

The pairs' distances come from the float32 keys of ``key_blocks`` (``KeyForm``): a set against itself takes
symmetric blocks, each distance computed once and standing for both ordered pairs. Two ways to read them,
with the same values:

* as a :data:`~torchmetrics_retrieval.functional._pairs.quantiles.PairSource` (calling the object yields
  :class:`PairBlock` s of distances, signs and eligibility), for any consumer;
* through the compiled kernels (CPU, labels compared by equality): :meth:`PairPasses.histograms` and
  :meth:`PairPasses.wanted`, which ``quantiles`` takes when they are offered (``None`` otherwise). They
  fuse distance, sign, exclusion and bucket into one read of each block, parallel over rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional._pairs.auc import positive_distances
from torchmetrics_retrieval.functional._pairs.quantiles import PairBlock, PairBuckets
from torchmetrics_retrieval.functional._pairs.windows import Sample, Windows
from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.key_blocks import KeyBlock, key_blocks, key_form
from torchmetrics_retrieval.functional._search.problem import Problem, make_problem
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn, _dense_label_ids, _label_match_compute

__all__ = ["PairPasses"]


def _pair_kernels() -> Any:
    """The compiled pair kernels (importing them imports numba: on first use only), their thread count set from
    torch's (``kernel_threads``): a first parallel call before that would start numba's pool on every core and
    leave torch's own count raised to match."""
    from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

    kernels = importlib.import_module("torchmetrics_retrieval.functional._pairs.kernels")
    kernel_threads()
    return kernels


class PairPasses:
    """The pairs of ``qg`` under ``distance`` (see the module docstring). ``problem``: the prepared problem of
    ``qg`` when the caller made it (a subclass that computes the key blocks itself, ``metrics._sharded.pairs``)."""

    def __init__(
        self,
        qg: QueryGallery,
        distance: str,
        label_comparison_fn: LabelComparisonFn | None,
        chunk_size: int | None,
        problem: Problem | None = None,
    ) -> None:
        self.qg, self.label_comparison_fn, self.chunk_size = qg, label_comparison_fn, chunk_size
        if problem is None:
            problem = make_problem(qg.query, qg.gallery, distance, qg.exclusions(), qg.same_set)
        self.problem = problem
        device, n_query = qg.query.device, qg.query.shape[0]
        self.rows = torch.arange(n_query, device=device)
        self.n_pairs = n_query * qg.gallery.shape[0]  # ordered pairs a pass reads (its progress bar's total)
        self.form = key_form(self.problem, self.rows, self.problem.symmetric)
        own = self.problem.exclusions.self_index
        self.own = own if own is not None else torch.full((n_query,), -1, dtype=torch.long, device=device)
        self.others = self.problem.exclusions._replace(self_index=None)  # the rules a block mask serves
        self.ids = None if label_comparison_fn is not None else _dense_label_ids(qg.query_labels, qg.gallery_labels)
        self.compiled = self.ids is not None and plan.use_compiled(device, n_query, qg.gallery.shape[0])
        self.listed_positives: Tensor | None = None  # the positive pairs' distances, when the sample listed them

    def _key_blocks(self) -> Iterator[KeyBlock]:
        """The key blocks of every pair (rows and columns of the whole problem)."""
        return key_blocks(self.problem, self.rows, self.chunk_size, self.problem.symmetric)

    def _blocks(self) -> Iterator[tuple[KeyBlock, Tensor | None]]:
        return self._masked(self._key_blocks())

    def _masked(self, blocks: Iterator[KeyBlock]) -> Iterator[tuple[KeyBlock, Tensor | None]]:
        """Each block with its eligibility mask (None: every pair but the self-matches)."""
        for block in blocks:
            shape = (block.keys.shape[0], block.keys.shape[1])
            yield block, self.others.eligible(block.rows, block.cols, shape, self.rows.device)

    # ---- the generic source -----------------------------------------------------------------------------------

    def __call__(self) -> Iterator[PairBlock]:
        for block, mask in self._blocks():
            distances = self._distances(block)
            yield self._pair_block(distances, block.rows, block.cols, mask)
            if block.mirrored:  # the same distances, as the pairs (column, row)
                yield self._pair_block(distances.T, block.cols, block.rows, None if mask is None else mask.T)

    def _distances(self, block: KeyBlock) -> Tensor:
        """The block's float32 distances, by the kernels' formula (the same float32 operations)."""
        scale, offsets, mode = self.form
        v = block.keys * scale + offsets[block.rows, None]
        if mode:
            v = v.clamp_(min=0.0)
        return ieee_sqrt(v, out=v) if mode == 2 else v

    def _pair_block(self, distances: Tensor, rows: slice, cols: slice, mask: Tensor | None) -> PairBlock:
        qg = self.qg
        if self.ids is not None:
            positive = self.ids[0][rows, None] == self.ids[1][None, cols]
        else:
            positive = _label_match_compute(qg.query_labels[rows], qg.gallery_labels[cols], self.label_comparison_fn)
        own = self.own[rows]
        hit = torch.nonzero((own >= cols.start) & (own < cols.stop)).flatten()
        eligible = mask
        if hit.numel():
            eligible = torch.ones_like(positive) if mask is None else mask.clone()
            eligible[hit, own[hit] - cols.start] = False
        return PairBlock(distances, positive, eligible)

    # ---- the compiled passes ----------------------------------------------------------------------------------

    def _kernel_args(self, block: KeyBlock, mask: Tensor | None) -> tuple[object, ...]:
        """The arguments the kernels share."""
        scale, offsets, mode = self.form
        rows, cols = block.rows, block.cols
        form = (np.float32(scale), offsets[rows].numpy(), mode)
        mask_np = np.ones((1, block.keys.shape[1]), dtype=np.bool_) if mask is None else mask.numpy()
        assert self.ids is not None
        row_ids, col_ids = self.ids[0][rows].numpy(), self.ids[1][cols].numpy()
        keys = block.keys.contiguous().numpy()  # (a block of an unaligned width is a strided view: copied)
        return keys, form, cols.start, self.own[rows].numpy(), mask_np, row_ids, col_ids

    def histograms(self, buckets: PairBuckets, windows: Windows | None = None) -> tuple[Tensor, Tensor] | None:
        """``(negative, positive)`` histograms of the pairs' buckets, or None without the compiled kernels; the
        pairs inside ``windows`` are also counted by value, into ``windows``."""
        if not self.compiled:
            return None
        from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

        n_buckets = pairs_plan.N_BUCKETS  # read at call time (tests use fewer buckets)
        hist = np.zeros((kernel_threads(), 2 * n_buckets), dtype=np.int64)
        self._histogram(self._blocks(), buckets, hist, windows)
        total = torch.from_numpy(hist.sum(axis=0))
        return total[:n_buckets], total[n_buckets:]

    def sample(self, buckets: PairBuckets) -> Sample | None:
        """What ``windows`` foresees the second pass's buckets from: the histograms of the first tile of
        rows against every column, in ``GROUPS`` runs of rows, and of every positive pair's canonical distance
        when there are at most ``plan.LISTED_POSITIVES``. None without the compiled kernels, or when the tile holds
        more than a few percent of the pairs."""
        tile_rows = plan.SYMMETRIC_KEY_TILE if self.problem.symmetric else plan.KEY_TILE_ROWS
        if not self.compiled or self.rows.numel() < pairs_plan.SAMPLED_TILES * min(
            tile_rows, self.chunk_size or tile_rows
        ):
            return None
        n_buckets = pairs_plan.N_BUCKETS
        hist = np.zeros((pairs_plan.GROUPS, 2 * n_buckets), dtype=np.int64)
        self._histogram(self._masked(self._sample_blocks()), buckets, hist, None)
        positives = self._listed_positives()
        counted = None if positives is None else torch.bincount(buckets.ids(positives), minlength=n_buckets)
        n_pairs = self.qg.query.shape[0] * self.qg.gallery.shape[0]
        return Sample(self._sample_total(torch.from_numpy(hist)), counted, n_pairs)

    def _sample_blocks(self) -> Iterator[KeyBlock]:
        """The key blocks of the sample: the first tile of rows against every column."""
        return key_blocks(self.problem, self.rows, self.chunk_size, self.problem.symmetric, first_rows_only=True)

    def _sample_total(self, hist: Tensor) -> Tensor:
        """The sample's histograms of every part of the pairs (a source holding a part sums them over the parts)."""
        return hist

    def _listed_positives(self) -> Tensor | None:
        """Every positive pair's canonical distance, kept for ROC AUC, when there are at most
        ``plan.LISTED_POSITIVES`` (else None)."""
        assert self.ids is not None
        n_labels = int(max(self.ids[0].max(), self.ids[1].max())) + 1
        per_label = [torch.bincount(ids, minlength=n_labels) for ids in self.ids]
        if int((per_label[0] * per_label[1]).sum()) > pairs_plan.LISTED_POSITIVES:  # before exclusions: at most that
            return None
        self.listed_positives = self._positive_distances()
        return self.listed_positives

    def _positive_distances(self) -> Tensor:
        """Every eligible positive pair's canonical distance (a source holding a part of the pairs lists them
        with the other parts)."""
        return positive_distances(self.qg, self.problem, self.label_comparison_fn)

    def _histogram(
        self,
        blocks: Iterator[tuple[KeyBlock, Tensor | None]],
        buckets: PairBuckets,
        hist: np.ndarray,
        windows: Windows | None,
    ) -> None:
        pair_kernels = _pair_kernels()
        if windows is None:
            span, delta = pair_kernels._NO_SPAN, np.zeros(0, dtype=np.int64)
            fine = np.zeros((hist.shape[0], 0), dtype=np.int64)
        else:
            span, delta, fine = windows.span, windows.delta, windows.counters(hist.shape[0])
        for block, mask in blocks:
            # a symmetric block off the diagonal stands for its pairs both ways round: weight 2
            args = self._kernel_args(block, mask)
            pair_kernels.histogram(*args, 2 if block.mirrored else 1, tuple(buckets), hist, span, delta, fine)

    def wanted(self, buckets: PairBuckets, wanted_ids: Tensor) -> Iterator[tuple[Tensor, Tensor]] | None:
        """``(distances, positive)`` of the pairs whose (bucket, sign) is wanted (``wanted_ids``: ``(2 n_buckets,)``
        bool, negatives' buckets then positives'), block by block; None without the compiled kernels."""
        if not self.compiled:
            return None
        return self._wanted(buckets, wanted_ids[: 2 * pairs_plan.N_BUCKETS].numpy())

    def _wanted(self, buckets: PairBuckets, wanted: np.ndarray) -> Iterator[tuple[Tensor, Tensor]]:
        pair_kernels = _pair_kernels()
        empty = True
        for block, mask in self._blocks():
            # the two orientations of a mirrored block hold the same distances with the same signs
            args = (*self._kernel_args(block, mask), tuple(buckets), wanted)
            counts = np.zeros(block.keys.shape[0], dtype=np.int64)
            pair_kernels.count_wanted(*args, counts)
            if not counts.any():
                continue
            offsets = np.zeros(counts.size + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            distances = np.empty(int(offsets[-1]), dtype=np.float32)
            positive = np.empty(int(offsets[-1]), dtype=np.bool_)
            pair_kernels.list_wanted(*args, offsets, distances, positive)
            repeat = 2 if block.mirrored else 1
            empty = False
            yield torch.from_numpy(distances).repeat(repeat), torch.from_numpy(positive).repeat(repeat)
        if empty:
            yield torch.zeros(0, dtype=torch.float32), torch.zeros(0, dtype=torch.bool)
