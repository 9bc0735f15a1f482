"""qrels_metrics against trec_eval (pytrec_eval), ranx, scikit-learn's tie-averaged nDCG, and an exhaustive average
over the orders of tied documents written here.

The runs given to pytrec_eval hold every document with its float64 score computed here with numpy (the corpus is
smaller than trec_eval's usual 1000-deep run, so the run is the whole ranking), and pytrec_eval orders them itself:
its own tie rule, its own cutoffs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.functional import compare_models, qrels_metrics
from torchmetrics_retrieval.functional._bootstrap import bootstrap_interval

pytrec_eval = pytest.importorskip("pytrec_eval")

CUTOFFS = (1, 3, 10)
MEASURES = {  # trec_eval measure -> our key
    **{f"ndcg_cut_{k}": f"ndcg/{k}" for k in CUTOFFS},
    **{f"map_cut_{k}": f"map/{k}" for k in CUTOFFS},
    **{f"recall_{k}": f"recall/{k}" for k in CUTOFFS},
    **{f"P_{k}": f"precision/{k}" for k in CUTOFFS},
    "recip_rank": "mrr",
    "Rprec": "r_precision",
}
ALL = {
    "ndcg_top_k": CUTOFFS,
    "map_top_k": CUTOFFS,
    "recall_top_k": CUTOFFS,
    "precision_top_k": CUTOFFS,
    "mrr": True,
    "r_precision": True,
}


def scores_of(query: np.ndarray, corpus: np.ndarray, distance: str) -> np.ndarray:
    """(Q, N) float64 scores, higher first."""
    q, c = query.astype(np.float64), corpus.astype(np.float64)
    if distance == "dot":
        return q @ c.T
    if distance == "cosine":
        return (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (c / np.linalg.norm(c, axis=1, keepdims=True)).T
    return -np.sqrt(((q[:, None, :] - c[None, :, :]) ** 2).sum(-1))


def full_run(scores: np.ndarray, qids: list[str], cids: list[str], drop_identical: bool = False) -> dict:
    """Every document with its score, for every query (BEIR drops a document whose id is the query's)."""
    return {
        q: {d: float(s) for d, s in zip(cids, row, strict=True) if not (drop_identical and d == q)}
        for q, row in zip(qids, scores, strict=True)
    }


def trec_eval(qrels: dict, run: dict, relevance_level: int = 1) -> dict[str, dict[str, float]]:
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(MEASURES), relevance_level=relevance_level)
    return evaluator.evaluate(run)


def random_qrels(rng: np.random.Generator, qids: list[str], cids: list[str]) -> dict[str, dict[str, int]]:
    """Grades 0-3 on a few documents per query, some documents outside the corpus; the first query has only
    grade-0 judgements (no relevant document), the second no judgement at all; one query outside ``qids``."""
    qrels: dict[str, dict[str, int]] = {}
    for i, q in enumerate(qids):
        if i == 1:
            continue
        docs = rng.choice(len(cids), size=int(rng.integers(1, 9)), replace=False)
        judged = {cids[j]: int(rng.integers(0, 4)) for j in docs}
        if i % 5 == 2:
            judged["not-in-corpus"] = int(rng.integers(1, 4))
        qrels[q] = {d: 0 for d in judged} if i == 0 else judged
    qrels["unknown-query"] = {cids[0]: 3}
    return qrels


def assert_matches(ours: tuple, oracle: dict[str, dict[str, float]], qids: list[str]) -> None:
    metrics, result = ours
    evaluated = [i for i, q in enumerate(qids) if q in oracle]
    assert result.counted.nonzero().flatten().tolist() == evaluated
    for measure, key in MEASURES.items():
        expected = np.array([oracle[qids[i]][measure] for i in evaluated])
        got = result.values[key][evaluated].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=key)
        assert abs(float(metrics[key]) - expected.mean()) < 1e-6, key


