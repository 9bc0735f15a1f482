"""Sharded evaluation of ``QrelsMetrics`` under DDP: every rank keeps its own corpus rows.

The corpus is the large side (1M documents against 10k queries), so it never travels: only its ids are
gathered, from which every rank builds, identically, the de-duplicated global corpus ordered by id (by trec_eval's
order for ``ties="trec_eval"``) and knows which rank holds each document (``global_rows``). The queries are
gathered (``dist_reduce_fx="cat"``): they are few, and every rank then walks the same query chunks in the same
collectives and computes every query's values itself, so no per-query value travels.

The search and the full-ranking counts are those of one process (``functional._qrels_search.BlockedCorpus``), whose
corpus blocks here are this rank's rows: each rank's exact lists (canonical distances, global positions) are
all-gathered and merged by (distance, global position), the top K of one search over the whole corpus bit for bit;
the counts of items before a query's best relevant document are summed over the ranks (``all_reduce``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings, describe
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional._qrels_inputs import make_table
from torchmetrics_retrieval.functional._qrels_search import BlockedCorpus, Collectives
from torchmetrics_retrieval.functional._qrels_values import Cutoffs
from torchmetrics_retrieval.functional.qrels import (
    check_rows,
    identical_positions,
    qrels_result,
    qrels_values,
    trec_eval_order,
)
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import global_rows

__all__ = ["sharded_qrels"]


def sharded_qrels(
    metric: Any, query: Tensor, qids: list[str], triples: list[tuple[str, str, int]], cutoffs: Cutoffs, group: Any
) -> RetrievalResult:
    """The per-query result of a ``QrelsMetrics`` whose ranks keep their corpus rows (``query``: every query,
    gathered and ordered by id as the one-process path orders them)."""
    search = metric._search
    local, _, owner, row, ids = global_rows(metric.corpus, group)
    assert ids is not None  # the corpus ids are the accumulator's indexes
    cids = [str(i) for i in ids.tolist()]  # the de-duplicated corpus ids, ascending as the gathered path's
    local = local.to(query.dtype)
    if local.shape[0]:  # an empty shard is fine: another rank holds the corpus
        check_embeddings("corpus", local)
        if local.shape[1] != query.shape[1]:
            raise ValueError(f"`corpus` must have the columns ({query.shape[1]}) of `query`, got {describe(local)}.")
        check_rows(query, local, search["distance"])
    device, n_corpus = query.device, len(cids)
    position = torch.arange(n_corpus, device=device)  # global position of each de-duplicated document
    order = trec_eval_order(cids) if search["ties"] == "trec_eval" else None
    if order is not None:  # trec_eval's tie order (id descending as strings) becomes the positions'
        position[torch.tensor(order, dtype=torch.long, device=device)] = torch.arange(n_corpus, device=device)
        cids = [cids[i] for i in order]
    mine = torch.nonzero(owner == dist.get_rank(group)).flatten()
    gallery, by_position = torch.sort(position[mine])
    corpus = local[row[mine[by_position]]]  # this rank's rows in global order (a copy of its shard only)
    level = search["relevance_level"]
    table = make_table(triples, qids, cids, level, device)
    self_global = identical_positions(qids, cids, device) if search["ignore_identical_ids"] else None
    collectives = Collectives(lambda t: gather(t, group), lambda t: all_reduce(t, group))
    blocked = BlockedCorpus(
        query, corpus, gallery, self_global, n_corpus, search["distance"], search["knn_backend"],
        search["chunk_size"], collectives,
    )  # fmt: skip
    parts = qrels_values(blocked, table, cutoffs, level, search["ties"] == "expected")
    return qrels_result(parts, cutoffs, table, query.shape[0], device)
