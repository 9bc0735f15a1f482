"""Full-ranking ranks (MRR beyond K, full MAP, mINP) in sharded mode: n(q) and the counts are sums over shards.

The rank of a query's relevant item ``t`` is one plus the number of eligible items whose (distance, position)
precedes ``t``'s (``functional._ranks.count``). Every item lies in exactly one rank's gallery shard, so that
number is the sum over shards of the items of each shard before ``t``, and ``t`` itself (a *threshold*) lies
in one shard. In rounds, as the sharded search (``search.one_sided_top_k``), every rank's next block of
queries is all-gathered (rows and embeddings) and every rank serves all visiting queries against its shard:

1. *thresholds*: each rank lists the eligible relevant pairs between the visiting queries and its shard, their
   canonical distances and the items' global gallery positions (``relevant_pairs`` and ``_Thresholds`` on the
   shard sub-problem), keeps the first ``m`` per query (with ``last``, the last one), and the lists are
   all-gathered: every rank then has, per visiting query, the ``m`` first (or the last) relevant items of its
   whole gallery, sorted by (distance, global position). n(q) needs no exchange: the labels are global.
2. *counts*: each rank counts, with the one-process machinery (``_count_before``: stage-1 float32 keys, near
   ties compared by canonical distance), the eligible items of its shard strictly before each threshold; the
   counts are summed over ranks (``all_reduce``) and the owner of each query keeps its rows.

Why it is exact: a canonical distance is computed pair by pair, the same on any rank and in any company, and
rounded to the embeddings' dtype as on one process; the ambiguous items are compared by those values. Ties go
by global gallery position: a shard's columns are global positions in increasing order, so a threshold takes
the *virtual* local position ``searchsorted(shard positions, its global position)`` (its own column when the
shard holds it), and for a shard item at local column ``p``, ``global(p) >= global(t)`` exactly when
``p >= virtual(t)``: the ``t_pos <= p`` rule of the count, and the binary search over the thresholds (their
virtual positions are sorted as their global ones), are unchanged. The key brackets of a threshold take its
item's canonical squared norm from the rank that holds it (a bracket depends only on the threshold's distance,
its query and that norm); the key tolerance is the shard's, a rigorous bound on the keys this shard computes
(and far above the float64 error of the bracket that a near-duplicate's widening covers). So an item is
counted as certainly before or after a threshold only when it is, each rank's count is exact, and so is their
sum. Every rank enters the same collectives: the number of rounds is the largest over ranks (one
``all_reduce``, which also gives the largest n(q), hence the one-process width ``m`` of the ranks).

Memory: the thresholds of a visiting block (all ranks' blocks together: at most ``BUDGET_ENTRIES / P``
thresholds, and as many listed pairs: ``1 / P`` of one process's) plus one block of keys, and the shard's float32 stage
rows, made once for every round (a ``GalleryCache``); its float64 rows are read on demand, never copied. Only
blocks of queries, threshold lists and counts travel, never a gallery shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._label_pairs import relevant_pairs
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._ranks import plan as ranks_plan
from torchmetrics_retrieval.functional._ranks.count import _count_before, _Thresholds
from torchmetrics_retrieval.functional._search.problem import GalleryCache, Problem, make_problem
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, restrict_gallery
from torchmetrics_retrieval.metrics._sharded.rounds import Visit, visiting_rounds

__all__ = ["ShardedRanks", "shard_counts", "shard_thresholds"]


class ShardedRanks:
    """``relevant_ranks`` of this rank's queries ``queries`` (rows of ``shards.qg``) over a sharded set: a
    ``RanksFn`` of ``functional._beyond_k``, which every rank calls with the same arguments in the same order."""

    def __init__(self, shards: ShardedSet, options: RetrievalOptions, n_relevant: Tensor, queries: Tensor) -> None:
        qg, local, owner, row, group = shards
        self.qg, self.local, self.row, self.options, self.group = qg, local, row, options, group
        self.n_relevant, self.queries = n_relevant, queries  # n(q) of every query of ``qg``; this rank's rows
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        # this rank's gallery columns (global gallery positions, increasing: ``nonzero`` sorts them)
        self.gallery = torch.nonzero(owner[qg.gallery_positions] == self.rank).flatten()
        self.shard = restrict_gallery(qg, self.gallery, local[row[qg.gallery_positions[self.gallery]]])
        # the shard's norms and float32 stage rows, made once for every round (its float64 rows read on demand)
        self.cache = GalleryCache(keep_rows=True)

    def __call__(self, rows: Tensor, max_relevant: int | None, last: bool) -> Tensor:
        """``(len(rows), m)`` ranks of the queries ``queries[rows]``, as ``relevant_ranks`` returns them; ``m``
        from the largest n(q) of every rank's queries, so that it is the one-process width."""
        queries, device = self.queries[rows], self.local.device
        n_relevant = self.n_relevant[queries]
        largest = torch.tensor([int(n_relevant.max()) if n_relevant.numel() else 0], device=device)
        all_reduce(largest, self.group, dist.ReduceOp.MAX)
        n_max = int(largest)
        if n_max == 0:  # no relevant item anywhere: the same on every rank, so no rank enters a round
            return torch.zeros((queries.numel(), 0), dtype=torch.long, device=device)
        m = 1 if last else n_max if max_relevant is None else min(max_relevant, n_max)
        # all ranks' visiting blocks together hold 1/P of the one-process budget of thresholds per query chunk:
        # every rank holds the thresholds of every visiting query, so a rank's share of the memory is then 1/P
        block = max(1, ranks_plan.BUDGET_ENTRIES // ((n_max + 1) * self.world**2))
        rounds = visiting_rounds(queries.numel(), block, self.group, device)
        return torch.cat([self._round(visit, queries[visit.mine], m, last) for visit in rounds])

    def _round(self, visit: Visit, mine: Tensor, m: int, last: bool) -> Tensor:
        """The ranks of this rank's block ``mine`` (rows of ``qg``), while every rank's block visits."""
        qg, group, device = self.qg, self.group, self.local.device
        visiting_rows = visit.join(mine)
        visiting = visit.join(self.local[self.row[qg.query_positions[mine]]])
        n_visiting = visiting.shape[0]
        problem: Problem | None = None
        listed = torch.zeros((0, 4), dtype=torch.float64, device=device)
        if n_visiting and self.gallery.numel():
            sub = self.shard.take(visiting_rows)._replace(query=visiting)
            problem = make_problem(
                sub.query, sub.gallery, self.options.distance, sub.exclusions(), False, lazy64=True,
                gallery_cache=self.cache,
            )  # fmt: skip
            listed = shard_thresholds(sub, problem, self.gallery, self.options, m, last)
        pairs = torch.cat(gather(listed, group))  # every shard's: per query, its gallery's first m (or last)
        filled = torch.bincount(pairs[:, 0].long(), minlength=n_visiting).clamp(max=m)  # min(n(q), m)
        before = torch.zeros((n_visiting, m), dtype=torch.long, device=device)
        if problem is not None:
            before = shard_counts(problem, self.gallery, pairs, self.options, m, last)
        all_reduce(before, group)  # the items before each threshold, over every shard
        known = torch.arange(m, device=device)[None, :] < filled[visit.ours, None]
        return torch.where(known, before[visit.ours] + 1, 0)


def shard_thresholds(
    sub: QueryGallery, problem: Problem, gallery: Tensor, options: RetrievalOptions, m: int, last: bool
) -> Tensor:
    """``(P, 4)`` float64 rows (query row, distance, global gallery position, canonical squared norm): the first
    ``m`` (``last``: the last) relevant items of each query of ``sub`` in a gallery shard (``problem``'s gallery,
    whose columns are the global positions ``gallery``). A query's first ``m`` over its whole gallery are among
    the union of its shards' first ``m``. One float64 table travels in one gather: the rows and positions are
    exact below 2**53, and any distance dtype is exact in float64."""
    every = torch.arange(problem.query.shape[0], device=gallery.device)
    pair_rows, pair_cols = relevant_pairs(sub, problem, every, options.label_comparison_fn)
    own = _Thresholds(problem, every, pair_rows, pair_cols, m, False, last)
    rows, slots = torch.nonzero(torch.arange(m, device=every.device)[None, :] < own.filled[:, None], as_tuple=True)
    cols = own.positions[rows, slots]
    columns = (rows, own.distances[rows, slots], gallery[cols], problem.gallery_sq64[cols])
    return torch.stack([c.to(torch.float64) for c in columns], dim=1)


def shard_counts(
    problem: Problem, gallery: Tensor, pairs: Tensor, options: RetrievalOptions, m: int, last: bool
) -> Tensor:
    """``(Q, m)`` int64: the eligible items of a gallery shard (``problem``'s, at the global positions
    ``gallery``, increasing) strictly before each query's thresholds, from every shard's
    :func:`shard_thresholds` ``pairs``. Each threshold takes its virtual position in the shard (see the module
    docstring); its tie order among equal distances is its global position's."""
    n_query = problem.query.shape[0]
    if not pairs.shape[0]:
        return torch.zeros((n_query, m), dtype=torch.long, device=gallery.device)
    pairs = pairs[torch.argsort(pairs[:, 2], stable=True)]  # equal distances of a query in global position order
    virtual = torch.searchsorted(gallery, pairs[:, 2].long())
    every = torch.arange(n_query, device=gallery.device)
    listed = (pairs[:, 1].to(problem.dtype), pairs[:, 3])
    thresholds = _Thresholds(problem, every, pairs[:, 0].long(), virtual, m, False, last, listed)
    # contiguous: a collective on a strided view (the count's columns) would not sum into it
    return _count_before(problem, every, thresholds, options.chunk_size).contiguous()
