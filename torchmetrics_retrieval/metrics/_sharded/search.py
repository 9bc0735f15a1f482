"""The exact top K of every query when each rank holds a shard of the set: the search half of sharded mode.

Every candidate list a rank makes is exact over the gallery items it saw (canonical distances, ties by global
position), and the lists of a query cover its whole gallery, so merging them by (distance, global position)
gives the top K of one search over the whole set, bit for bit.

* :func:`symmetric_top_k` - a set searched against itself (every sample a query and a gallery item), as in
  most validation loops. Each pair of samples is computed once across all ranks, as the one-process symmetric
  search computes it once: a rank searches its own shard against itself, and in ``P // 2`` rounds one side of
  a pair of shards visits the rank holding the other, block by block, in a bipartite pass
  (``make_problem(split=...)``) that serves both shards' queries; the visitors' candidates go back to their
  owner. Each sample enters that pass capped at its K-th distance among the shards it has met so far (its own
  first; ``Problem.caps``): nothing farther can enter its top K, so the pass starts from those thresholds
  instead of a sample, and later rounds start lower. With an even ``P`` the two shards ``P / 2`` apart split
  their rectangle in halves. So every rank does ``1 / P`` of the products; it holds its own shard, the pass of its
  own search, and bipartite passes of at most ``VISIT_ROWS`` rows (a visiting block of at most half of them, and
  its searched rows a block at a time), the next visiting block in flight. Every rank takes a round in the same
  number of steps, each a share of its visitors, so that a step costs every rank alike.
  A cross-modal set (``is_b``: A samples against B ones) takes the same passes: its own pass is the bipartite
  pass of its A rows against its B rows, and in ``P - 1`` rounds every other rank's B rows visit its A rows.
* :func:`one_sided_top_k` - queries and gallery apart (``is_query``/``is_gallery``): each rank's next block
  of queries is all-gathered and searched by every rank against its gallery shard.

Only ``torch.distributed`` collectives and point-to-point operations that both gloo and NCCL implement are used.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import _search
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.certify import order_by_distance_then_position
from torchmetrics_retrieval.functional._search.compiled.order import merge_sorted
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import KNNResult, consecutive_start
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.metrics._sharded.faults import broken, checkpoint, communicating
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, restrict_gallery
from torchmetrics_retrieval.metrics._sharded.rounds import visiting_rounds

__all__ = ["QUERY_BLOCK", "VISIT_ROWS", "one_sided_top_k", "symmetric_fits", "symmetric_top_k"]

#: Queries of one rank searched per round of :func:`one_sided_top_k` (each round all-gathers one block per rank).
QUERY_BLOCK = 4096
#: Rows of one bipartite pass of :func:`symmetric_top_k` (at most half of them visiting, from another rank).
VISIT_ROWS = 16384

#: Tags of the point-to-point messages: embeddings of visiting rows, candidates going home.
_EMBEDDINGS, _CANDIDATES = 1, 2
#: ``(distances (R, K), global gallery rows (R, K), valid (R, K))``
Found = tuple[Tensor, Tensor, Tensor]
#: ``(global rows (R,), embeddings (R, D), caps (R,))``: samples entering a bipartite pass
Samples = tuple[Tensor, Tensor, Tensor]


def _subset(qg: QueryGallery, rows: Tensor, embeddings: Tensor) -> QueryGallery:
    """The samples ``rows`` (sorted) of a set searched against itself, as a set of their own."""
    return restrict_gallery(qg.take(rows), rows, embeddings)._replace(query=embeddings, same_set=True)


def _empty(n: int, k: int, like: Tensor) -> Found:
    return (
        torch.full((n, k), math.inf, dtype=like.dtype, device=like.device),
        torch.zeros((n, k), dtype=torch.long, device=like.device),
        torch.zeros((n, k), dtype=torch.bool, device=like.device),
    )


def _padded(found: KNNResult, k: int, gallery_rows: Tensor, like: Tensor) -> Found:
    """A search's result widened to ``k`` columns, its items as global rows ``gallery_rows[index]``."""
    distances, items, valid = _empty(found.indices.shape[0], k, like)
    width = found.indices.shape[1]
    distances[:, :width], valid[:, :width] = found.distances, found.valid
    items[:, :width] = gallery_rows[found.indices] if gallery_rows.numel() else 0
    return distances, items, valid


