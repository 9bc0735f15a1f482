"""Auditing an approximate index: what the audit costs, and what an approximate evaluation saves. Usage::

    python benchmarks/bench_audit.py                        # audit: 10k queries x 100k gallery; evaluation: 100k, 300k
    python benchmarks/bench_audit.py --sizes 100000 300000 1000000

1. ``audit_neighbours`` against our exact search alone (``knn`` of the same queries, same K = 10): after a warm-up
   of each, the best of ``--repeats`` runs of each, in alternation, each first in turn. The audit adds the scoring
   of an IVF index's ``(Q, 10)`` table (nprobe chosen for recall@10 >= 0.9) to that search. Target: at most 1.1x.
2. Leave-one-out evaluation (cmc@1, cmc@5, precision@5, map@5, recall@10) of N x 128 clustered unit rows (classes
   of 20, noise 0.05: tight classes; the audit-cost data's noise 0.14 is nearly isotropic), exact
   against approximate with a 2,000-query exact audit (``approximate_index="IVF{nlist},Flat"``, nlist the power
   of two nearest 4 sqrt(N); ``nprobe`` the smallest power of two whose recall@10 on 1,000 queries is >= 0.9). The
   approximate time includes training and filling the index. Target: >= 10x at 1M. With ``--exact-queries Q``,
   the exact evaluation is timed on Q and 2Q queries (an ``is_query`` sample, against the whole gallery) and
   extrapolated linearly in the number of queries to all N: its cost is a fixed part plus one search per query,
   and this is how 1M is measured on a 2-core machine (the whole exact run would take most of an hour). When the
   target is not among the sizes, the two largest sizes give each method's growth exponent (time ~ N^a) and the
   target's figures are extrapolated from the largest size, and printed as such.

Each figure is taken at one thread and at every core, in the same run (``torch.set_num_threads`` and faiss's
``omp_set_num_threads``); times are the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence

import faiss
import torch
from _common import best_of, clustered_embeddings
from faiss.contrib.evaluation import knn_intersection_measure as faiss_recall

from torchmetrics_retrieval.functional import audit_neighbours, knn, retrieval_metrics

K = 10
OPTIONS = {"cmc_top_k": (1, 5), "precision_top_k": (5,), "map_top_k": (5,), "recall_top_k": (K,)}
TARGET_RECALL = 0.9
EVALUATION_NOISE = 0.05


def _threads(n: int) -> None:
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def audit_cost(n_query: int, n_gallery: int, threads: int, repeats: int) -> str:
    """Seconds of ``knn`` and of ``audit_neighbours`` on an IVF index's lists, and their ratio."""
    _threads(threads)
    x, _ = clustered_embeddings(n_query + n_gallery, "per_class20", seed=3)
    query, gallery = x[:n_query], x[n_query:]
    nlist = _nlist(n_gallery)
    index = faiss.index_factory(x.shape[1], f"IVF{nlist},Flat")
    index.train(gallery.numpy())
    index.add(gallery.numpy())
    exact = knn(query, gallery, K)  # (also the warm-up at this thread count)
    # the index audited is a useful one: the smallest nprobe (a power of two) reaching the target recall@K
    for nprobe in (2**i for i in range(int(math.log2(nlist)) + 1)):
        faiss.extract_index_ivf(index).nprobe = nprobe
        lists = torch.from_numpy(index.search(query.numpy(), K)[1])
        if float(faiss_recall(lists.numpy(), exact.indices.numpy())) >= TARGET_RECALL:
            break
    # the same number of runs of each, in alternation, each first in turn: a machine that speeds up or slows down
    # within the run (after a change of thread count, or as other work comes and goes) favours neither
    audit_neighbours(query, gallery, neighbours=lists)  # warm-up
    audit = search = float("inf")
    for i in range(repeats):
        for timed in ("audit", "knn") if i % 2 == 0 else ("knn", "audit"):
            if timed == "audit":
                seconds, result = best_of(lambda: audit_neighbours(query, gallery, neighbours=lists), 1)
                audit = min(audit, seconds)
            else:
                search = min(search, best_of(lambda: knn(query, gallery, K), 1)[0])
    return (
        f"audit of {n_query:,} queries x {n_gallery:,} gallery, K = {K}, {threads} thread(s): knn {search:.2f} s, "
        f"audit_neighbours {audit:.2f} s = {audit / search:.3f}x (IVF{nlist} nprobe={nprobe}: recall@{K} "
        f"{float(result[f'recall@{K}']):.3f})"
    )


def _nlist(n: int) -> int:
    return 2 ** round(math.log2(4 * math.sqrt(n)))


