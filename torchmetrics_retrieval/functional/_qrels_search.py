"""The searches of :func:`~torchmetrics_retrieval.functional.qrels.qrels_metrics`, on the package's engines, over
a corpus held in blocks (and, under DDP, in shards: ``metrics/_sharded/qrels.py``).

Why blocks: the engine's stage-1 rows of a cosine gallery are a float32 normalised copy of it (1.4 GiB for a 1M x
384 corpus), and the full-ranking count reads them too. A block of at most ``CORPUS_BLOCK_BYTES`` is searched at a
time, so that copy is one block's; the lists of the blocks are merged by (canonical distance, global position),
which is the top K of one exact search over the whole corpus, bit for bit (the blocks' lists are exact over their
rows, with exact distances). The same merge joins the shards of several processes.

* :meth:`BlockedCorpus.top`: the exact top ``width`` of query rows.
* :func:`ranked_chunks`: query chunk by query chunk, ``depth + 1`` deep (the extra rank tells whether the last
  cutoff lies inside a tie). With ``close_ties`` the rows whose tie group at the deepest cutoff runs past the list
  are searched again twice as deep until it closes, so that the group is whole.
* :meth:`BlockedCorpus.first_relevant_rr`: the reciprocal rank of the first relevant document of queries whose
  list does not hold it: each block lists its relevant judged documents with their canonical distances (few),
  and counts its items ranked before the best of them (``_ranks.count``); counts are additive over blocks and
  shards, and a threshold takes its *virtual* position in a block (``searchsorted`` of its global position), so the
  tie order by global position holds (``metrics/_sharded/ranks.py`` says why this is exact). For
  ``ties="expected"`` two counts, of the items strictly closer and of those not farther, give the tie group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._qrels_inputs import QrelsTable
from torchmetrics_retrieval.functional._qrels_values import expected_reciprocal_rank
from torchmetrics_retrieval.functional._ranks.count import _count_before, _Thresholds
from torchmetrics_retrieval.functional._search.certify import canonical_distances, order_by_distance_then_position
from torchmetrics_retrieval.functional._search.half_rows import values_dtype
from torchmetrics_retrieval.functional._search.problem import GalleryCache, Problem, make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions, KNNResult

__all__ = ["LOCAL", "BlockedCorpus", "Collectives", "ranked_chunks"]

#: Largest (rows, L) neighbour table (and the per-slot float64 temporaries of the values) per query chunk.
TABLE_BYTES = 64 * 2**20
_SLOT_BYTES = 8 * 12  # distances, indices, grades, and about nine float64 temporaries per slot
#: Float32 bytes of one corpus block. The search of a block holds about twice its float32 rows (the engine's stage
#: copy of a cosine gallery and its buffers) over a fixed ~350 MiB (measured at 1M x 384 with 128 and 384 MiB
#: blocks: 602 and 990 MiB peaks), so 128 MiB blocks keep a 1M x 384 corpus within 1 GiB over the embeddings.
CORPUS_BLOCK_BYTES = 128 * 2**20
#: A corpus of at most this many float32 bytes is searched as one block (within the same budget): a single list
#: needs no exact distances and no merge, the fast path of a corpus of a few hundred thousand rows.
SINGLE_BLOCK_BYTES = 320 * 2**20


class Collectives(NamedTuple):
    """How the processes that hold the corpus shards meet: ``gather`` every process's tensor (in rank order) and
    ``all_reduce`` a sum in place. Every process calls them in the same order."""

    gather: Callable[[Tensor], list[Tensor]]
    all_reduce: Callable[[Tensor], object]


#: One process holds the whole corpus.
LOCAL = Collectives(lambda tensor: [tensor], lambda tensor: tensor)


def _merge(lists: list[tuple[Tensor, Tensor, Tensor]], width: int) -> KNNResult:
    """The ``width`` best of ``(distances, global positions, valid)`` candidate lists of the same rows, by
    (distance, global position), empty slots last."""
    distances, items, valid = (torch.cat(column, dim=1) for column in zip(*lists, strict=True))
    distances = distances.masked_fill(~valid, float("inf"))
    items = items.masked_fill(~valid, torch.iinfo(torch.int32).max)
    order = order_by_distance_then_position(distances, items, min(width, distances.shape[1]))
    valid = valid.gather(1, order)
    return KNNResult(distances.gather(1, order), items.gather(1, order).masked_fill(~valid, 0), valid)


class BlockedCorpus:
    """The corpus rows this process holds, searched block by block.

    Args:
        query: every query, ``(Q, D)``.
        corpus: this process's rows, ``(n, D)`` (the whole corpus on one process).
        gallery: their global positions ``(n,)``, increasing (so that a tie order by local position is the global one).
        self_global: per query, the global position of its own document (-1: none), or None.
        n_corpus: the size of the whole corpus.
    """

    def __init__(
        self,
        query: Tensor,
        corpus: Tensor,
        gallery: Tensor,
        self_global: Tensor | None,
        n_corpus: int,
        distance: str,
        backend: str,
        chunk_size: int | None,
        collectives: Collectives = LOCAL,
    ) -> None:
        self.query, self.corpus, self.gallery, self.n_corpus = query, corpus, gallery, n_corpus
        self.distance, self.backend, self.chunk_size, self.collectives = distance, backend, chunk_size, collectives
        row_bytes = 4 * max(1, corpus.shape[1])
        one = corpus.shape[0] * row_bytes <= max(SINGLE_BLOCK_BYTES, CORPUS_BLOCK_BYTES)
        step = max(1, corpus.shape[0] if one else CORPUS_BLOCK_BYTES // row_bytes)
        self.blocks = [slice(start, min(start + step, corpus.shape[0])) for start in range(0, corpus.shape[0], step)]
        # each block's norms, computed once for every search and count of it; one block's stage rows too (the
        # stage copy the budget allows: the whole corpus's when it is one block)
        self.caches = {block.start: GalleryCache(keep_rows=len(self.blocks) == 1) for block in self.blocks}
        self.self_local = None  # the query's own document as a local row of this process (-1: held elsewhere)
        if self_global is not None and gallery.numel():
            at = torch.searchsorted(gallery, self_global).clamp(max=gallery.numel() - 1)
            self.self_local = torch.where((self_global >= 0) & (gallery[at] == self_global), at, -1)
        self.n_eligible = torch.full((query.shape[0],), n_corpus, dtype=torch.long, device=query.device)
        if self_global is not None:
            self.n_eligible -= (self_global >= 0).long()

    def problem(self, rows: Tensor, block: slice) -> Problem:
        """The search problem of the queries ``rows`` against one block (its own rows' exclusion remapped)."""
        own = None
        if self.self_local is not None:
            local = self.self_local[rows]
            inside = (local >= block.start) & (local < block.stop)
            own = torch.where(inside, local - block.start, -1) if bool(inside.any()) else None
        exclusions = Exclusions(self_index=own, sequence_ids=None, search_groups=None)
        names = ("query", "corpus")
        return make_problem(
            self.query[rows], self.corpus[block], self.distance, exclusions, False, names, lazy64=True,
            gallery_cache=self.caches[block.start],
        )  # fmt: skip

    def top(self, rows: Tensor, width: int) -> KNNResult:
        """The exact top ``width`` of the queries ``rows`` over the whole corpus (every block of every process)."""
        n, device = rows.numel(), rows.device
        best: tuple[Tensor, Tensor, Tensor] | None = None
        # exact distances when lists of different blocks (or processes) are compared by them; one list alone keeps
        # the engine's cheaper ones (only near ties recomputed: the same order, and equal exactly when the exact
        # ones are, ``certify.rank``), which are all its values read
        exact = len(self.blocks) > 1 or self.collectives is not LOCAL
        for block in self.blocks if n else ():
            problem = self.problem(rows, block)
            search = Search.prepare(
                problem, width, backend=self.backend, chunk_size=self.chunk_size, exact_distances=exact
            )
            found = search(torch.arange(n, device=device))
            listed = (found.distances, self.gallery[block][found.indices], found.valid)
            best = listed if best is None else _merge([best, listed], width)
        if best is None:  # no row here (or no query)
            best = (
                torch.zeros((n, 0), dtype=values_dtype(self.query), device=device),
                torch.zeros((n, 0), dtype=torch.long, device=device),
                torch.zeros((n, 0), dtype=torch.bool, device=device),
            )
        if self.collectives is LOCAL:
            return KNNResult(*best)
        return _merge(
            [tuple(column) for column in zip(*(self.collectives.gather(c) for c in best), strict=True)], width
        )

    def first_relevant_rr(self, rows: Tensor, table: QrelsTable, level: int, expected: bool) -> Tensor:
        """``(R,)`` float64 reciprocal rank of the first relevant document of the queries ``rows`` in their whole
        ranking (0 without an eligible relevant document in the corpus)."""
        pair_rows, pair_cols = table.relevant_pairs(rows, level)  # global positions
        n, device = rows.numel(), rows.device
        every = torch.arange(n, device=device)
        listed = [torch.zeros((0, 4), dtype=torch.float64, device=device)]
        for block in self.blocks:  # (row, canonical distance, global position, squared norm) of the pairs held
            problem, gallery = self.problem(rows, block), self.gallery[block]
            at = torch.searchsorted(gallery, pair_cols).clamp(max=gallery.numel() - 1)
            mine = gallery[at] == pair_cols
            if problem.exclusions.self_index is not None:  # the query's own document is not in its ranking
                mine &= at != problem.exclusions.self_index[pair_rows]
            r, c = pair_rows[mine], at[mine]
            d = canonical_distances(problem, every, r, c).to(problem.dtype)
            columns = (r, d, pair_cols[mine], problem.gallery_sq64[c])
            listed.append(torch.stack([x.to(torch.float64) for x in columns], dim=1))
        pairs = torch.cat(self.collectives.gather(torch.cat(listed)))
        pairs = pairs[torch.argsort(pairs[:, 2], stable=True)]  # equal distances of a query in global order
        found = torch.bincount(pairs[:, 0].long(), minlength=n) > 0
        if not expected:  # by (distance, position), the order of the lists
            return torch.where(found, 1.0 / (self._before(rows, pairs, None) + 1).to(torch.float64), 0.0)
        # the threshold's position decides the items at its very distance: before all of them, then after all
        closer, not_farther = self._before(rows, pairs, -1), self._before(rows, pairs, self.n_corpus)
        best = torch.full((n,), float("inf"), dtype=torch.float64, device=device)
        best = best.scatter_reduce(0, pairs[:, 0].long(), pairs[:, 1], reduce="amin")
        tied_relevant = torch.bincount(pairs[:, 0].long()[pairs[:, 1] == best[pairs[:, 0].long()]], minlength=n)
        at = torch.nonzero(found).flatten()
        rr = torch.zeros(n, dtype=torch.float64, device=device)
        rr[at] = expected_reciprocal_rank(closer[at], (not_farther - closer)[at], tied_relevant[at])
        return rr

    def _before(self, rows: Tensor, pairs: Tensor, position: int | None) -> Tensor:
        """``(R,)`` eligible items before each query's best pair (at ``position`` instead of its own, if given),
        summed over the blocks and the processes."""
        n = rows.numel()
        every = torch.arange(n, device=rows.device)
        counts = torch.zeros((n, 1), dtype=torch.long, device=rows.device)
        global_position = pairs[:, 2].long() if position is None else torch.full_like(pairs[:, 2].long(), position)
        for block in self.blocks if pairs.shape[0] else ():
            problem = self.problem(rows, block)
            virtual = torch.searchsorted(self.gallery[block], global_position)
            listed = (pairs[:, 1].to(problem.dtype), pairs[:, 3])
            thresholds = _Thresholds(problem, every, pairs[:, 0].long(), virtual, 1, False, False, listed)
            counts += _count_before(problem, every, thresholds, self.chunk_size)
        self.collectives.all_reduce(counts)
        return counts[:, 0]


def _open_rows(found: KNNResult, depth: int, n_eligible: Tensor) -> Tensor:
    """Rows whose tie group at rank ``depth`` may run past the list (positions in the chunk)."""
    width = found.distances.shape[1]
    if width == 0:
        return torch.zeros(0, dtype=torch.long, device=found.distances.device)
    last = min(depth, width) - 1
    same = found.distances[:, last] == found.distances[:, width - 1]
    return torch.nonzero(found.valid[:, width - 1] & same & (n_eligible > width)).flatten()


def _padded(result: KNNResult, width: int) -> KNNResult:
    extra = width - result.distances.shape[1]
    if extra <= 0:
        return result
    rows = result.distances.shape[0]
    return KNNResult(
        torch.cat([result.distances, result.distances.new_full((rows, extra), float("inf"))], dim=1),
        torch.cat([result.indices, result.indices.new_zeros((rows, extra))], dim=1),
        torch.cat([result.valid, result.valid.new_zeros((rows, extra))], dim=1),
    )


def ranked_chunks(corpus: BlockedCorpus, depth: int, close_ties: bool) -> Iterator[tuple[Tensor, KNNResult, Tensor]]:
    """``(query positions, their ranked lists, complete)`` chunk by chunk: lists at least ``depth + 1`` deep (or the
    whole eligible corpus), nearest first, items as global positions; ``complete`` ``(R,)``: the list holds every
    eligible item of the row. Every process walks the same chunks (the queries are every process's)."""
    n_query, n_corpus = corpus.query.shape[0], corpus.n_corpus
    cap = min(n_corpus, int(corpus.n_eligible.max()) if n_query else 0)  # no list is longer than this
    width = min(depth + 1, cap)
    rows_per_chunk = max(1, TABLE_BYTES // (max(1, width) * _SLOT_BYTES))
    for rows in torch.arange(n_query, device=corpus.query.device).split(rows_per_chunk):
        found = corpus.top(rows, width)
        eligible = corpus.n_eligible[rows]
        open_rows = _open_rows(found, depth, eligible) if close_ties else rows[:0]
        deeper = found.distances.shape[1]
        while open_rows.numel():  # rare: a tie group across the deepest cutoff; the list doubles until it closes
            deeper = min(2 * deeper, cap)
            more = corpus.top(rows[open_rows], deeper)
            found = _padded(found, more.distances.shape[1])
            more = _padded(more, found.distances.shape[1])
            found = KNNResult(*(whole.index_copy(0, open_rows, part) for whole, part in zip(found, more, strict=True)))
            still = _open_rows(KNNResult(*(t[open_rows] for t in found)), depth, eligible[open_rows])
            open_rows = open_rows[still]
        yield rows, found, found.valid.sum(dim=1) >= eligible
