"""``EmbeddingMetrics.compute()`` on 1, 2 and 3 gloo processes (one thread each), sharded and gathered.

Each rank holds a DistributedSampler-like stride of the samples (``indexes`` given) and calls ``compute()`` on
fresh metrics: the first call of a fresh process (it also loads the compiled kernels), then ``--later`` more (default
1), what every later validation epoch costs; the fastest of those is reported. The time of a call is the slowest
rank's; the CPU time the sum of every rank's (all threads of the process, gloo's included): what sharding adds in
work, apart from how the machine shares its cores. The memory is the working memory of a call, measured in processes
of their own (``working_memory``; the embeddings a rank holds are below its line), in the first round only. One
process with one thread is the reference; the values of every run are checked identical to it. Usage::

    python benchmarks/bench_ddp.py --n 20000 60000
    python benchmarks/bench_ddp.py --n 20000 60000 --modes shard --rounds 3
    python benchmarks/bench_ddp.py --n 20000 --modes shard --rounds 5 --later 3

With ``--rounds R`` the runs of one N (one process, then each number of ranks) repeat R times in turn and the
median speed-up of the later calls (and CPU ratio) is printed per configuration: each ratio compares two runs
seconds apart.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

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


def _rank(rank: int, world: int, port: int, n: int, mode: Literal["shard", "gather"], calls: int, out: str) -> None:
    torch.set_num_threads(1)
    x, labels = clustered_embeddings(n, "per_class20")
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = torch.arange(rank, n, world)
    x, labels = x[rows], labels[rows]
    seconds, cpu, mib = [], [], []
    for _ in range(calls):
        metric = EmbeddingMetrics(**OPTIONS, distributed=mode)
        metric.update(x, labels, indexes=rows)
        if world > 1:
            dist.barrier()
        can_reset = reset_peak_memory()
        base, _ = memory_mib()
        start, start_cpu = time.perf_counter(), time.process_time()
        values = metric.compute()
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        _, peak = memory_mib()
        mib.append(peak - base if can_reset else float("nan"))
        del metric
    torch.save((seconds, cpu, mib, values), Path(out) / f"{rank}.pt")
    if world > 1:
        dist.destroy_process_group()


def _spawn(n: int, world: int, mode: Literal["shard", "gather"], calls: int) -> list[Any]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, _port(), n, mode, calls, out), nprocs=world, join=True)
        results = [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]
    assert all(result[3] == results[0][3] for result in results)
    return results


class Run(NamedTuple):
    """One run of the ``compute()`` calls on every rank: the first, then ``later`` more."""

    seconds: list[float]  # the slowest rank's: the first call, the fastest later call
    cpu: float  # CPU seconds of that later call, summed over the ranks
    mib: float  # the largest rank's working memory in a second call (see ``working_memory``)
    values: dict[str, torch.Tensor]  # rank 0's


def working_memory(n: int, world: int, mode: Literal["shard", "gather"]) -> float:
    """The largest rank's peak RSS during a second call above its RSS before it, in processes whose C library
    maps every allocation from 1 MiB on by itself (``MALLOC_MMAP_THRESHOLD_``), so that RSS follows live memory.

    By default glibc keeps freed blocks (up to 32 MiB each) for reuse: a later call's peak would then show what
    earlier calls left, and a first call's would count the compiled kernels it loads. These processes are not
    timed: mapping every large block by itself costs them up to a tenth more.
    """
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(2**20)  # read by glibc when a spawned process starts
    try:
        results = _spawn(n, world, mode, calls=2)
    finally:
        del os.environ["MALLOC_MMAP_THRESHOLD_"]
    return max(r[2][1] for r in results)


def run(n: int, world: int, mode: Literal["shard", "gather"], later: int = 1, memory: bool = True) -> Run:
    """The calls on ``world`` processes (one: the reference), their values checked equal across ranks; with
    ``memory``, the working memory from processes of their own (NaN without)."""
    results = _spawn(n, world, mode, calls=1 + later)
    slowest = [max(r[0][call] for r in results) for call in range(1 + later)]
    best = min(range(1, 1 + later), key=slowest.__getitem__)
    mib = working_memory(n, world, mode) if memory else float("nan")
    return Run([slowest[0], slowest[best]], sum(r[1][best] for r in results), mib, results[0][3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 60_000])
    parser.add_argument("--modes", nargs="+", choices=["shard", "gather"], default=["shard", "gather"])
    parser.add_argument("--rounds", type=int, default=1, help="times the whole sequence runs, in turn, per N")
    parser.add_argument("--later", type=int, default=1, help="calls after the first; the fastest one is reported")
    args = parser.parse_args()
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {load}, D = 128, one thread per rank"
    )
    for n in args.n:
        speedups: dict[str, list[float]] = {}  # later calls, 1 process / P ranks, per round
        cpu_ratios: dict[str, list[float]] = {}  # later calls, CPU summed over P ranks / 1 process, per round
        for round_ in range(args.rounds):
            one = run(n, 1, "shard", args.later, memory=round_ == 0)
            memory = f", working memory {one.mib:.0f} MiB" if round_ == 0 else ""
            print(f"N = {n}: 1 process: first call {one.seconds[0]:.2f} s, later calls {one.seconds[1]:.2f} s "
                  f"(CPU {one.cpu:.2f} s){memory}")  # fmt: skip
            for world in (2, 3):
                for mode in args.modes:
                    ranks = run(n, world, mode, args.later, memory=round_ == 0)
                    same = ranks.values.keys() == one.values.keys() and all(
                        torch.equal(ranks.values[k], one.values[k]) for k in ranks.values
                    )
                    speedups.setdefault(f"{world} ranks, {mode}", []).append(one.seconds[1] / ranks.seconds[1])
                    cpu_ratios.setdefault(f"{world} ranks, {mode}", []).append(ranks.cpu / one.cpu)
                    memory = (
                        f"; working memory per rank {ranks.mib:.0f} MiB ({ranks.mib / one.mib:.2f}x of 1 process)"
                        if round_ == 0
                        else ""
                    )
                    print(
                        f"  {world} ranks, {mode}: first call {ranks.seconds[0]:.2f} s = "
                        f"{one.seconds[0] / ranks.seconds[0]:.2f}x faster than 1 process, later calls "
                        f"{ranks.seconds[1]:.2f} s = {one.seconds[1] / ranks.seconds[1]:.2f}x (CPU summed over the "
                        f"ranks {ranks.cpu:.2f} s = {ranks.cpu / one.cpu:.2f}x){memory}, "
                        f"identical: {same}"
                    )
        if args.rounds > 1:
            for what, ratios in speedups.items():
                shown = ", ".join(f"{v:.2f}" for v in ratios)
                cpu = cpu_ratios[what]
                print(
                    f"N = {n}, {what}: later calls median {statistics.median(ratios):.2f}x faster ({shown}); CPU "
                    f"summed over the ranks median {statistics.median(cpu):.2f}x one process's "
                    f"({', '.join(f'{v:.2f}' for v in cpu)})"
                )


if __name__ == "__main__":
    main()
