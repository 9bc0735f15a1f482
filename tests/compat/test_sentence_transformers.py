"""information_retrieval_scores against sentence-transformers' InformationRetrievalEvaluator definitions, written out
here as that evaluator computes them (a sorted full ranking per query, then one loop per metric)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.compat.sentence_transformers import information_retrieval_scores

KS = {"accuracy_at_k": (1, 3, 10), "precision_recall_at_k": (1, 5), "mrr_at_k": (3, 10), "ndcg_at_k": (5, 10)}
KS_MAP = (3, 50)


def evaluator_scores(scores: np.ndarray, qids: list[str], cids: list[str], relevant: dict[str, set[str]]) -> dict:
    """The evaluator's compute_metrics: queries with a relevant document only; binary relevance."""
    out: dict[str, list[float]] = {}
    for qid, row in zip(qids, scores, strict=True):
        if not relevant.get(qid):
            continue
        docs = relevant[qid]
        ranking = [cids[j] for j in np.argsort(-row, kind="stable")]
        hits = [d in docs for d in ranking]
        for k in KS["accuracy_at_k"]:
            out.setdefault(f"accuracy@{k}", []).append(float(any(hits[:k])))
        for k in KS["precision_recall_at_k"]:
            out.setdefault(f"precision@{k}", []).append(sum(hits[:k]) / k)
            out.setdefault(f"recall@{k}", []).append(sum(hits[:k]) / len(docs))
        for k in KS["mrr_at_k"]:
            out.setdefault(f"mrr@{k}", []).append(next((1 / (i + 1) for i, h in enumerate(hits[:k]) if h), 0.0))
        for k in KS["ndcg_at_k"]:
            dcg = sum(h / math.log2(i + 2) for i, h in enumerate(hits[:k]))
            ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(docs))))
            out.setdefault(f"ndcg@{k}", []).append(dcg / ideal)
        for k in KS_MAP:
            correct, total = 0, 0.0
            for i, h in enumerate(hits[:k]):
                if h:
                    correct += 1
                    total += correct / (i + 1)
            out.setdefault(f"map@{k}", []).append(total / min(k, len(docs)))
    return {key: float(np.mean(values)) for key, values in out.items()}


@pytest.mark.parametrize("score_function", ["cosine", "dot"])
def test_equals_the_evaluator_definitions(score_function: str) -> None:
    rng = np.random.default_rng(0)
    query, corpus = rng.standard_normal((25, 8)), rng.standard_normal((120, 8))
    qids, cids = [f"q{i}" for i in range(25)], [f"c{j}" for j in range(120)]
    relevant = {q: {cids[j] for j in rng.choice(120, int(rng.integers(1, 6)), replace=False)} for q in qids[:22]}
    relevant[qids[0]].add("not-in-corpus")
    relevant[qids[1]] = set()  # no relevant document: not averaged
    if score_function == "cosine":
        scores = (query / np.linalg.norm(query, axis=1, keepdims=True)) @ (
            corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
        ).T
    else:
        scores = query @ corpus.T
    got = information_retrieval_scores(
        torch.tensor(query), qids, torch.tensor(corpus), cids, relevant, map_at_k=KS_MAP,
        score_function=score_function, name="dev", **KS,
    )  # fmt: skip
    expected = evaluator_scores(scores, qids, cids, relevant)
    assert set(got) == {f"dev_{score_function}_{key}" for key in expected}
    for key, value in expected.items():
        assert abs(got[f"dev_{score_function}_{key}"] - value) < 1e-9, key


def test_bad_arguments_are_named() -> None:
    x = torch.eye(3)
    with pytest.raises(TypeError, match="`relevant_docs`"):
        information_retrieval_scores(x, ["a", "b", "c"], x, ["a", "b", "c"], {"a": "b"})
    with pytest.raises(ValueError, match="`score_function`"):
        information_retrieval_scores(x, ["a", "b", "c"], x, ["a", "b", "c"], {"a": {"b"}}, score_function="l2")
    with pytest.raises(ValueError, match="`mrr_at_k`"):
        information_retrieval_scores(x, ["a", "b", "c"], x, ["a", "b", "c"], {"a": {"b"}}, mrr_at_k=0)
