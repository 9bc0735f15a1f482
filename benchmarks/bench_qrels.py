"""qrels_metrics against the pipeline of MTEB and BEIR, and its peak memory at corpus scale. Usage::

    python benchmarks/bench_qrels.py                                   # 200k x 5k queries, D = 384; memory at 1M x 10k
    python benchmarks/bench_qrels.py --corpus 20000 --queries 500 --memory-corpus 0   # smaller, no memory run

The pipeline (what ``beir.retrieval.search.dense.DenseRetrievalExactSearch`` and MTEB's retrieval evaluator do):
cosine scores by torch matmul of each query chunk against corpus chunks of 50,000, the top 1000 of every chunk,
merged into the top 1000 per query; then the run as ``{query id: {doc id: score}}`` dicts and pytrec_eval's
``ndcg_cut_10``, ``map_cut_10``, ``recall_100``, ``P_10`` and ``recip_rank``. ``qrels_metrics`` computes the same
measures (``mrr`` over the whole ranking, where the pipeline stops at rank 1000). Both get the same embeddings and
the same qrels dict; the time of each is the whole call, from embeddings and qrels to the numbers.

Data: L2-normalised Gaussian corpus rows; each query is a noisy copy of one corpus row, judged with grade 2, and two
more random corpus rows are judged with grades 1 and 0. Each figure is taken at one thread and at every core.
The memory figure is the peak RSS of ``qrels_metrics`` above the RSS with the embeddings and the qrels already held.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from _common import best_of, memory_mib, reset_peak_memory

from torchmetrics_retrieval.functional import qrels_metrics

MEASURES = {"ndcg_cut_10": "ndcg/10", "map_cut_10": "map/10", "recall_100": "recall/100", "P_10": "precision/10"}
OPTIONS = {"ndcg_top_k": 10, "map_top_k": 10, "recall_top_k": 100, "precision_top_k": 10, "mrr": True}
RUN_DEPTH = 1000
BACKENDS = ("auto", "torch")  # the default, and the torch stage alone (the faster one on our 2-core machine)
CORPUS_CHUNK = 50_000  # BEIR's default corpus_chunk_size
QUERY_CHUNK = 128  # BEIR's default batch size of the query encoder, the rows scored at a time


def make_data(n_corpus: int, n_queries: int, dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    corpus = torch.nn.functional.normalize(torch.randn(n_corpus, dim, generator=g), dim=1)
    target = torch.randint(0, n_corpus, (n_queries,), generator=g)
    query = torch.nn.functional.normalize(corpus[target] + 0.15 * torch.randn(n_queries, dim, generator=g), dim=1)
    others = torch.randint(0, n_corpus, (n_queries, 2), generator=g).tolist()
    qids, cids = [f"q{i}" for i in range(n_queries)], [f"d{j}" for j in range(n_corpus)]
    qrels = {
        qid: {cids[t]: 2, cids[a]: 1, cids[b]: 0} for qid, t, (a, b) in zip(qids, target.tolist(), others, strict=True)
    }
    return query, qids, corpus, cids, qrels


def pipeline(query: torch.Tensor, qids: list[str], corpus: torch.Tensor, cids: list[str], qrels: dict) -> dict:
    """The MTEB/BEIR way: exact top 1000 by chunked matmul, run dicts, pytrec_eval."""
    import pytrec_eval

    run: dict[str, dict[str, float]] = {}
    depth = min(RUN_DEPTH, corpus.shape[0])
    for start in range(0, query.shape[0], QUERY_CHUNK):
        q = query[start : start + QUERY_CHUNK]
        best_scores, best_ids = [], []
        for c0 in range(0, corpus.shape[0], CORPUS_CHUNK):
            scores = q @ corpus[c0 : c0 + CORPUS_CHUNK].T
            top = torch.topk(scores, min(depth, scores.shape[1]), dim=1)
            best_scores.append(top.values)
            best_ids.append(top.indices + c0)
        merged = torch.topk(torch.cat(best_scores, dim=1), depth, dim=1)
        ids = torch.cat(best_ids, dim=1).gather(1, merged.indices)
        for i, (row_ids, row_scores) in enumerate(zip(ids.tolist(), merged.values.tolist(), strict=True)):
            run[qids[start + i]] = {cids[j]: s for j, s in zip(row_ids, row_scores, strict=True)}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {*MEASURES, "recip_rank"}).evaluate(run)
    means = {key: sum(v[m] for v in per_query.values()) / len(per_query) for m, key in MEASURES.items()}
    means["mrr"] = sum(v["recip_rank"] for v in per_query.values()) / len(per_query)
    return means


def compare(n_corpus: int, n_queries: int, dim: int, threads: int) -> list[str]:
    torch.set_num_threads(threads)
    query, qids, corpus, cids, qrels = make_data(n_corpus, n_queries, dim)
    theirs_s, theirs = best_of(lambda: pipeline(query, qids, corpus, cids, qrels), 1)
    lines = [
        f"corpus {n_corpus:,} x {n_queries:,} queries, D = {dim}, {threads} thread(s):",
        f"  MTEB/BEIR pipeline (matmul + top-{RUN_DEPTH} + pytrec_eval) {theirs_s:.2f} s",
    ]
    for backend in BACKENDS:
        ours_s, ours = best_of(
            lambda backend=backend: qrels_metrics(query, qids, corpus, cids, qrels, knn_backend=backend, **OPTIONS), 1
        )
        gap = max(abs(float(ours[key]) - theirs[key]) for key in MEASURES.values())
        lines += [
            f"  qrels_metrics (knn_backend={backend!r}) {ours_s:.2f} s = {ours_s / theirs_s:.2f}x the pipeline",
            f"    max |ours - pytrec_eval| over ndcg/10, map/10, recall/100, precision/10: {gap:.2e}; "
            f"mrr {float(ours['mrr']):.6f} (whole ranking) vs {theirs['mrr']:.6f} (top {RUN_DEPTH})",
        ]
    return lines


def memory(n_corpus: int, n_queries: int, dim: int, threads: int, backend: str = "auto") -> str:
    torch.set_num_threads(threads)
    query, qids, corpus, cids, qrels = make_data(n_corpus, n_queries, dim, seed=1)
    held = (query.numel() + corpus.numel()) * 4 / 2**20
    can_reset = reset_peak_memory()
    base, _ = memory_mib()
    seconds, _ = best_of(lambda: qrels_metrics(query, qids, corpus, cids, qrels, knn_backend=backend, **OPTIONS), 1)
    _, peak = memory_mib()
    working = f"{peak - base:.0f} MiB" if can_reset else "not measured"
    return (
        f"corpus {n_corpus:,} x {n_queries:,} queries, D = {dim} (embeddings {held:.0f} MiB), {threads} thread(s): "
        f"qrels_metrics (knn_backend={backend!r}) {seconds:.1f} s, peak memory above the embeddings and qrels {working}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=int, default=200_000, help="0: no comparison")
    parser.add_argument("--queries", type=int, default=5_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--memory-corpus", type=int, default=1_000_000, help="0: no memory run")
    parser.add_argument("--memory-queries", type=int, default=10_000)
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--memory-backend", default="auto", choices=("auto", "torch", "faiss"))
    args = parser.parse_args(argv)
    for threads in args.threads if args.corpus else ():  # --corpus 0: the memory run only
        print("\n".join(compare(args.corpus, args.queries, args.dim, threads)), flush=True)
    if args.memory_corpus:
        line = memory(args.memory_corpus, args.memory_queries, args.dim, max(args.threads), args.memory_backend)
        print(line, flush=True)


if __name__ == "__main__":
    main()
