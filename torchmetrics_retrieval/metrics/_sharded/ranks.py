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

A set against itself with every query ranked (``map``, ``minp``), whose thresholds one process holds at once,
is counted as one process counts it: symmetrically, each pair's key computed once for both its queries. The
thresholds of every query are listed in the rounds (step 1) and every rank keeps them all; the ranks share out one
process's symmetric key tiles (``keys.ShardedKeys``), each tile counting the items of its columns for its rows'
queries and those of its rows for its columns' queries; the near ties' rows are fetched from their owners and
their canonical distances compared; the per-query histograms are summed. A rank then computes about ``1 / P`` of
one process's products instead of ``2 / P`` (every query against its shard), and holds one process's thresholds.

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
from torchmetrics_retrieval.functional._ranks.count import _count_before, _Counter, _Thresholds, count_blocks
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.problem import GalleryCache, Problem, make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import _dense_label_ids
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, placeholder_problem, restrict_gallery
from torchmetrics_retrieval.metrics._sharded.keys import ShardedKeys
from torchmetrics_retrieval.metrics._sharded.rounds import Visit, visiting_rounds
from torchmetrics_retrieval.metrics._sharded.tiles import fetch_rows

__all__ = ["ShardedRanks", "shard_counts", "shard_thresholds"]

#: The bytes of rows fetched at a time to compute the near ties' distances (two rows per pair of every rank, at
#: most): each fetch is an all-gather, and small ones, of near ties spread over the whole set, fetched most of the
#: set again and again (a symmetric count at N = 20k meets about 150k near ties).
PAIR_FETCH_BYTES = 64 * 2**20