def merge(candidates: Found, k: int) -> Found:
    """The ``k`` best of candidate lists side by side, ordered by (distance, gallery row) as one exact search."""
    distances, items, valid = candidates
    # an empty slot sorts after every item at its (infinite) distance: one sort on a combined key when the rows fit
    # its 31 bits (``order_by_distance_then_position``)
    distances = distances.masked_fill(~valid, math.inf)
    items = items.masked_fill(~valid, torch.iinfo(torch.int32).max)
    order = order_by_distance_then_position(distances, items, k)
    return torch.gather(distances, 1, order), torch.gather(items, 1, order), torch.gather(valid, 1, order)


def _merge_two(first: Found, second: Found, k: int) -> Found:
    """:func:`merge` of two candidate lists whose rows are sorted (a search's or a merge's): one pass of the compiled
    kernels over each row where they serve, instead of a sort of both."""
    distances = first[0]
    if plan.use_compiled(distances.device, distances.shape[0], distances.shape[1] + second[0].shape[1]):
        return merge_sorted(first, second, k)
    return merge(_joined([first, second], dim=1), k)


def _fold(best: Found, rows: slice, found: Found, k: int) -> None:
    """Merge ``found``, candidates of the rows ``rows`` of ``best``, into ``best`` in place: a rank keeps one list
    per row, never a list per shard it met."""
    merged = _merge_two((best[0][rows], best[1][rows], best[2][rows]), found, k)
    for column, part in zip(best, merged, strict=True):
        column[rows] = part


def _local_rows(local: Tensor, rows: Tensor) -> Tensor:
    """``local[rows]``, without a copy when ``rows`` are every local row in order (the usual layout of a shard)."""
    return local if rows.numel() == local.shape[0] and consecutive_start(rows) == 0 else local[rows]


def _kth(found: Found) -> Tensor:
    """Each row's K-th distance among its candidates (+inf when it has fewer): nothing farther can enter its top
    K, so it caps the row's later searches (``Problem.caps``)."""
    distances, _, valid = found
    if not distances.shape[1]:
        return distances.new_full((distances.shape[0],), math.inf)
    return distances[:, -1].masked_fill(~valid[:, -1], math.inf)


def _peer(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _post(send: list[Tensor], to: int, receive: list[Tensor], source: int, group: Any, tag: int) -> list[Any]:
    """Start sending ``send`` to rank ``to`` and receiving ``receive`` (filled in place) from ``source``, as one
    batch (NCCL runs a batch's sends and receives together: two ranks sending to each other cannot deadlock).

    Callers post only right after a checkpoint that every rank passed (``faults.checkpoint``), with nothing that
    can fail in between: every message posted is then matched by its peer, and can be waited for on an error."""
    ops = [dist.P2POp(dist.isend, t, _peer(group, to), group, tag) for t in send if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, _peer(group, source), group, tag) for t in receive if t.numel()]
    with communicating():
        return dist.batch_isend_irecv(ops) if ops else []


def _wait(works: list[Any]) -> None:
    """Wait for posted messages (an error here is the communication's: no checkpoint follows it)."""
    with communicating():
        for work in works:
            work.wait()


