"""sentence-transformers' ``InformationRetrievalEvaluator`` numbers, from embeddings instead of a model.

:func:`information_retrieval_scores` returns the evaluator's keys (``{score function}_accuracy@{k}``,
``_precision@{k}``, ``_recall@{k}``, ``_mrr@{k}``, ``_ndcg@{k}``, ``_map@{k}``, prefixed with ``{name}_`` when a name
is given) with its definitions, which are binary (a document is relevant or not) and differ from trec_eval's in two:

* ``map@k`` divides the sum of the precisions at the relevant ranks by min(k, R) (trec_eval's ``map_cut_k``: by R);
* ``mrr@k`` is the reciprocal rank of the first relevant document when it is within the first k, else 0.

``accuracy@k`` is 1 for a query with a relevant document among its first k; ``precision@k`` divides by k;
``recall@k`` by R, the number of the query's relevant documents (in the corpus or not); ``ndcg@k`` has gain 1 per
relevant document and the ideal ranking of R relevant ones. The averages are over the queries with at least one
relevant document. Every value comes from one :func:`~torchmetrics_retrieval.functional.qrels_metrics` call: an
exact search (the evaluator's ``torch.topk`` over corpus chunks is exact too, but orders equal scores arbitrarily;
here they go by corpus position).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Literal

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_str, check_top_k, describe
from torchmetrics_retrieval.functional._qrels_inputs import Ids
from torchmetrics_retrieval.functional.qrels import qrels_metrics

__all__ = ["information_retrieval_scores"]


def _qrels(relevant_docs: Any) -> dict[Any, dict[Any, int]]:
    if not isinstance(relevant_docs, Mapping):
        raise TypeError(
            f"`relevant_docs` must map each query id to a set of document ids, got {describe(relevant_docs)}."
        )
    qrels = {}
    for qid, docs in relevant_docs.items():
        if isinstance(docs, (str, bytes)) or not isinstance(docs, Collection):
            raise TypeError(f"`relevant_docs` must map each query id to a set of document ids, got {describe(docs)}.")
        qrels[qid] = dict.fromkeys(docs, 1)
    return qrels


def information_retrieval_scores(
    query: Tensor,
    query_ids: Ids,
    corpus: Tensor,
    corpus_ids: Ids,
    relevant_docs: Mapping[Any, Collection[Any]],
    *,
    accuracy_at_k: int | Iterable[int] = (1, 3, 5, 10),
    precision_recall_at_k: int | Iterable[int] = (1, 3, 5, 10),
    mrr_at_k: int | Iterable[int] = (10,),
    ndcg_at_k: int | Iterable[int] = (10,),
    map_at_k: int | Iterable[int] = (100,),
    score_function: Literal["cosine", "dot"] = "cosine",
    name: str = "",
) -> dict[str, float]:
    """``InformationRetrievalEvaluator``'s metrics of query and corpus embeddings (see the module docstring).

    Args:
        query: ``(Q, D)`` query embeddings; ``query_ids`` their ids.
        query_ids: the query ids (str or int), one per row.
        corpus: ``(N, D)`` corpus embeddings.
        corpus_ids: the document ids, one per row.
        relevant_docs: ``{query id: set of relevant document ids}``, as the evaluator takes it.
        accuracy_at_k: cutoffs of ``accuracy@k``.
        precision_recall_at_k: cutoffs of ``precision@k`` and ``recall@k``.
        mrr_at_k: cutoffs of ``mrr@k``.
        ndcg_at_k: cutoffs of ``ndcg@k``.
        map_at_k: cutoffs of ``map@k``.
        score_function: ``"cosine"`` (the evaluator's default) or ``"dot"``.
        name: the evaluator's ``name``: keys are then ``{name}_{score_function}_{metric}@{k}``.

    Returns:
        ``{key: float}``, as the evaluator's ``compute_metrices`` returns them.

    Example:
        >>> query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> corpus = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])
        >>> relevant = {"q1": {"d2", "d3"}, "q2": {"d1"}}
        >>> scores = information_retrieval_scores(
        ...     query, ["q1", "q2"], corpus, ["d1", "d2", "d3"], relevant,
        ...     accuracy_at_k=2, precision_recall_at_k=2, mrr_at_k=2, ndcg_at_k=(), map_at_k=3,
        ... )
        >>> {key: round(value, 4) for key, value in scores.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'cosine_accuracy@2': 0.5, 'cosine_precision@2': 0.25, 'cosine_recall@2': 0.25, 'cosine_mrr@2': 0.25,
         'cosine_map@3': 0.4583}
    """
    cutoffs = {
        "accuracy": check_top_k("accuracy_at_k", accuracy_at_k),
        "precision_recall": check_top_k("precision_recall_at_k", precision_recall_at_k),
        "mrr": check_top_k("mrr_at_k", mrr_at_k),
        "ndcg": check_top_k("ndcg_at_k", ndcg_at_k),
        "map": check_top_k("map_at_k", map_at_k),
    }
    if score_function not in ("cosine", "dot"):
        raise ValueError(f"`score_function` must be one of ('cosine', 'dot'), got {score_function!r}.")
    check_str("name", name)
    if not any(cutoffs.values()):
        raise ValueError(
            "`accuracy_at_k`, `precision_recall_at_k`, `mrr_at_k`, `ndcg_at_k` and `map_at_k` are all empty."
        )
    # accuracy@k reads recall@k (a hit among the first k), mrr@k the whole-ranking reciprocal rank
    recall_ks = tuple(sorted(set(cutoffs["accuracy"] + cutoffs["precision_recall"])))
    _, result = qrels_metrics(
        query, query_ids, corpus, corpus_ids, _qrels(relevant_docs),
        ndcg_top_k=cutoffs["ndcg"], map_top_k=cutoffs["map"], recall_top_k=recall_ks,
        precision_top_k=cutoffs["precision_recall"], mrr=bool(cutoffs["mrr"]), distance=score_function,
        return_per_query=True,
    )  # fmt: skip
    counted, values = result.counted, result.values
    n_relevant = result.n_relevant.to(torch.float64)

    def mean(per_query: Tensor) -> float:
        return float(per_query[counted].mean()) if bool(counted.any()) else float("nan")

    prefix = f"{name}_{score_function}_" if name else f"{score_function}_"
    scores: dict[str, float] = {}
    for k in cutoffs["accuracy"]:
        scores[f"{prefix}accuracy@{k}"] = mean((values[f"recall/{k}"] > 0).to(torch.float64))
    for k in cutoffs["precision_recall"]:
        scores[f"{prefix}precision@{k}"] = mean(values[f"precision/{k}"])
        scores[f"{prefix}recall@{k}"] = mean(values[f"recall/{k}"])
    for k in cutoffs["mrr"]:
        rr = values["mrr"]
        scores[f"{prefix}mrr@{k}"] = mean(torch.where(rr >= 1.0 / k, rr, 0.0))
    for k in cutoffs["ndcg"]:
        scores[f"{prefix}ndcg@{k}"] = mean(values[f"ndcg/{k}"])
    for k in cutoffs["map"]:  # trec_eval divides by R, the evaluator by min(k, R)
        scores[f"{prefix}map@{k}"] = mean(values[f"map/{k}"] * n_relevant / n_relevant.clamp(min=1, max=k))
    return scores
