"""The search's candidate pass in float32 and in bfloat16 (``search_precision``), against a bare faiss flat search on
the same data in the same run, at one thread and at every core. Usage::

    python benchmarks/bench_precision.py                          # N = 300k, D = 128, 20 per class, leave-one-out
    python benchmarks/bench_precision.py --n 50000 --threads 1 2 --storage float16

Each run prints, per thread count:

* the products alone: a stage-1 block (512 x 4096) in float32 and in bfloat16, and their ratio (on CPUs without
  bfloat16 units torch emulates bfloat16, and the ratio is above 1);
* bare faiss (``IndexFlatL2``, K + 1 neighbours: the self match comes back first), then ``knn`` leave-one-out
  with K = 19 in each precision (``"auto"`` too): seconds, ratio to faiss, whether the answer is identical to the
  float32 one, the share of queries the bfloat16 bound left undecided after the first round, and whether the
  search fell back to float32;
* ``EmbeddingMetrics`` (MAP@R, cmc@1) over the set stored in ``--storage`` precision: seconds, peak RSS above
  the RSS with the stored set held, and the stored set's size.

``--queries Q`` (the leave-one-out searches are skipped) makes only the first ``Q`` samples queries
(``is_query``), each searched against the whole set (itself excluded): ``EmbeddingMetrics`` is timed with ``Q / 2``
and with ``Q`` queries, the peak memory is that of the ``Q`` run, and the time of all ``N`` samples as queries is
extrapolated linearly in the number of queries through the two runs, ``t(Q) + (N - Q) * (t(Q) - t(Q / 2)) / (Q / 2)``
(what does not grow with the queries, such as the gallery's norms, counted once). Usage::

    python benchmarks/bench_precision.py --n 1000000 --queries 20000 --precisions float32
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from _common import best_of, clustered_embeddings, memory_mib, reset_peak_memory

from torchmetrics_retrieval import EmbeddingMetrics
from torchmetrics_retrieval.functional import knn
from torchmetrics_retrieval.functional._search import low_precision, plan

PRECISIONS = ("float32", "bfloat16", "auto")
STORAGE = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    import faiss

    faiss.omp_set_num_threads(threads)


def products(dim: int) -> str:
    """Seconds of one stage-1 block of products in float32 and in bfloat16 (float32 accumulation)."""
    g = torch.Generator().manual_seed(0)
    left, right = torch.randn(plan.STAGE1_ROWS, dim, generator=g), torch.randn(plan.STAGE1_COLUMNS, dim, generator=g)
    f32, _ = best_of(lambda: torch.mm(left, right.T), 5)
    low_left, low_right = left.bfloat16(), right.bfloat16()
    bf16, _ = best_of(lambda: low_precision.bf16_products(low_left, low_right), 5)
    shape = f"512 x 4096 x {dim}"
    return f"  products {shape}: float32 {f32 * 1e3:.2f} ms, bfloat16 {bf16 * 1e3:.2f} ms = {bf16 / f32:.2f}x"


def bare_faiss(x: torch.Tensor, k: int) -> float:
    import faiss

    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x.numpy())
    seconds, _ = best_of(lambda: index.search(x.numpy(), k + 1), 1)
    return seconds


def searches(x: torch.Tensor, k: int, faiss_seconds: float, precisions: Sequence[str]) -> list[str]:
    lines, reference = [], None
    for precision in precisions:
        before = dict(low_precision.counters)
        seconds, found = best_of(lambda p=precision: knn(x, None, k, search_precision=p), 1)  # type: ignore[misc]
        reference = found if reference is None else reference
        same = all(torch.equal(a, b) for a, b in zip(found, reference, strict=True))
        counts = {key: low_precision.counters[key] - before[key] for key in before}
        prefix = "" if counts["first_round_queries"] else "float32_"
        asked, undecided = counts[f"{prefix}first_round_queries"], counts[f"{prefix}first_round_undecided"]
        low = f", undecided after round 1 {undecided / max(asked, 1):.2%}, fell back {bool(counts['fallbacks'])}"
        lines.append(
            f"  knn {precision:<8} {seconds:8.2f} s = {seconds / faiss_seconds:.2f}x faiss, identical {same}{low}"
        )
    return lines


def stored_metrics(
    x: torch.Tensor, labels: torch.Tensor, storage: torch.dtype, precision: str, queries: int | None = None
) -> str:
    """``EmbeddingMetrics`` over the stored set: every sample a query, or the first ``queries`` only."""
    metric = EmbeddingMetrics(
        storage_dtype=storage, search_precision=precision, cmc_top_k=1, precision_top_k=(), map_top_k=(), map_at_r=True
    )  # type: ignore[arg-type]
    is_query = None
    if queries is not None:
        is_query = torch.zeros(x.shape[0], dtype=torch.bool)
        is_query[:queries] = True
    metric.update(x, labels, is_query=is_query)
    held = metric.embeddings[0].numel() * metric.embeddings[0].element_size() / 2**20  # type: ignore[index]
    can_reset = reset_peak_memory()
    base, _ = memory_mib()
    seconds, values = best_of(metric.compute, 1)
    _, peak = memory_mib()
    working = f"{peak - base:.0f} MiB" if can_reset else "not measured"
    shown = ", ".join(f"{key} {float(value):.4f}" for key, value in values.items())
    asked = "" if queries is None else f", {queries:,} queries"
    return (
        f"  EmbeddingMetrics {storage} storage ({held:.0f} MiB){asked}, search {precision}: {seconds:.2f} s, "
        f"peak above the stored set {working}; {shown}"
    )


def extrapolated_queries(x: torch.Tensor, labels: torch.Tensor, storage: torch.dtype, precision: str, q: int) -> str:
    """``EmbeddingMetrics`` with ``q // 2`` and ``q`` queries, and the time of every sample as a query extrapolated
    linearly in the number of queries through the two runs."""
    half, full = (stored_metrics(x, labels, storage, precision, count) for count in (q // 2, q))

    def seconds(line: str) -> float:
        return float(line.split(f"search {precision}: ")[1].split(" s,")[0])

    per_query = (seconds(full) - seconds(half)) / (q - q // 2)
    whole = seconds(full) + (x.shape[0] - q) * per_query
    how = f"t({q:,}) + ({x.shape[0]:,} - {q:,}) x (t({q:,}) - t({q // 2:,})) / {q - q // 2:,}"
    return f"{half}\n{full}\n  extrapolated to {x.shape[0]:,} queries: {whole:.1f} s = {how}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=19, help="neighbours per query (20 per class: MAP@R's K)")
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--storage", choices=sorted(STORAGE), default="float16")
    parser.add_argument("--skip-search", action="store_true", help="only the products and EmbeddingMetrics")
    parser.add_argument(
        "--queries", type=int, help="only this many queries (against the whole set), extrapolated to every sample"
    )
    parser.add_argument(
        "--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS), help="the first is the reference"
    )
    args = parser.parse_args(argv)
    x, labels = clustered_embeddings(args.n, "per_class20", dim=args.dim)
    flags = sorted(low_precision.BF16_CPU_FLAGS & low_precision.cpu_flags()) or "none"
    print(f"N = {args.n:,}, D = {args.dim}, K = {args.k}; bfloat16 CPU flags: {flags}", flush=True)
    for threads in args.threads:
        set_threads(threads)
        print(f"{threads} thread(s), auto chooses {low_precision.resolve('auto', x.device)}", flush=True)
        print(products(args.dim), flush=True)
        if not (args.skip_search or args.queries):
            faiss_seconds = bare_faiss(x, args.k)
            print(f"  bare faiss        {faiss_seconds:8.2f} s", flush=True)
            print("\n".join(searches(x, args.k, faiss_seconds, args.precisions)), flush=True)
        for precision in args.precisions:
            if args.queries:
                print(extrapolated_queries(x, labels, STORAGE[args.storage], precision, args.queries), flush=True)
            else:
                print(stored_metrics(x, labels, STORAGE[args.storage], precision), flush=True)


if __name__ == "__main__":
    main()