def corpus_data(seed: int, n_query: int = 30, n_corpus: int = 200, dim: int = 6, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((n_query, dim))
    corpus = rng.standard_normal((n_corpus, dim))
    qids = [f"q{i}" for i in range(n_query)]
    cids = [f"d{j}" for j in range(n_corpus)]
    qrels = random_qrels(rng, qids, cids)
    return torch.tensor(query, dtype=dtype), qids, torch.tensor(corpus, dtype=dtype), cids, qrels


@pytest.mark.parametrize("distance", ["cosine", "dot", "euclidean"])
def test_every_measure_equals_trec_eval(distance: str) -> None:
    query, qids, corpus, cids, qrels = corpus_data(0)
    ours = qrels_metrics(query, qids, corpus, cids, qrels, distance=distance, return_per_query=True, **ALL)
    oracle = trec_eval(qrels, full_run(scores_of(query.numpy(), corpus.numpy(), distance), qids, cids))
    assert_matches(ours, oracle, qids)


def test_first_relevant_document_deep_in_the_ranking() -> None:
    # cutoffs of 1 only: most first relevant documents lie past the searched list and take the full-ranking count
    query, qids, corpus, cids, qrels = corpus_data(1, n_query=20, n_corpus=500, dtype=torch.float32)
    ours = qrels_metrics(query, qids, corpus, cids, qrels, ndcg_top_k=1, mrr=True, return_per_query=True)
    oracle = trec_eval(qrels, full_run(scores_of(query.numpy(), corpus.numpy(), "cosine"), qids, cids))
    evaluated = [i for i, q in enumerate(qids) if q in oracle]
    expected = [oracle[qids[i]]["recip_rank"] for i in evaluated]
    assert min(e for e in expected if e > 0) < 0.5  # some first relevant document is past rank 2
    np.testing.assert_allclose(ours[1].values["mrr"][evaluated].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("relevance_level", [1, 2])
def test_relevance_level_as_trec_eval(relevance_level: int) -> None:
    query, qids, corpus, cids, qrels = corpus_data(2)
    ours = qrels_metrics(
        query, qids, corpus, cids, qrels, relevance_level=relevance_level, return_per_query=True, **ALL
    )
    scores = scores_of(query.numpy(), corpus.numpy(), "cosine")
    assert_matches(ours, trec_eval(qrels, full_run(scores, qids, cids), relevance_level), qids)


@pytest.mark.parametrize("ignore", [False, True])
def test_identical_ids(ignore: bool) -> None:
    # half the queries share their id with a corpus document, which is also their nearest one
    query, _, corpus, cids, _ = corpus_data(3, n_query=20)
    corpus[:10] = query[:10] + 0.01
    qids = cids[:10] + [f"q{i}" for i in range(10, 20)]
    qrels = random_qrels(np.random.default_rng(4), qids, cids)
    for i in range(0, 10, 2):  # the query's own document judged relevant for some queries
        qrels.setdefault(qids[i], {})[qids[i]] = 2
    ours = qrels_metrics(query, qids, corpus, cids, qrels, ignore_identical_ids=ignore, return_per_query=True, **ALL)
    scores = scores_of(query.numpy(), corpus.numpy(), "cosine")
    assert_matches(ours, trec_eval(qrels, full_run(scores, qids, cids, drop_identical=ignore)), qids)


def tied_data(seed: int, n_query: int = 25, n_corpus: int = 120):
    """Small integer embeddings: exact scores, many exact ties."""
    rng = np.random.default_rng(seed)
    query = rng.integers(0, 3, (n_query, 2)).astype(np.float32)
    corpus = rng.integers(0, 3, (n_corpus, 2)).astype(np.float32)
    return rng, torch.tensor(query), torch.tensor(corpus)


@pytest.mark.parametrize("distance", ["dot", "euclidean"])
@pytest.mark.parametrize("int_ids", [False, True])
def test_exact_ties_as_trec_eval(distance: str, int_ids: bool) -> None:
    rng, query, corpus = tied_data(5)
    n_corpus = corpus.shape[0]
    # ids whose string order differs from their corpus order (and, as ints, from their numeric order: "10" < "9")
    numbers = rng.permutation(n_corpus) * 7 + 3
    cids_given = [int(n) for n in numbers] if int_ids else [f"doc-{n:x}" for n in numbers]
    cids = [str(c) for c in cids_given]
    qids = [f"q{i}" for i in range(query.shape[0])]
    qrels = random_qrels(rng, qids, cids)
    ours = qrels_metrics(
        query, qids, corpus, cids_given, qrels, distance=distance, ties="trec_eval", return_per_query=True, **ALL
    )
    assert float(ours[0]["tie_rate"]) > 0.5  # the ties decide most cutoffs here
    oracle = trec_eval(qrels, full_run(scores_of(query.numpy(), corpus.numpy(), distance), qids, cids))
    assert_matches(ours, oracle, qids)


def test_ties_by_position_differ_from_trec_eval() -> None:
    # the same tied data under the default rule: at least one value differs from trec_eval's (the rules matter)
    rng, query, corpus = tied_data(6)
    qids, cids = [f"q{i}" for i in range(query.shape[0])], [f"d{j:03d}" for j in range(corpus.shape[0])]
    qrels = random_qrels(rng, qids, cids)
    by_position = qrels_metrics(query, qids, corpus, cids, qrels, distance="dot", **ALL)
    by_id = qrels_metrics(query, qids, corpus, cids, qrels, distance="dot", ties="trec_eval", **ALL)
    assert any(abs(float(by_position[k]) - float(by_id[k])) > 1e-6 for k in MEASURES.values())


def test_ranx_agrees() -> None:
    ranx = pytest.importorskip("ranx")
    query, qids, corpus, cids, qrels = corpus_data(7)
    # ranx wants a relevant document for every query, and no query absent from the run
    qrels = {q: docs for q, docs in qrels.items() if q in qids and any(g > 0 for g in docs.values())}
    ours = qrels_metrics(query, qids, corpus, cids, qrels, **ALL)
    run = full_run(scores_of(query.numpy(), corpus.numpy(), "cosine"), qids, cids)
    run = {q: run[q] for q in qrels}  # the queries in the qrels' order: ranx pairs the two dicts' values in order
    names = {
        f"{m}@{k}": f"{key}/{k}"
        for k in CUTOFFS
        for m, key in (("ndcg", "ndcg"), ("map", "map"), ("recall", "recall"), ("precision", "precision"))
    }
    names.update({"mrr": "mrr", "r-precision": "r_precision"})
    # plain dicts, which ranx.evaluate turns into its arrays itself (python_dict_to_typed_list): the same metric
    # kernels as ranx.Qrels/ranx.Run, without compiling the typed-dict builders of those classes (~45 s cold)
    theirs = ranx.evaluate(qrels, run, list(names))
    for name, key in names.items():
        assert abs(float(ours[key]) - theirs[name]) < 1e-6, key


# ---- ties="expected" ---------------------------------------------------------------------------------------------


def test_expected_ndcg_equals_scikit_learn() -> None:
    from sklearn.metrics import ndcg_score

    rng, query, corpus = tied_data(8, n_query=15, n_corpus=60)
    n_query, n_corpus = query.shape[0], corpus.shape[0]
    grades = np.where(rng.random((n_query, n_corpus)) < 0.15, rng.integers(1, 4, (n_query, n_corpus)), 0)
    grades[:, 0] = 1  # every query has a relevant document (scikit-learn's nDCG of an all-zero row is 0 anyway)
    qids, cids = [f"q{i}" for i in range(n_query)], [f"d{j}" for j in range(n_corpus)]
    qrels = {qids[i]: {cids[j]: int(grades[i, j]) for j in np.flatnonzero(grades[i])} for i in range(n_query)}
    scores = scores_of(query.numpy(), corpus.numpy(), "dot")
    _, result = qrels_metrics(
        query, qids, corpus, cids, qrels, distance="dot", ties="expected", ndcg_top_k=(1, 5, 20),
        return_per_query=True,
    )  # fmt: skip
    for k in (1, 5, 20):
        expected = [ndcg_score(grades[i : i + 1], scores[i : i + 1], k=k, ignore_ties=False) for i in range(n_query)]
        np.testing.assert_allclose(result.values[f"ndcg/{k}"].numpy(), expected, atol=1e-9)


def reference_values(order: list[int], grades: list[int], ideal: list[int], level: int) -> dict[str, float]:
    """trec_eval's measures of one ranking (every document listed), written out plainly."""
    rel = [int(grades[d] >= level) for d in order]
    n_rel = sum(g >= level for g in ideal)
    out: dict[str, float] = {}
    for k in (1, 2, 4):
        dcg = sum(grades[d] / math.log2(i + 2) for i, d in enumerate(order[:k]))
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(ideal, reverse=True)[:k]))
        out[f"ndcg/{k}"] = dcg / idcg if idcg else 0.0
        out[f"precision/{k}"] = sum(rel[:k]) / k
        out[f"recall/{k}"] = sum(rel[:k]) / n_rel if n_rel else 0.0
        ap = sum(sum(rel[: i + 1]) / (i + 1) for i in range(min(k, len(rel))) if rel[i])
        out[f"map/{k}"] = ap / n_rel if n_rel else 0.0
    out["mrr"] = next((1 / (i + 1) for i, r in enumerate(rel) if r), 0.0)
    out["r_precision"] = sum(rel[:n_rel]) / n_rel if n_rel else 0.0
    return out