class ShardedRanks:
    """``relevant_ranks`` of this rank's queries ``queries`` (rows of ``shards.qg``) over a sharded set: a
    ``RanksFn`` of ``functional._beyond_k``, which every rank calls with the same arguments in the same order."""

    def __init__(self, shards: ShardedSet, options: RetrievalOptions, n_relevant: Tensor, queries: Tensor) -> None:
        qg, local, owner, row, group = shards
        self.shards, self.qg, self.local, self.row, self.options, self.group = shards, qg, local, row, options, group
        self.n_relevant, self.queries = n_relevant, queries  # n(q) of every query of ``qg``; this rank's rows
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        # this rank's gallery columns (global gallery positions, increasing: ``nonzero`` sorts them)
        self.gallery = torch.nonzero(owner[qg.gallery_positions] == self.rank).flatten()
        self.shard = restrict_gallery(qg, self.gallery, local[row[qg.gallery_positions[self.gallery]]])
        # the shard's norms and float32 stage rows, made once for every round (its float64 rows read on demand)
        self.cache = GalleryCache(keep_rows=True)
        self.symmetric = placeholder_problem(qg, options.distance).symmetric  # the set against itself

    def __call__(self, rows: Tensor, max_relevant: int | None, last: bool) -> Tensor:
        """``(len(rows), m)`` ranks of the queries ``queries[rows]``, as ``relevant_ranks`` returns them; ``m``
        from the largest n(q) of every rank's queries, so that it is the one-process width."""
        queries, device = self.queries[rows], self.local.device
        n_relevant = self.n_relevant[queries]
        # the largest n(q), and whether a rank asks for fewer than all its queries (then not every query is asked)
        found = torch.tensor([int(n_relevant.max()) if n_relevant.numel() else 0, self.queries.numel() - rows.numel()])
        n_max, partial = (int(v) for v in all_reduce(found.to(device), self.group, dist.ReduceOp.MAX))
        if n_max == 0:  # no relevant item anywhere: the same on every rank, so no rank enters a round
            return torch.zeros((queries.numel(), 0), dtype=torch.long, device=device)
        m = 1 if last else n_max if max_relevant is None else min(max_relevant, n_max)
        # every query's thresholds at once, as one process counts the set against itself (``relevant_ranks``)
        if self.symmetric and not partial and max(1, ranks_plan.BUDGET_ENTRIES // (n_max + 1)) >= len(self.n_relevant):
            return self._symmetric(n_max, m, last)[queries]
        rounds = visiting_rounds(queries.numel(), self._block(n_max), self.group, device)
        return torch.cat([self._round(visit, queries[visit.mine], m, last) for visit in rounds])

    def _block(self, n_max: int) -> int:
        """The queries of a rank's visiting block: all ranks' visiting blocks together hold 1/P of the one-process
        budget of thresholds per query chunk (every rank holds the thresholds of every visiting query, so a rank's
        share of the memory is then 1/P)."""
        return max(1, ranks_plan.BUDGET_ENTRIES // ((n_max + 1) * self.world**2))

    def _visitors(self, visit: Visit, mine: Tensor, m: int, last: bool) -> tuple[Tensor, Problem | None, Tensor]:
        """``(visiting rows, problem, pairs)`` of a round in which this rank's block ``mine`` (rows of ``qg``)
        visits with every rank's: the visitors' rows of ``qg``, the problem of the visitors against this rank's
        shard (None without a visitor or an item), and every shard's ``shard_thresholds`` of the visitors."""
        visiting_rows = visit.join(mine)
        visiting = visit.join(self.local[self.row[self.qg.query_positions[mine]]])
        problem: Problem | None = None
        listed = torch.zeros((0, 4), dtype=torch.float64, device=self.local.device)
        if visiting.shape[0] and self.gallery.numel():
            sub = self.shard.take(visiting_rows)._replace(query=visiting)
            problem = make_problem(
                sub.query, sub.gallery, self.options.distance, sub.exclusions(), False, lazy64=True,
                gallery_cache=self.cache,
            )  # fmt: skip
            listed = shard_thresholds(sub, problem, self.gallery, self.options, m, last)
        return visiting_rows, problem, torch.cat(gather(listed, self.group))

    def _round(self, visit: Visit, mine: Tensor, m: int, last: bool) -> Tensor:
        """The ranks of this rank's block ``mine`` (rows of ``qg``), while every rank's block visits."""
        visiting_rows, problem, pairs = self._visitors(visit, mine, m, last)
        n_visiting, device = visiting_rows.numel(), self.local.device
        filled = torch.bincount(pairs[:, 0].long(), minlength=n_visiting).clamp(max=m)  # min(n(q), m)
        before = torch.zeros((n_visiting, m), dtype=torch.long, device=device)
        if problem is not None:
            before = shard_counts(problem, self.gallery, pairs, self.options, m, last)
        all_reduce(before, self.group)  # the items before each threshold, over every shard
        known = torch.arange(m, device=device)[None, :] < filled[visit.ours, None]
        return torch.where(known, before[visit.ours] + 1, 0)

    def _symmetric(self, n_max: int, m: int, last: bool) -> Tensor:
        """``(N, m)`` ranks of every query of the set against itself, counted as one process counts them: every
        query's thresholds (listed in the visiting rounds, then held by every rank), and one process's symmetric
        key tiles shared out over the ranks (``keys.ShardedKeys``), each tile counting its rows' and its columns'
        items; the histograms are summed over the ranks."""
        device, every = self.local.device, torch.arange(len(self.n_relevant), device=self.local.device)
        listed = []
        for visit in visiting_rounds(self.queries.numel(), self._block(n_max), self.group, device):
            visiting_rows, _, pairs = self._visitors(visit, self.queries[visit.mine], m, last)
            listed.append(torch.cat([visiting_rows[pairs[:, 0].long()][:, None].to(pairs.dtype), pairs[:, 1:]], 1))
        pairs = torch.cat(listed)
        pairs = pairs[torch.argsort(pairs[:, 2], stable=True)]  # equal distances of a query in position order
        keys = ShardedKeys(self.shards, self.options.distance, self.options.chunk_size)
        problem, dim = keys.problem, self.local.shape[1]
        own = (pairs[:, 1].to(problem.dtype), pairs[:, 3])
        thresholds = _Thresholds(problem, every, pairs[:, 0].long(), pairs[:, 2].long(), m, True, last, own, dim)
        thresholds.n_listed = self.n_relevant  # (every shard listed its first m only)
        qg = self.qg
        label_ids = None if self.options.label_comparison_fn else _dense_label_ids(qg.query_labels, qg.gallery_labels)
        counter = _Counter(problem, every, thresholds, label_ids)
        count_blocks(counter, problem, every, keys.key_blocks())
        pair_rows, pair_cols = counter.ambiguous()
        counter.add_exact(self._reported(pair_rows, pair_cols, problem.dtype), pair_rows, pair_cols)
        if self.rank == 0:  # (the skipped relevant items are counted once)
            counter.add_skipped()
        all_reduce(counter.hist, self.group)
        known = torch.arange(m, device=device)[None, :] < thresholds.filled[:, None]
        return torch.where(known, counter.before() + 1, 0)

    def _reported(self, pair_rows: Tensor, pair_cols: Tensor, dtype: torch.dtype) -> Tensor:
        """The reported distances of this rank's pairs (query rows, gallery columns of ``qg``), each computed pair
        by pair from the two rows, fetched from their owners ``PAIR_FETCH_BYTES`` at a time (a collective: every
        rank enters it, with or without pairs)."""
        qg, device = self.qg, self.local.device
        out = torch.empty(pair_rows.numel(), dtype=dtype, device=device)
        row_bytes = max(1, self.local.shape[1]) * self.local.element_size()
        block = max(1, PAIR_FETCH_BYTES // (2 * self.world * row_bytes))
        for visit in visiting_rounds(pair_rows.numel(), block, self.group, device):
            query, item = qg.query_positions[pair_rows[visit.mine]], qg.gallery_positions[pair_cols[visit.mine]]
            positions = torch.unique(visit.join(torch.cat([query, item])))
            rows = fetch_rows(self.shards, self.local, positions)
            problem = make_problem(rows, rows, self.options.distance, Exclusions(None, None, None), False)
            at = torch.searchsorted(positions, torch.stack([query, item]))
            out[visit.mine] = canonical_distances(problem, torch.arange(len(rows)), at[0], at[1]).to(dtype)
        return out


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
