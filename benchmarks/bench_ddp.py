"""``EmbeddingMetrics.compute()`` on 1, 2 and 3 gloo processes (one thread each), sharded and gathered.

Each rank holds a DistributedSampler-like stride of the samples (``indexes`` given) and calls ``compute()`` twice,
on two fresh metrics: the first call of a fresh process (it also loads the compiled kernels) and the second, what
every later validation epoch costs. The time is the slowest rank's; the memory each rank's peak RSS during the
first call above its RSS before it (the embeddings it already held are below that line). One process with one
thread is the reference; the values of every run are checked identical to it. Usage::

    python benchmarks/bench_ddp.py --n 20000 60000
    python benchmarks/bench_ddp.py --n 20000 60000 --modes shard --rounds 3

With ``--rounds R`` the runs of one N (one process, then each number of ranks) repeat R times in turn and the
median speed-up of the later calls is printed per configuration: each ratio compares two runs seconds apart.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import clustered_embeddings, memory_mib, reset_peak_memory

from torchmetrics_retrieval import EmbeddingMetrics

OPTIONS: dict[str, Any] = {"cmc_top_k": (1, 5, 10), "precision_top_k": (5,), "map_top_k": (10,), "map_at_r": True}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, n: int, mode: Literal["shard", "gather"], out: str) -> None:
    torch.set_num_threads(1)
    x, labels = clustered_embeddings(n, "per_class20")
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = torch.arange(rank, n, world)
    x, labels = x[rows], labels[rows]
    seconds, mib = [], []
    for _ in range(2):
        metric = EmbeddingMetrics(**OPTIONS, distributed=mode)
        metric.update(x, labels, indexes=rows)
        if world > 1:
            dist.barrier()
        can_reset = reset_peak_memory()
        base, _ = memory_mib()
        start = time.perf_counter()
        values = metric.compute()
        seconds.append(time.perf_counter() - start)
        _, peak = memory_mib()
        mib.append(peak - base if can_reset else float("nan"))
        del metric
    # the first call's memory: the allocator keeps what it freed, so the second call's peak barely rises
    torch.save((seconds, mib[0], values), Path(out) / f"{rank}.pt")
    if world > 1:
        dist.destroy_process_group()


def run(n: int, world: int, mode: Literal["shard", "gather"]) -> tuple[list[float], float, dict[str, torch.Tensor]]:
    """(slowest rank's seconds of the first and second call, largest rank's peak MiB above its RSS before the
    first call, values of rank 0)."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, _port(), n, mode, out), nprocs=world, join=True)
        results = [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]
    assert all(result[2] == results[0][2] for result in results)
    seconds = [max(r[0][call] for r in results) for call in range(2)]
    return seconds, max(r[1] for r in results), results[0][2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 60_000])
    parser.add_argument("--modes", nargs="+", choices=["shard", "gather"], default=["shard", "gather"])
    parser.add_argument("--rounds", type=int, default=1, help="times the whole sequence runs, in turn, per N")
    args = parser.parse_args()
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {load}, D = 128, one thread per rank"
    )
    for n in args.n:
        speedups: dict[str, list[float]] = {}  # later calls, 1 process / P ranks, per round
        for _ in range(args.rounds):
            one_s, one_mib, reference = run(n, 1, "shard")
            print(f"N = {n}: 1 process: first call {one_s[0]:.2f} s, later calls {one_s[1]:.2f} s, "
                  f"peak {one_mib:.0f} MiB")  # fmt: skip
            for world in (2, 3):
                for mode in args.modes:
                    seconds, mib, values = run(n, world, mode)
                    same = values.keys() == reference.keys() and all(
                        torch.equal(values[k], reference[k]) for k in values
                    )
                    speedups.setdefault(f"{world} ranks, {mode}", []).append(one_s[1] / seconds[1])
                    print(
                        f"  {world} ranks, {mode}: first call {seconds[0]:.2f} s = {one_s[0] / seconds[0]:.2f}x "
                        f"faster than 1 process, later calls {seconds[1]:.2f} s = {one_s[1] / seconds[1]:.2f}x; "
                        f"peak per rank {mib:.0f} MiB ({mib / max(one_mib, 1):.2f}x of 1 process), identical: {same}"
                    )
        if args.rounds > 1:
            for what, ratios in speedups.items():
                shown = ", ".join(f"{v:.2f}" for v in ratios)
                print(f"N = {n}, {what}: later calls median {statistics.median(ratios):.2f}x faster ({shown})")


if __name__ == "__main__":
    main()