def test_expected_values_are_the_mean_over_every_order() -> None:
    # 8 documents in tie groups of sizes 3, 1, 4 (scores 2, 1, 0): every order of the tied documents, averaged
    scores = np.array([2, 1, 0, 2, 0, 0, 2, 0], dtype=np.float32)
    corpus = torch.tensor(np.stack([scores, np.zeros(8, np.float32)], axis=1))
    query = torch.tensor([[1.0, 0.0]] * 3)
    grade_rows = [[0, 0, 1, 2, 0, 3, 0, 0], [0, 3, 2, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0, 0, 2]]
    cids = [f"d{j}" for j in range(8)]
    qids = ["a", "b", "c"]
    qrels = {q: {cids[j]: g for j, g in enumerate(row) if g} for q, row in zip(qids, grade_rows, strict=True)}
    cutoffs = {"ndcg_top_k": (1, 2, 4), "map_top_k": (1, 2, 4), "recall_top_k": (1, 2, 4), "precision_top_k": (1, 2, 4)}
    _, result = qrels_metrics(
        query, qids, corpus, cids, qrels, distance="dot", ties="expected", mrr=True, r_precision=True,
        return_per_query=True, **cutoffs,
    )  # fmt: skip
    consistent = [
        p for p in itertools.permutations(range(8)) if all(scores[a] >= scores[b] for a, b in itertools.pairwise(p))
    ]
    assert len(consistent) == math.factorial(3) * math.factorial(4)
    for i, grades in enumerate(grade_rows):
        values = [reference_values(list(p), grades, [g for g in grades if g], 1) for p in consistent]
        for key in values[0]:
            assert abs(float(result.values[key][i]) - np.mean([v[key] for v in values])) < 1e-9, (i, key)