def _nprobe(x: torch.Tensor, nlist: int) -> tuple[int, float]:
    """The smallest power of two whose leave-one-out recall@K on 1,000 queries reaches the target."""
    index = faiss.index_factory(x.shape[1], f"IVF{nlist},Flat")
    index.train(x.numpy())
    index.add(x.numpy())
    probe = torch.arange(0, x.shape[0], max(1, x.shape[0] // 1000))[:1000]
    recall = 0.0
    for nprobe in (2**i for i in range(int(math.log2(nlist)) + 1)):
        faiss.extract_index_ivf(index).nprobe = nprobe
        found = torch.from_numpy(index.search(x[probe].numpy(), K + 1)[1])
        mine = found == probe[:, None]  # drop each query itself, keep the first K others
        order = torch.sort(mine.to(torch.int8), dim=1, stable=True).indices
        lists = torch.where(mine, -1, found).gather(1, order)[:, :K]
        # the exact search of the probed queries against the whole set, each without itself
        recall = float(audit_neighbours(x[probe], x, neighbours=lists, exclude_self=probe)[f"recall@{K}"])
        if recall >= TARGET_RECALL:
            return nprobe, recall
    return nlist, recall


def _exact_by_sample(x: torch.Tensor, labels: torch.Tensor, n_query: int, repeats: int) -> tuple[float, dict]:
    """The exact evaluation's seconds for every row as a query, from two timed runs of ``n_query`` and
    ``2 n_query`` queries (evenly spread rows, the whole set as the gallery): a fixed part plus a cost per query."""
    seconds, found = [], {}
    for q in (n_query, 2 * n_query):
        is_query = torch.zeros(x.shape[0], dtype=torch.bool)
        is_query[torch.linspace(0, x.shape[0] - 1, q).long()] = True
        t, found = best_of(lambda m=is_query: retrieval_metrics(x, labels, is_query=m, **OPTIONS), repeats)
        seconds.append(t)
    per_query = (seconds[1] - seconds[0]) / n_query
    return seconds[0] + per_query * (x.shape[0] - n_query), found


def evaluation(n: int, threads: int, repeats: int, exact_queries: int | None, probes: dict) -> dict[str, float]:
    """Seconds of the exact and the approximate leave-one-out evaluation of ``n`` rows (``probes``: the nprobe
    found for each ``n``, reused by the next thread count)."""
    _threads(threads)
    # tight classes, as a trained model gives: at the default noise the rows are mostly isotropic noise, and an IVF
    # index needs about half its lists for 0.9 recall@10 (measured: nprobe 512 of 1,024 at 100k)
    x, labels = clustered_embeddings(n, "per_class20", noise=EVALUATION_NOISE, seed=4)
    nlist = _nlist(n)
    if n not in probes:  # (found at every core: it is set-up, not timed)
        _threads(os.cpu_count() or 1)
        probes[n] = _nprobe(x, nlist)
        _threads(threads)
    nprobe, recall = probes[n]
    approximate = {"approximate_index": f"IVF{nlist},Flat", "approximate_params": f"nprobe={nprobe}"}
    approx_seconds, approx = best_of(
        lambda: retrieval_metrics(x, labels, audit_queries=2000, **approximate, **OPTIONS), repeats
    )
    if exact_queries:
        exact_seconds, exact = _exact_by_sample(x, labels, exact_queries, repeats)
        how = f"exact (extrapolated from {exact_queries:,} and {2 * exact_queries:,} queries)"
    else:
        exact_seconds, exact = best_of(lambda: retrieval_metrics(x, labels, **OPTIONS), repeats)
        how = "exact"
    print(
        f"N = {n:,} x 128, {threads} thread(s), IVF{nlist} nprobe={nprobe} (recall@{K} {recall:.3f} on 1,000 "
        f"queries; audit {float(approx[f'audit/recall@{K}']):.3f}): {how} {exact_seconds:.1f} s, approximate + "
        f"audit {approx_seconds:.1f} s, {exact_seconds / approx_seconds:.1f}x faster; cmc/1 exact "
        f"{float(exact['cmc/1']):.4f}, approx {float(approx['approx/cmc/1']):.4f}, audit delta "
        f"{float(approx['audit/cmc/1/delta']):+.4f} [{float(approx['audit/cmc/1/ci_low']):+.4f}, "
        f"{float(approx['audit/cmc/1/ci_high']):+.4f}]",
        flush=True,
    )
    return {"exact": exact_seconds, "approx": approx_seconds}


def extrapolate(times: dict[int, dict[str, float]], target: int) -> str:
    """The ``target`` figures from the two largest sizes' growth exponents (time ~ N^a per method)."""
    small, large = sorted(times)[-2:]
    parts = []
    for method in ("exact", "approx"):
        exponent = math.log(times[large][method] / times[small][method]) / math.log(large / small)
        parts.append((method, exponent, times[large][method] * (target / large) ** exponent))
    (_, a_exact, exact), (_, a_approx, approx) = parts
    return (
        f"extrapolated to N = {target:,} from N = {small:,} and {large:,} (exact ~ N^{a_exact:.2f}, approximate ~ "
        f"N^{a_approx:.2f}): exact {exact:.0f} s, approximate + audit {approx:.0f} s, {exact / approx:.1f}x faster"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--audit-queries", type=int, default=10_000, help="queries of the audit-cost figure")
    parser.add_argument("--audit-gallery", type=int, default=100_000, help="gallery of the audit-cost figure")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000], help="N of the evaluations")
    parser.add_argument("--target", type=int, default=1_000_000, help="N the evaluation figures are taken to")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--exact-queries",
        type=int,
        default=None,
        help="time the exact evaluation on this many and twice as many "
        "queries and extrapolate linearly to all N (default: run it whole)",
    )
    parser.add_argument("--no-audit-cost", action="store_true", help="skip figure 1")
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    args = parser.parse_args(argv)
    probes: dict = {}
    for threads in args.threads:
        if not args.no_audit_cost:
            print(audit_cost(args.audit_queries, args.audit_gallery, threads, max(2, args.repeats)), flush=True)
        times = {n: evaluation(n, threads, args.repeats, args.exact_queries, probes) for n in sorted(args.sizes)}
        if args.target not in times and len(times) >= 2:
            print(f"{threads} thread(s): " + extrapolate(times, args.target), flush=True)


if __name__ == "__main__":
    main()