def _blocks(n: int, parts: int | None = None, most: int | None = None) -> list[slice]:
    """``n`` rows in ``parts`` equal blocks; by default as few as hold at most ``most`` rows each (by default
    ``VISIT_ROWS / 2``, read at the call: a visiting block fills half a pass)."""
    size = math.ceil(n / (parts or math.ceil(n / max(1, most or VISIT_ROWS // 2)))) if n else 1
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _bipartite(
    qg: QueryGallery, left: Samples, right: Samples, options: RetrievalOptions, k: int
) -> tuple[Found, Found]:
    """Exact top ``k`` of two disjoint sets of samples each against the other, from one bipartite symmetric pass:
    each sample's candidates within its cap (the K-th distance it already has; nothing beyond it can enter its top
    K); the items are global rows."""
    if left[0].numel() > right[0].numel():  # the smaller side as the rows: the wide side fills the column blocks
        found_right, found_left = _bipartite(qg, right, left, options, k)
        return found_left, found_right
    rows = torch.cat([left[0], right[0]])
    sub = _subset(qg, rows, torch.cat([left[1], right[1]]))
    problem = make_problem(
        sub.query, sub.gallery, options.distance, sub.exclusions(), True, split=left[0].numel(), lazy64=True
    )
    problem = problem._replace(caps=torch.cat([left[2], right[2]]))
    found = Search.prepare(problem, k, backend="torch", chunk_size=options.chunk_size)(torch.arange(rows.numel()))
    table = _padded(found, k, rows, left[1])
    n_left = left[0].numel()
    return tuple(t[:n_left] for t in table), tuple(t[n_left:] for t in table)  # type: ignore[return-value]


def _bipartite_blocks(
    qg: QueryGallery, searched: Samples, visiting: Samples, options: RetrievalOptions, k: int
) -> tuple[Found, Found]:
    """:func:`_bipartite` of ``searched`` against one visiting block (of at most ``VISIT_ROWS / 2`` rows), as many
    searched rows at a time as fill a pass of ``VISIT_ROWS``: a pass holds that many rows, whatever the size of the
    shard (the visitors' lists are merged, and each block of searched rows meets them capped at the K-th distance
    they have found so far)."""
    most = max(VISIT_ROWS // 2, VISIT_ROWS - visiting[0].numel())
    ours: list[Found] = []
    theirs: Found | None = None
    for b in _blocks(searched[0].numel(), most=most):
        capped = visiting if theirs is None else (*visiting[:2], torch.minimum(visiting[2], _kth(theirs)))
        found_ours, found_theirs = _bipartite(qg, (searched[0][b], searched[1][b], searched[2][b]), capped, options, k)
        ours.append(found_ours)
        theirs = found_theirs if theirs is None else _merge_two(theirs, found_theirs, k)
    assert theirs is not None  # (a searched side of no rows is never passed)
    return _joined(ours, dim=0), theirs


def _joined(parts: list[Found], dim: int) -> Found:
    """Candidate lists joined along ``dim``: 0 stacks rows, 1 puts lists of the same rows side by side."""
    distances, items, valid = (torch.cat(column, dim=dim) for column in zip(*parts, strict=True))
    return distances, items, valid


def one_sided_top_k(shards: ShardedSet, options: RetrievalOptions, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(query rows, distances, gallery rows, valid)``: the exact top ``k`` of this rank's queries (rows of
    ``shards.qg``), from rounds in which every rank's next block of queries visits every rank's gallery shard."""
    qg, local, owner, row, group = shards
    rank = dist.get_rank(group)
    my_queries = torch.nonzero(owner[qg.query_positions] == rank).flatten()
    my_gallery = torch.nonzero(owner[qg.gallery_positions] == rank).flatten()
    shard = restrict_gallery(qg, my_gallery, _local_rows(local, row[qg.gallery_positions[my_gallery]]))
    parts: list[tuple[Tensor, ...]] = []
    for visit in visiting_rounds(my_queries.numel(), QUERY_BLOCK, group, local.device):
        rows = my_queries[visit.mine]
        visiting_rows = visit.join(rows)
        visiting = visit.join(local[row[qg.query_positions[rows]]])
        found = _empty(visiting.shape[0], k, local)
        if visiting.shape[0] and my_gallery.numel():
            problem = shard.take(visiting_rows)._replace(query=visiting)
            result = _search(problem, options, k, exact_distances=True)(torch.arange(visiting.shape[0]))
            found = _padded(result, k, my_gallery, local)
        # every rank's candidates for every visiting query; this rank keeps those of its own block
        d, i, v = (torch.cat([part[visit.ours] for part in gather(t, group)], dim=1) for t in found)
        parts.append((rows, *merge((d, i, v), k)))
    rows, distances, items, valid = (torch.cat(column) for column in zip(*parts, strict=True))
    return rows, distances, items, valid


def symmetric_fits(shards: ShardedSet, k: int, options: RetrievalOptions) -> bool:
    """Whether :func:`symmetric_top_k` serves the problem: a set against itself, a stage able to skip a
    bipartite pass's own-side pairs (not faiss), and the pass's candidates of a shard and a block in memory."""
    largest_shard = int(torch.bincount(shards.owner).max()) if shards.owner.numel() else 0
    fits = plan.symmetric_search_fits(largest_shard + VISIT_ROWS, k)
    return shards.qg.same_set and options.knn_backend != "faiss" and fits


def _visit(
    qg: QueryGallery,
    searched: Samples,
    sent: tuple[Tensor, Tensor],
    visiting: Tensor,
    peers: tuple[int, int],
    options: RetrievalOptions,
    k: int,
    group: Any,
) -> tuple[Found | None, Found]:
    """One round: the rows ``sent`` (embeddings, caps) go to ``peers[1]`` while the samples ``visiting`` (global
    rows) of rank ``peers[0]`` arrive block by block with their caps, the next block on its way while one is
    searched against ``searched`` (global rows, embeddings, caps) in a bipartite pass. Returns the candidates
    of the searched rows among the visitors (None: no pass), and those of the visitors among the searched rows.

    Every rank runs the same number of steps (the most any rank needs: one all-reduce), each with a checkpoint
    before its wait: a rank whose search failed is known to its peers there instead of in a receive that never
    completes, and a rank waits only for blocks posted after a checkpoint every rank passed. On an error the
    blocks in flight are received before it is raised: none is left to be matched by a later round or call."""
    rows, (source, sink) = searched[0], peers
    embeddings, caps = sent
    # every rank takes the same number of steps, each its visitors' share of them: a step's passes then cost every
    # rank alike (the searched rows times the block), and no rank waits at a step's checkpoint for a larger one
    needed = max(len(_blocks(embeddings.shape[0])), len(_blocks(visiting.numel())))  # visiting blocks: half a pass
    steps = int(all_reduce(torch.tensor([needed], device=embeddings.device), group, dist.ReduceOp.MAX))
    outgoing = [[embeddings[b], caps[b]] for b in _blocks(embeddings.shape[0], steps)]
    blocks = [visiting[b] for b in _blocks(visiting.numel(), steps)]

    def arriving(i: int) -> tuple[Tensor, Tensor] | None:
        """Room for step ``i``'s block in (None when none comes): made before the checkpoint, as it may fail."""
        if i >= len(blocks):
            return None
        return embeddings.new_empty((blocks[i].numel(), embeddings.shape[1])), caps.new_empty(blocks[i].numel())

    def post(i: int, block: tuple[Tensor, Tensor] | None) -> list[Any]:
        """Step ``i``'s block out and block in (each when there is one)."""
        send = outgoing[i] if i < len(outgoing) else []
        return _post(send, sink, [] if block is None else list(block), source, group, _EMBEDDINGS)

    incoming = arriving(0)
    checkpoint(group)  # (after the room for the first block: posted, a block must be received)
    ours: Found | None = None
    theirs: list[Found] = []
    works = post(0, incoming) if steps else []
    try:
        for i in range(steps):
            block, incoming = incoming, arriving(i + 1)
            checkpoint(group)
            _wait(works)
            works = post(i + 1, incoming) if i + 1 < steps else []  # the next block travels during this search
            if block is None:
                continue
            if not rows.numel():
                theirs.append(_empty(blocks[i].numel(), k, embeddings))
                continue
            found_ours, found_theirs = _bipartite_blocks(qg, searched, (blocks[i], *block), options, k)
            ours = found_ours if ours is None else _merge_two(ours, found_ours, k)
            theirs.append(found_theirs)
            # the next block meets the searched rows capped lower: nothing beyond their K-th so far can enter
            searched = (searched[0], searched[1], torch.minimum(searched[2], _kth(ours)))
    except Exception as error:
        if not broken(error):
            _wait(works)  # the peers posted them (after the last checkpoint): received, they match nothing later
        raise
    return ours, _joined(theirs, dim=0) if theirs else _empty(0, k, embeddings)


def _swap_candidates(visitors: Found, peers: tuple[int, int], n_back: int, k: int, group: Any) -> Found:
    """Send the visitors' candidates home to ``peers[0]`` and receive, from ``peers[1]``, those of the
    ``n_back`` rows this rank sent there (after a checkpoint: a rank whose search failed is known here)."""
    back = _empty(n_back, k, visitors[0])
    back_valid = back[2].to(torch.uint8)  # gloo sends no bool tensors
    outgoing = [visitors[0], visitors[1], visitors[2].to(torch.uint8)]
    checkpoint(group)
    _wait(_post(outgoing, peers[0], [back[0], back[1], back_valid], peers[1], group, _CANDIDATES))
    return back[0], back[1], back_valid.bool()


def symmetric_top_k(
    shards: ShardedSet, options: RetrievalOptions, k: int, is_b: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(rows, distances, gallery rows, valid)``: the exact top ``k`` of this rank's samples of a set searched
    against itself (``shards.qg.same_set``; sample ``i`` is query ``i`` and gallery item ``i``).

    ``is_b`` (by global row; the A samples first): a cross-modal set, A samples against B ones only (each
    sample's top ``k`` among the other side). A rank's own pass is then the bipartite pass of its A rows against
    its B rows, and in each of ``P - 1`` rounds the B rows of another rank visit its A rows: each A x B pair
    computed once, on the rank of its A sample."""
    qg, local, owner, row, group = shards
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    members = [torch.nonzero(owner[qg.query_positions] == r).flatten() for r in range(world)]
    mine = members[rank]
    embeddings = _local_rows(local, row[qg.query_positions[mine]])
    best = _empty(mine.numel(), k, local)  # each row's candidates among the shards met so far
    if is_b is not None:  # this rank's A samples, then its B samples (slices of ``mine``: no copy of rows)
        n_a = int((~is_b[qg.query_positions[mine]]).sum())
        a, b = slice(None, n_a), slice(n_a, None)
        if 0 < n_a < mine.numel():  # its A rows against its B rows, a block of B rows at a time
            for block in _blocks(mine.numel() - n_a):
                b_block = slice(n_a + block.start, n_a + block.stop)
                caps = _kth(best)
                side_a, side_b = ((mine[rows], embeddings[rows], caps[rows]) for rows in (a, b_block))
                found_a, found_b = _bipartite_blocks(qg, side_a, side_b, options, k)
                _fold(best, a, found_a, k)
                _fold(best, b_block, found_b, k)
    elif mine.numel():  # (float64 rows read on demand: no float64 copy of the shard beside the pass's buffers)
        own = _search(_subset(qg, mine, embeddings), options, k, True, lazy=True)(torch.arange(mine.numel()))
        best = _padded(own, k, mine, local)
    for distance in range(1, world if is_b is not None else world // 2 + 1):
        caps = _kth(best)  # the K-th distances among the shards met so far cap this round
        peers = ((rank + distance) % world, (rank - distance) % world)  # (whose rows visit, where ours go)
        searched, sent, visiting = slice(None), slice(None), members[peers[0]]
        if is_b is not None:  # our A rows searched against their B rows; our B rows go to the A rows of peers[1]
            searched, sent = a, b
            visiting = visiting[is_b[qg.query_positions[visiting]]]
        elif 2 * distance == world:  # one rectangle between the two shards: each side does half of it
            half = mine.numel() // 2
            if rank < peers[0]:
                searched, sent = slice(None, half), slice(half, None)
            else:
                visiting = visiting[visiting.numel() // 2 :]
        search = (mine[searched], embeddings[searched], caps[searched])
        ours, visitors = _visit(qg, search, (embeddings[sent], caps[sent]), visiting, peers, options, k, group)
        back = _swap_candidates(visitors, peers, embeddings[sent].shape[0], k, group)
        if ours is not None:
            _fold(best, searched, ours, k)
        _fold(best, sent, back, k)
    return mine, *best
