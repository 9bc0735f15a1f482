"""Ids and relevance judgements (qrels) of :func:`~torchmetrics_retrieval.functional.qrels.qrels_metrics`, as
tensors.

Ids are compared as strings, as trec_eval and pytrec_eval compare them: a corpus id ``7`` (an int) and a qrels
document id ``"7"`` are the same document. The judgements become a :class:`QrelsTable`: sorted int64 keys
``query position * N + corpus position`` of the judged documents found in the corpus with their grades (a batched
``searchsorted`` looks up the grades of a block of retrieved items), and per query the number of relevant documents
and its judged grades in decreasing order (the ideal ranking), counting the judged documents that are *not* in the
corpus as trec_eval does (relevant, never retrieved).

Parsing the qrels is one pass over the judgements in Python (they are given as Python objects); everything after is
tensor code.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import describe

__all__ = ["Ids", "Qrels", "QrelsTable", "check_id_list", "make_table", "parse_qrels"]

#: Query or corpus ids: a 1-D integer tensor, or a sequence of str or int.
Ids = Tensor | Sequence[str] | Sequence[int]
#: ``{query id: {document id: grade}}`` (pytrec_eval, BEIR), or three aligned sequences ``(query ids, document ids,
#: grades)``.
Qrels = Mapping[Any, Mapping[Any, int]] | tuple[Sequence[Any], Sequence[Any], Sequence[int]]


def _id_text(name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"`{name}` must hold str or int ids, got {describe(value)}.")


def check_id_list(name: str, ids: Any, n_rows: int, rows_name: str) -> list[str]:
    """The ids as strings, one per row of ``rows_name``, distinct."""
    if isinstance(ids, Tensor):
        if ids.ndim != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"`{name}` must be a 1-D integer tensor or a sequence of str/int, got {describe(ids)}.")
        texts = [str(v) for v in ids.tolist()]
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"`{name}` must be a 1-D integer tensor or a sequence of str/int, got {describe(ids)}.")
    else:
        texts = [_id_text(name, v) for v in ids]
    if len(texts) != n_rows:
        raise ValueError(f"`{name}` must hold one id per row of `{rows_name}` ({n_rows}), got {len(texts)}.")
    if len(set(texts)) != len(texts):
        raise ValueError(f"`{name}` must be distinct, got {len(texts) - len(set(texts))} repeated id(s).")
    return texts


def _grade(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`qrels` grades must be ints >= 0, got {describe(value)}.")
    if value < 0:
        raise ValueError(f"`qrels` grades must be ints >= 0, got {int(value)}.")
    return int(value)


def parse_qrels(qrels: Any) -> list[tuple[str, str, int]]:
    """The judgements as ``(query id, document id, grade)`` strings and ints, each (query, document) once."""
    if isinstance(qrels, Mapping):
        triples: list[tuple[str, str, int]] = []
        for qid, docs in qrels.items():
            if not isinstance(docs, Mapping):
                raise TypeError(f"`qrels` must map each query id to a {{doc id: grade}} dict, got {describe(docs)}.")
            q = _id_text("qrels", qid)
            triples.extend((q, _id_text("qrels", d), _grade(g)) for d, g in docs.items())
        return triples
    if isinstance(qrels, tuple) and len(qrels) == 3:
        qids, dids, grades = qrels
        for part in qrels:
            if isinstance(part, (str, bytes)) or not isinstance(part, (Sequence, Tensor)):
                raise TypeError(f"`qrels` must be three sequences (query ids, doc ids, grades), got {describe(part)}.")
        sizes = {len(qids), len(dids), len(grades)}
        if len(sizes) != 1:
            raise ValueError(
                f"`qrels` sequences must have one length, got lengths {len(qids)}, {len(dids)}, {len(grades)}."
            )
        as_list = [p.tolist() if isinstance(p, Tensor) else p for p in qrels]
        triples = [(_id_text("qrels", q), _id_text("qrels", d), _grade(g)) for q, d, g in zip(*as_list, strict=True)]
        if len({(q, d) for q, d, _ in triples}) != len(triples):
            raise ValueError("`qrels` must judge each (query, document) pair once, got a pair twice.")
        return triples
    raise TypeError(
        f"`qrels` must be a {{query id: {{doc id: grade}}}} dict or a tuple (query ids, doc ids, grades), "
        f"got {describe(qrels)}."
    )


class QrelsTable(NamedTuple):
    """The judgements of the queries, on their device.

    keys: ``(J,)`` sorted int64 ``query position * N + corpus position`` of the judged documents in the corpus.
    grades: ``(J,)`` int64 grades of ``keys``.
    judged: ``(Q,)`` bool, the query has at least one judgement (in the corpus or not).
    n_relevant: ``(Q,)`` int64 judged documents with grade >= the relevance level (in the corpus or not).
    ideal: ``(Q, M)`` float64 judged grades of each query in decreasing order, 0-padded (M >= 1).
    n_corpus: N.
    """

    keys: Tensor
    grades: Tensor
    judged: Tensor
    n_relevant: Tensor
    ideal: Tensor
    n_corpus: int

    def grades_at(self, rows: Tensor, items: Tensor) -> Tensor:
        """``(R, L)`` int64 grades of the corpus positions ``items`` for the query positions ``rows``; 0 where
        unjudged (trec_eval: an unjudged document is not relevant and has no gain)."""
        if self.keys.numel() == 0:
            return torch.zeros_like(items)
        wanted = rows[:, None] * self.n_corpus + items
        at = torch.searchsorted(self.keys, wanted).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys[at] == wanted, self.grades[at], 0)

    def relevant_pairs(self, rows: Tensor, level: int) -> tuple[Tensor, Tensor]:
        """``(pair rows, corpus positions)`` of the relevant judged documents in the corpus of the queries ``rows``
        (``pair rows`` index ``rows`` and ascend; positions ascend within a row): each query's keys are one
        stretch of the sorted keys."""
        starts = torch.searchsorted(self.keys, rows * self.n_corpus)
        sizes = torch.searchsorted(self.keys, (rows + 1) * self.n_corpus) - starts
        pair_rows = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), sizes)
        offsets = torch.cumsum(sizes, 0) - sizes
        at = starts[pair_rows] + torch.arange(pair_rows.numel(), device=rows.device) - offsets[pair_rows]
        keep = self.grades[at] >= level
        return pair_rows[keep], (self.keys[at] % self.n_corpus)[keep]


def make_table(
    triples: list[tuple[str, str, int]],
    query_ids: list[str],
    corpus_ids: list[str],
    relevance_level: int,
    device: torch.device,
) -> QrelsTable:
    """The :class:`QrelsTable` of the judgements of ``query_ids`` (judgements of other queries are left out)."""
    query_at = {q: i for i, q in enumerate(query_ids)}
    corpus_at = {d: j for j, d in enumerate(corpus_ids)}
    kept = [(query_at[q], corpus_at.get(d, -1), g) for q, d, g in triples if q in query_at]
    n_query, n_corpus = len(query_ids), len(corpus_ids)
    table = torch.tensor(kept, dtype=torch.long).reshape(-1, 3).to(device)
    rows, cols, grades = table.unbind(dim=1)
    judged = torch.bincount(rows, minlength=n_query) > 0
    n_relevant = torch.bincount(rows[grades >= relevance_level], minlength=n_query)
    in_corpus = cols >= 0
    keys = rows[in_corpus] * n_corpus + cols[in_corpus]
    keys, order = torch.sort(keys)
    # the ideal ranking: each query's grades in decreasing order, by one sort on (query, -grade)
    top = int(grades.max()) + 1 if grades.numel() else 1
    order_all = torch.argsort(rows * top + (top - 1 - grades))
    rows_sorted, grades_sorted = rows[order_all], grades[order_all]
    per_query = torch.bincount(rows, minlength=n_query)
    starts = torch.cumsum(per_query, 0) - per_query
    width = max(1, int(per_query.max()) if n_query else 1)
    ideal = torch.zeros(n_query, width, dtype=torch.float64, device=device)
    within = torch.arange(rows_sorted.numel(), device=device) - starts[rows_sorted]
    ideal[rows_sorted, within] = grades_sorted.to(torch.float64)
    return QrelsTable(keys, grades[in_corpus][order], judged, n_relevant, ideal, n_corpus)