def test_expected_mrr_beyond_the_list() -> None:
    # the first relevant document is in a tie group far past the cutoff: the full-ranking count gives the group
    n = 40
    scores = np.concatenate([np.arange(n, 10, -1), np.zeros(10)]).astype(np.float32)  # 30 distinct, then 10 tied
    corpus = torch.tensor(np.stack([scores, np.zeros(n, np.float32)], axis=1))
    cids = [f"d{j}" for j in range(n)]
    qrels = {"a": {"d33": 1, "d37": 2}}
    _, result = qrels_metrics(
        torch.tensor([[1.0, 0.0]]), ["a"], corpus, cids, qrels, distance="dot", ties="expected", ndcg_top_k=1,
        mrr=True, return_per_query=True,
    )  # fmt: skip
    # 30 documents before the group of 10 holding 2 relevant ones: sum_j P(first at j) / (30 + j)
    expected = sum(math.comb(10 - j, 1) / math.comb(10, 2) / (30 + j) for j in range(1, 10))
    assert abs(float(result.values["mrr"][0]) - expected) < 1e-12


def test_constant_scorer_mrr_is_harmonic_over_n() -> None:
    n = 50
    corpus = torch.ones(n, 3)
    query = torch.ones(4, 3)
    qids, cids = ["a", "b", "c", "d"], [f"d{j}" for j in range(n)]
    qrels = {q: {cids[7 * i + 1]: 1} for i, q in enumerate(qids)}
    metrics = qrels_metrics(query, qids, corpus, cids, qrels, ties="expected", ndcg_top_k=10, mrr=True)
    harmonic = sum(1 / j for j in range(1, n + 1))
    assert abs(float(metrics["mrr"]) - harmonic / n) < 1e-12
    assert float(metrics["tie_rate"]) == 1.0
    # by position, the same scorer reaches the rank of the document's corpus position
    by_position = qrels_metrics(query, qids, corpus, cids, qrels, ndcg_top_k=10, mrr=True)
    assert abs(float(by_position["mrr"]) - np.mean([1 / (7 * i + 2) for i in range(4)])) < 1e-12


