"""The searches of :func:`~torchmetrics_retrieval.functional.qrels.qrels_metrics`, on the package's engines.

* :func:`ranked_chunks`: the exact kNN search (``_search``), query chunk by query chunk, ``depth + 1`` deep (the
  extra rank tells whether the last cutoff lies inside a tie). With ``close_ties`` the rows whose tie group at the
  deepest cutoff runs past the list are searched again twice as deep until it closes, so that the group is whole.
* :func:`first_relevant_rr`: the reciprocal rank of the first relevant document of queries whose list does not
  hold it, from the full-ranking count engine (``_ranks.count``): the relevant documents are few, so each query
  is scored against its own judged documents directly, and one blockwise pass over the corpus counts the items
  ranked before the best of them (no query x corpus matrix). For ``ties="expected"`` two counts, of the items
  strictly closer and of those not farther, give the tie group of the first relevant document.

Both read one :class:`~torchmetrics_retrieval.functional._search.problem.Problem`, whose float64 rows are read on
demand (no float64 copy of the corpus).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._qrels_inputs import QrelsTable
from torchmetrics_retrieval.functional._qrels_values import expected_reciprocal_rank
from torchmetrics_retrieval.functional._ranks.count import _count_before, _Thresholds
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.problem import Problem, make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions, KNNResult

__all__ = ["first_relevant_rr", "qrels_problem", "ranked_chunks"]

#: Largest (rows, L) neighbour table (and the per-slot float64 temporaries of the values) per query chunk.
TABLE_BYTES = 64 * 2**20
_SLOT_BYTES = 8 * 12  # distances, indices, grades, and about nine float64 temporaries per slot


def qrels_problem(query: Tensor, corpus: Tensor, distance: str, self_index: Tensor | None) -> Problem:
    """The search problem; ``self_index``: the corpus position of each query's own id (-1: none), or None."""
    exclusions = Exclusions(self_index=self_index, sequence_ids=None, search_groups=None)
    return make_problem(query, corpus, distance, exclusions, False, ("query", "corpus"), lazy64=True)


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


def _open_rows(found: KNNResult, depth: int, n_eligible: Tensor) -> Tensor:
    """Rows whose tie group at rank ``depth`` may run past the list (positions in the chunk)."""
    width = found.distances.shape[1]
    if width == 0:
        return torch.zeros(0, dtype=torch.long, device=found.distances.device)
    last = min(depth, width) - 1
    same = found.distances[:, last] == found.distances[:, width - 1]
    return torch.nonzero(found.valid[:, width - 1] & same & (n_eligible > width)).flatten()


def ranked_chunks(
    problem: Problem, depth: int, close_ties: bool, backend: str, chunk_size: int | None
) -> Iterator[tuple[Tensor, KNNResult, Tensor]]:
    """``(query positions, their ranked lists, complete)`` chunk by chunk: lists at least ``depth + 1`` deep (or the
    whole eligible corpus), nearest first; ``complete`` ``(R,)``: the list holds every eligible item of the row."""
    n_query, n_corpus = problem.query.shape[0], problem.gallery.shape[0]
    width = min(depth + 1, n_corpus)
    search = Search.prepare(problem, width, backend=backend, chunk_size=chunk_size, exact_distances=False)
    rows_per_chunk = max(1, TABLE_BYTES // (width * _SLOT_BYTES))
    for rows in torch.arange(n_query, device=problem.query.device).split(rows_per_chunk):
        found = search(rows)
        eligible = problem.n_eligible[rows]
        open_rows = _open_rows(found, depth, eligible) if close_ties else rows[:0]
        deeper = found.distances.shape[1]
        while open_rows.numel():  # rare: a tie group across the deepest cutoff; the list doubles until it closes
            deeper = min(2 * deeper, n_corpus)
            again = Search.prepare(problem, deeper, backend=backend, chunk_size=chunk_size, exact_distances=False)
            more = again(rows[open_rows])
            found = _padded(found, more.distances.shape[1])
            more = _padded(more, found.distances.shape[1])
            found = KNNResult(*(whole.index_copy(0, open_rows, part) for whole, part in zip(found, more, strict=True)))
            still = _open_rows(KNNResult(*(t[open_rows] for t in found)), depth, eligible[open_rows])
            open_rows = open_rows[still]
        listed = found.valid.sum(dim=1)
        yield rows, found, listed >= eligible


def first_relevant_rr(
    problem: Problem,
    rows: Tensor,
    table: QrelsTable,
    relevance_level: int,
    expected: bool,
    chunk_size: int | None,
) -> Tensor:
    """``(R,)`` float64 reciprocal rank of the first relevant document of the queries ``rows`` in their whole
    ranking (0 without an eligible relevant document in the corpus)."""
    pair_rows, pair_cols = table.relevant_pairs(rows, relevance_level)
    own = problem.exclusions.self_index
    if own is not None:  # the query's own id is not in its ranking
        keep = pair_cols != own[rows][pair_rows]
        pair_rows, pair_cols = pair_rows[keep], pair_cols[keep]
    thresholds = _Thresholds(problem, rows, pair_rows, pair_cols, 1, symmetric=False)
    found = thresholds.filled > 0
    if not expected:  # by (distance, position), the order of the lists
        before = _count_before(problem, rows, thresholds, chunk_size)[:, 0]
        return torch.where(found, 1.0 / (before + 1).to(torch.float64), 0.0)
    # the threshold's position decides the items at its very distance: before all of them, then after all of them
    thresholds.positions = torch.full_like(thresholds.positions, -1)
    closer = _count_before(problem, rows, thresholds, chunk_size)[:, 0]
    thresholds.positions = torch.full_like(thresholds.positions, problem.gallery.shape[0])
    not_farther = _count_before(problem, rows, thresholds, chunk_size)[:, 0]
    pair_distances = canonical_distances(problem, rows, pair_rows, pair_cols).to(problem.dtype)
    best = thresholds.distances[:, 0]
    tied_relevant = torch.bincount(pair_rows[pair_distances == best[pair_rows]], minlength=rows.numel())
    at = torch.nonzero(found).flatten()
    rr = torch.zeros(rows.numel(), dtype=torch.float64, device=rows.device)
    rr[at] = expected_reciprocal_rank(closer[at], (not_farther - closer)[at], tied_relevant[at])
    return rr
