"""The search work of a sharded ``compute()`` on P ranks, measured in one process.

``bench_ddp.py`` times the ranks as they run together: on a machine with fewer cores than ranks, their CPU time
also holds what sharing the cores costs. This benchmark runs the same searches one after the other in one process,
with no other process competing: every search a rank of P runs in ``symmetric_top_k`` (its shard against itself,
then the bipartite passes it serves, in the steps of a round, each side capped at the K-th distance found so
far) and the merges that fold each pass's candidates into its lists. Their sum, divided by the
time of one search of the whole set, is the work the sharded decomposition adds. The whole search and every P take
turns, round after round, at each thread count. Usage::

    python benchmarks/bench_shard_work.py --n 20000 60000
    python benchmarks/bench_shard_work.py --n 20000 --rounds 5 --threads 1

Shards are DistributedSampler-like strides, as in ``bench_ddp.py``. Only P = 2 and 3 are modelled: from P = 4 on,
a later round of bipartite passes starts from the caps the earlier rounds tightened.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import clustered_embeddings

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._sets import split_query_gallery
from torchmetrics_retrieval.metrics._sharded.search import (
    Found,
    _bipartite_blocks,
    _blocks,
    _fold,
    _kth,
    _merge_two,
    _padded,
    _search,
    _subset,
)

OPTIONS: dict[str, Any] = {"cmc_top_k": (1, 5, 10), "precision_top_k": (5,), "map_top_k": (10,), "map_at_r": True}
K = 19  # the search depth of OPTIONS on per_class20 data (19 relevant items per query)
PARTS = ("own", "bipartite", "merge")


def _problem(n: int) -> tuple[torch.Tensor, Any, RetrievalOptions]:
    """``(embeddings, the set searched against itself, options)`` of the benchmark's data."""
    x, labels = clustered_embeddings(n, "per_class20")
    return x, split_query_gallery(x, labels), RetrievalOptions.create(**OPTIONS)


def decomposition(n: int, world: int) -> Callable[[], tuple[dict[str, float], list[Found]]]:
    """A function that runs the searches of every rank of ``world`` once and returns the CPU seconds per part and
    each rank's merged top K (``(distances, global rows, valid)`` of its shard's samples)."""
    x, qg, options = _problem(n)
    shards = [torch.arange(r, n, world) for r in range(world)]

    def own(rows: torch.Tensor) -> Found:
        sub = _subset(qg, rows, x[rows])  # float64 rows read on demand, as ``symmetric_top_k`` reads them
        found = _search(sub, options, K, exact_distances=True, lazy=True)(torch.arange(rows.numel()))
        return _padded(found, K, rows, x)

    def side(rows: torch.Tensor, caps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return rows, x[rows], caps

    caps = [_kth(own(rows)) for rows in shards]

    def passes() -> list[tuple[int, slice, int, slice]]:
        """``(rank, its rows searched, peer, the peer's rows visiting)`` of every bipartite pass, as in
        ``symmetric_top_k`` (for P = 2 each rank takes half of the rectangle)."""
        if world == 2:
            half = shards[0].numel() // 2
            return [(0, slice(None, half), 1, slice(None)), (1, slice(None), 0, slice(half, None))]
        return [(r, slice(None), (r + 1) % world, slice(None)) for r in range(world)]

    def run() -> tuple[dict[str, float], list[Found]]:
        seconds, merged = dict.fromkeys(PARTS, 0.0), []
        with plan.part_of(n, n):  # the kernels chosen as the sharded search chooses them
            for rows in shards:
                start = time.process_time()
                merged.append(own(rows))
                seconds["own"] += time.process_time() - start
            # every rank takes a round in the same steps, each a share of its visitors (``_visit``)
            steps = max(len(_blocks(shards[peer][visiting].numel())) for _, _, peer, visiting in passes())
            for rank, searched, peer, visiting in passes():
                rows, row_caps = shards[rank][searched], caps[rank][searched]
                first = visiting.start or 0
                ours = None
                for block in _blocks(shards[peer][visiting].numel(), steps):
                    arriving = slice(first + block.start, first + block.stop)
                    start = time.process_time()
                    found, theirs = _bipartite_blocks(
                        qg, side(rows, row_caps), side(shards[peer][arriving], caps[peer][arriving]), options, K
                    )
                    seconds["bipartite"] += time.process_time() - start
                    start = time.process_time()
                    ours = found if ours is None else _merge_two(ours, found, K)
                    row_caps = torch.minimum(row_caps, _kth(ours))  # the next block meets the rows capped lower
                    _fold(merged[peer], arriving, theirs, K)
                    seconds["merge"] += time.process_time() - start
                if ours is not None:
                    start = time.process_time()
                    _fold(merged[rank], searched, ours, K)
                    seconds["merge"] += time.process_time() - start
        return seconds, merged

    return run


def whole_search(n: int) -> Callable[[], float]:
    """A function that runs one search of the whole set (the one-process ``compute()``'s) and returns its CPU
    seconds."""
    _, qg, options = _problem(n)

    def run() -> float:
        start = time.process_time()
        _search(qg, options, K, exact_distances=True)(torch.arange(n))
        return time.process_time() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 60_000])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {load}, D = 128, K = {K}")
    for n in args.n:
        whole, worlds = whole_search(n), {world: decomposition(n, world) for world in (2, 3)}
        ratios: dict[tuple[int, int], list[float]] = {}
        for round_ in range(args.rounds):
            for threads in args.threads:
                torch.set_num_threads(threads)
                reference = whole()
                shown = [f"N = {n}, {threads} thread(s), round {round_ + 1}: whole search {reference:.3f} s"]
                for world, run in worlds.items():
                    parts, _ = run()
                    total = sum(parts.values())
                    ratios.setdefault((threads, world), []).append(total / reference)
                    split = " + ".join(f"{name} {parts[name]:.3f}" for name in PARTS)
                    shown.append(f"{world} ranks {split} = {total:.3f} s ({total / reference:.2f}x)")
                print("; ".join(shown), flush=True)
        for (threads, world), values in ratios.items():
            print(
                f"N = {n}, {threads} thread(s), {world} ranks: searches summed over the ranks, median "
                f"{statistics.median(values):.2f}x the whole search ({', '.join(f'{v:.2f}' for v in values)})"
            )


if __name__ == "__main__":
    main()