# ---- inputs, intervals, comparisons ----------------------------------------------------------------------------


def test_qrels_as_three_sequences_and_int_ids() -> None:
    query, _, corpus, _, _ = corpus_data(9)
    qids, cids = list(range(100, 130)), torch.arange(200)
    qrels = {
        str(q): {str(d): g for d, g in docs.items()}
        for q, docs in random_qrels(
            np.random.default_rng(1), [str(q) for q in qids], [str(c) for c in cids.tolist()]
        ).items()
    }
    triples = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items()]
    as_dict = qrels_metrics(query, qids, corpus, cids, qrels, **ALL)
    as_lists = qrels_metrics(query, qids, corpus, cids, tuple(map(list, zip(*triples, strict=True))), **ALL)
    assert as_dict.keys() == as_lists.keys()
    for key in as_dict:
        assert torch.equal(as_dict[key], as_lists[key]), key


def test_intervals_and_compare_models() -> None:
    query, qids, corpus, cids, qrels = corpus_data(10)
    metrics, result = qrels_metrics(
        query, qids, corpus, cids, qrels, ndcg_top_k=10, confidence_level=0.9, n_bootstrap=200, seed=3,
        return_per_query=True,
    )  # fmt: skip
    judged = result.values["ndcg/10"][result.counted]
    low, high = bootstrap_interval(judged[:, None], confidence_level=0.9, n_bootstrap=200, seed=3)
    assert float(metrics["ndcg/10/ci_low"]) == float(low[0]) < float(metrics["ndcg/10"]) < float(high[0])
    other = qrels_metrics(query + 0.3, qids, corpus, cids, qrels, ndcg_top_k=10, return_per_query=True)[1]
    comparison = compare_models(judged, other.values["ndcg/10"][other.counted])
    assert (
        abs(float(comparison["difference"]) - float(other.values["ndcg/10"][other.counted].mean() - judged.mean()))
        < 1e-12
    )


def test_chunk_size_and_backend_do_not_change_values() -> None:
    query, qids, corpus, cids, qrels = corpus_data(11, dtype=torch.float32)
    base = qrels_metrics(query, qids, corpus, cids, qrels, **ALL)
    for options in ({"chunk_size": 7}, {"knn_backend": "torch"}, {"ties": "expected"}):
        other = qrels_metrics(query, qids, corpus, cids, qrels, **ALL, **options)
        for key in base:
            assert abs(float(base[key]) - float(other[key])) < 1e-12, (options, key)


@pytest.mark.parametrize(
    ("overrides", "error", "name"),
    [
        ({"query_ids": ["a", "a"]}, ValueError, "query_ids"),
        ({"corpus_ids": [1.5, 2.5, 3.5]}, TypeError, "corpus_ids"),
        ({"qrels": {"a": {"x": -1}}}, ValueError, "qrels"),
        ({"qrels": {"a": {"x": 1.0}}}, TypeError, "qrels"),
        ({"qrels": (["a"], ["x", "y"], [1])}, ValueError, "qrels"),
        ({"ties": "random"}, ValueError, "ties"),
        ({"distance": "sqeuclidean"}, ValueError, "distance"),
        ({"relevance_level": 0}, ValueError, "relevance_level"),
        ({"ndcg_top_k": 0}, ValueError, "ndcg_top_k"),
        ({"ndcg_top_k": ()}, ValueError, "ndcg_top_k"),
        ({"corpus": torch.ones(3, 4)}, ValueError, "corpus"),
    ],
)
def test_bad_arguments_are_named(overrides: dict, error: type, name: str) -> None:
    arguments = {
        "query": torch.ones(2, 3), "query_ids": ["a", "b"], "corpus": torch.eye(3), "corpus_ids": ["x", "y", "z"],
        "qrels": {"a": {"x": 1}},
    }  # fmt: skip
    arguments.update(overrides)
    with pytest.raises(error, match=f"`{name}`"):
        qrels_metrics(**arguments)
