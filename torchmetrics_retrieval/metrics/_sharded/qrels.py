"""Sharded evaluation of ``QrelsMetrics`` under DDP: every rank keeps its own corpus rows.

The corpus is the large side (1M documents against 10k queries), so it never travels: only its ids are
gathered, from which every rank builds, identically, the de-duplicated global corpus ordered by id (by trec_eval's
order for ``ties="trec_eval"``) and knows which rank holds each document (``global_rows``). The queries are
gathered (``dist_reduce_fx="cat"``): they are few, and every rank then walks the same query chunks in the same
collectives and computes every query's values itself, so no per-query value travels.

* Search: per chunk of queries, each rank searches its shard with the exact engine (canonical distances), its
  items as global corpus positions; the candidate lists are all-gathered and merged by (distance, global position):
  the top K of one search over the whole corpus, bit for bit (``search.merge``). With ``ties="expected"`` the rows
  whose tie group at the deepest cutoff runs past the list are searched again twice as deep, as on one process.
* ``mrr`` beyond the list: each rank lists the relevant judged documents it holds with their canonical distances
  (few), the lists are all-gathered, and each rank counts the items of its shard before the best of them
  (``ranks.shard_counts``: virtual positions keep the global tie order); the counts are additive over shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings, describe
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional._qrels_inputs import QrelsTable, make_table
from torchmetrics_retrieval.functional._qrels_search import _SLOT_BYTES, TABLE_BYTES, _open_rows, _padded, qrels_problem
from torchmetrics_retrieval.functional._qrels_values import Cutoffs, expected_reciprocal_rank, list_values
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.problem import Problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import global_rows
from torchmetrics_retrieval.metrics._sharded.ranks import shard_counts
from torchmetrics_retrieval.metrics._sharded.search import merge

__all__ = ["sharded_qrels"]


class _Shard:
    """This rank's corpus rows as a sub-problem of the global corpus: ``gallery`` their global positions
    (increasing, so that a local tie order by position is the global one)."""

    def __init__(
        self, query: Tensor, corpus: Tensor, gallery: Tensor, self_global: Tensor | None, search: dict[str, Any]
    ) -> None:
        self.query, self.corpus, self.gallery, self.search = query, corpus, gallery, search
        self.self_local = None
        if self_global is not None and gallery.numel():  # the query's own document, if this shard holds it
            at = torch.searchsorted(gallery, self_global).clamp(max=gallery.numel() - 1)
            self.self_local = torch.where((self_global >= 0) & (gallery[at] == self_global), at, -1)
        self.problem = self.sub(torch.arange(query.shape[0], device=query.device)) if corpus.shape[0] else None
        self._searches: dict[int, Search] = {}

    def sub(self, rows: Tensor) -> Problem:
        own = None if self.self_local is None else self.self_local[rows]
        own = own if own is not None and bool((own >= 0).any()) else None
        return qrels_problem(self.query[rows], self.corpus, self.search["distance"], own)

    def top(self, rows: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(distances, global positions, valid)``, each ``(R, width)``: the exact top ``width`` of the rows in this
        shard (padded with invalid slots)."""
        n = rows.numel()
        distances = torch.full((n, width), float("inf"), dtype=self.query.dtype, device=rows.device)
        items = torch.zeros((n, width), dtype=torch.long, device=rows.device)
        valid = torch.zeros((n, width), dtype=torch.bool, device=rows.device)
        if self.problem is not None and n:
            if width not in self._searches:
                self._searches[width] = Search.prepare(
                    self.problem, width, backend=self.search["knn_backend"], chunk_size=self.search["chunk_size"]
                )  # exact distances: the merge compares distances of different shards
            found = self._searches[width](rows)
            w = found.distances.shape[1]
            distances[:, :w], valid[:, :w] = found.distances, found.valid
            items[:, :w] = self.gallery[found.indices]
        return distances, items, valid


def _merged(shard: _Shard, rows: Tensor, width: int, group: Any) -> KNNResult:
    """The global top ``width`` of the rows: every shard's list, all-gathered and merged."""
    parts = shard.top(rows, width)
    d, i, v = (torch.cat(gather(t, group), dim=1) for t in parts)
    return KNNResult(*merge((d, i, v), width))


