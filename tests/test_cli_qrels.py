"""``torchmetrics-retrieval evaluate --qrels``: BEIR's qrels/test.tsv and TREC qrels, checked against pytrec_eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from torchmetrics_retrieval.cli import main

pytrec_eval = pytest.importorskip("pytrec_eval")


def _files(tmp_path: Path, trec: bool = False) -> tuple[list[str], dict, np.ndarray]:
    rng = np.random.default_rng(0)
    query, corpus = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((30, 5)).astype(np.float32)
    np.save(tmp_path / "queries.npy", query)
    np.save(tmp_path / "corpus.npy", corpus)
    qids, dids = [f"q-{i}" for i in range(8)], [f"doc{j}" for j in range(30)]
    (tmp_path / "queries.txt").write_text("\n".join(qids) + "\n")
    (tmp_path / "corpus.txt").write_text("\n".join(dids) + "\n")
    qrels = {q: {dids[j]: int(rng.integers(0, 4)) for j in rng.choice(30, 4, replace=False)} for q in qids[:7]}
    (tmp_path / "qrels").mkdir()
    if trec:
        lines = [f"{q} 0 {d} {g}" for q, docs in qrels.items() for d, g in docs.items()]
    else:
        judged = [f"{q}\t{d}\t{g}" for q, docs in qrels.items() for d, g in docs.items()]
        lines = ["query-id\tcorpus-id\tscore", *judged]
    (tmp_path / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    scores = (query / np.linalg.norm(query, axis=1, keepdims=True)) @ (
        corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    ).T
    run = {q: {d: float(s) for d, s in zip(dids, row, strict=True)} for q, row in zip(qids, scores, strict=True)}
    measures = ["ndcg_cut_10", "P_5", "recip_rank"]
    oracle = pytrec_eval.RelevanceEvaluator(qrels, set(measures)).evaluate(run)
    return measures, oracle, scores


@pytest.mark.parametrize("trec", [False, True])
def test_evaluate_with_qrels_equals_pytrec_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str], trec: bool) -> None:
    measures, oracle, _ = _files(tmp_path, trec)
    argv = [
        "evaluate", str(tmp_path / "queries.npy"), "--gallery", str(tmp_path / "corpus.npy"),
        "--qrels", str(tmp_path / "qrels" / "test.tsv"), "--query-ids", str(tmp_path / "queries.txt"),
        "--corpus-ids", str(tmp_path / "corpus.txt"), "--distance", "cosine", "--ndcg-top-k", "10",
        "--precision", "5", "--map", "--mrr", "--no-r-precision", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == {"ndcg/10", "precision/5", "mrr", "tie_rate"}
    for measure, key in zip(measures, ("ndcg/10", "precision/5", "mrr"), strict=True):
        expected = np.mean([values[measure] for values in oracle.values()])
        assert abs(got[key] - expected) < 1e-6, key


def test_qrels_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _files(tmp_path)
    base = ["evaluate", str(tmp_path / "queries.npy"), "--qrels", str(tmp_path / "qrels" / "test.tsv")]
    assert main(base) == 2
    assert "--qrels needs the corpus embeddings as --gallery" in capsys.readouterr().err
    bad = tmp_path / "bad.tsv"
    bad.write_text("q\td\n")
    assert main([*base[:3], str(bad), "--gallery", str(tmp_path / "corpus.npy")]) == 2
    assert "expected 3 (BEIR) or 4 (TREC) fields" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("a\nb\n")
    assert main([*base, "--gallery", str(tmp_path / "corpus.npy"), "--query-ids", str(short)]) == 2
    assert "--query-ids" in capsys.readouterr().err