def _ranked(
    shard: _Shard, n_eligible: Tensor, depth: int, close_ties: bool, group: Any
) -> Iterator[tuple[Tensor, KNNResult, Tensor]]:
    """``functional._qrels_search.ranked_chunks`` over the shards: the same chunks, widths and list doubling (the
    one-process width ``K = min(k, N, the largest number of eligible items)`` of ``Search.prepare``)."""
    n_query, device = shard.query.shape[0], shard.query.device
    n_corpus = int(shard.search["n_corpus"])
    cap = min(n_corpus, int(n_eligible.max()) if n_query else 0)
    width = min(depth + 1, n_corpus)
    rows_per_chunk = max(1, TABLE_BYTES // (max(width, 1) * _SLOT_BYTES))
    for rows in torch.arange(n_query, device=device).split(rows_per_chunk):
        found = _merged(shard, rows, min(width, cap), group)
        eligible = n_eligible[rows]
        open_rows = _open_rows(found, depth, eligible) if close_ties else rows[:0]
        deeper = found.distances.shape[1]
        while open_rows.numel():  # identical on every rank: the merged lists are
            deeper = min(2 * deeper, n_corpus)
            more = _merged(shard, rows[open_rows], min(deeper, cap), group)
            found = _padded(found, more.distances.shape[1])
            more = _padded(more, found.distances.shape[1])
            found = KNNResult(*(whole.index_copy(0, open_rows, part) for whole, part in zip(found, more, strict=True)))
            still = _open_rows(KNNResult(*(t[open_rows] for t in found)), depth, eligible[open_rows])
            open_rows = open_rows[still]
        yield rows, found, found.valid.sum(dim=1) >= eligible


def _first_relevant_rr(
    shard: _Shard, rows: Tensor, table: QrelsTable, self_global: Tensor | None, level: int, expected: bool, group: Any
) -> Tensor:
    """``functional._qrels_search.first_relevant_rr`` over the shards: the counts before the best relevant
    document are summed over the shards."""
    pair_rows, pair_cols = table.relevant_pairs(rows, level)
    if self_global is not None:
        keep = pair_cols != self_global[rows][pair_rows]
        pair_rows, pair_cols = pair_rows[keep], pair_cols[keep]
    device, n = rows.device, rows.numel()
    problem = shard.sub(rows) if shard.problem is not None else None
    listed = torch.zeros((0, 4), dtype=torch.float64, device=device)
    if problem is not None:  # (row, canonical distance, global position, squared norm) of the pairs held here
        at = torch.searchsorted(shard.gallery, pair_cols).clamp(max=shard.gallery.numel() - 1)
        mine = shard.gallery[at] == pair_cols
        r, c = pair_rows[mine], at[mine]
        d = canonical_distances(problem, torch.arange(n, device=device), r, c).to(problem.dtype)
        columns = (r, d, pair_cols[mine], problem.gallery_sq64[c])
        listed = torch.stack([x.to(torch.float64) for x in columns], dim=1)
    pairs = torch.cat(gather(listed, group))
    found = torch.bincount(pairs[:, 0].long(), minlength=n) > 0
    options = SimpleNamespace(chunk_size=shard.search["chunk_size"])

    def before(position: int | None) -> Tensor:
        moved = (
            pairs
            if position is None
            else torch.cat([pairs[:, :2], torch.full_like(pairs[:, :1], position), pairs[:, 3:]], 1)
        )
        counts = torch.zeros((n, 1), dtype=torch.long, device=device)
        if problem is not None:
            counts = shard_counts(problem, shard.gallery, moved, options, 1, False)  # type: ignore[arg-type]
        all_reduce(counts, group)
        return counts[:, 0]

    if not expected:
        return torch.where(found, 1.0 / (before(None) + 1).to(torch.float64), 0.0)
    closer, not_farther = before(-1), before(int(shard.search["n_corpus"]))
    best = torch.full((n,), float("inf"), dtype=torch.float64, device=device)
    best = best.scatter_reduce(0, pairs[:, 0].long(), pairs[:, 1], reduce="amin")
    tied_relevant = torch.bincount(pairs[:, 0].long()[pairs[:, 1] == best[pairs[:, 0].long()]], minlength=n)
    at = torch.nonzero(found).flatten()
    rr = torch.zeros(n, dtype=torch.float64, device=device)
    rr[at] = expected_reciprocal_rank(closer[at], (not_farther - closer)[at], tied_relevant[at])
    return rr


def sharded_qrels(
    metric: Any, query: Tensor, qids: list[str], triples: list[tuple[str, str, int]], cutoffs: Cutoffs, group: Any
) -> RetrievalResult:
    """The per-query result of a ``QrelsMetrics`` whose ranks keep their corpus rows (``query``: every query,
    gathered and ordered by id as the one-process path orders them)."""
    search = dict(metric._search)
    local, _, owner, row, ids = global_rows(metric.corpus, group)
    cids = [str(i) for i in ids.tolist()]  # type: ignore[union-attr]
    local = local.to(query.dtype)
    if local.shape[0]:  # an empty shard is fine: another rank holds the corpus
        check_embeddings("corpus", local)
    if local.shape[0] and local.shape[1] != query.shape[1]:
        raise ValueError(f"`corpus` must have the columns ({query.shape[1]}) of `query`, got {describe(local)}.")
    device, n_corpus = query.device, len(cids)
    position = torch.arange(n_corpus, device=device)  # global position of each de-duplicated document
    if search["ties"] == "trec_eval":  # trec_eval's tie order (id descending as strings) becomes the positions'
        order = sorted(range(n_corpus), key=cids.__getitem__, reverse=True)
        position[torch.tensor(order, dtype=torch.long, device=device)] = torch.arange(n_corpus, device=device)
        cids = [cids[i] for i in order]
    mine = torch.nonzero(owner == dist.get_rank(group)).flatten()
    gallery, by_position = torch.sort(position[mine])
    corpus = local[row[mine[by_position]]]
    level = search["relevance_level"]
    table = make_table(triples, qids, cids, level, device)
    self_global = None
    if search["ignore_identical_ids"]:
        at = {c: j for j, c in enumerate(cids)}
        self_global = torch.tensor([at.get(q, -1) for q in qids], dtype=torch.long, device=device)
        self_global = self_global if bool((self_global >= 0).any()) else None
    n_eligible = torch.full((query.shape[0],), n_corpus, dtype=torch.long, device=device)
    if self_global is not None:
        n_eligible -= (self_global >= 0).long()
    search["n_corpus"] = n_corpus
    shard = _Shard(query, corpus, gallery, self_global, search)
    n_rel_max = int(table.n_relevant.max()) if cutoffs.r_precision and qids else 0
    depth = max((*cutoffs.every, n_rel_max, 1))
    expected = search["ties"] == "expected"
    parts: list[dict[str, Tensor]] = []
    for rows, found, complete in _ranked(shard, n_eligible, depth, expected, group):
        grades = table.grades_at(rows, found.indices)
        values, beyond = list_values(
            cutoffs, found.distances, found.valid, grades, complete, table.n_relevant[rows],
            table.ideal[rows], level, expected,
        )  # fmt: skip
        if bool(beyond.any()):  # identical on every rank: every rank enters the counts
            far = torch.nonzero(beyond).flatten()
            values["mrr"][far] = _first_relevant_rr(shard, rows[far], table, self_global, level, expected, group)
        parts.append(values)
    return _result(parts, cutoffs, table, query.shape[0], device)


def _result(
    parts: list[dict[str, Tensor]], cutoffs: Cutoffs, table: QrelsTable, n_query: int, device: Any
) -> RetrievalResult:
    empty = torch.zeros(n_query, 0, device=device)
    per_key = {key: torch.cat([p[key] for p in parts]) if parts else empty[:, 0].double() for key in cutoffs.keys()}
    positions = torch.arange(n_query, device=device)
    return RetrievalResult(
        values=per_key,
        counted=table.judged,
        n_relevant=table.n_relevant,
        indices=empty.long(),
        distances=empty,
        valid=empty.bool(),
        is_relevant=empty.bool(),
        query_positions=positions,
        query_labels=positions,
        query_categories=None,
    )
