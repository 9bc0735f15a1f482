"""Sharded evaluation under DDP, one option family at a time: ``compute()`` on 1 process and on P gloo processes.

The families (D = 128, 20 samples per class, ``clustered_embeddings(n, "per_class20")``):

* ``knn``: ``EmbeddingMetrics`` with cmc@1,5, precision@5, map@5, MAP@R and R-precision (the kNN set);
* ``full_ranking``: the kNN set plus ``mrr``, ``map_full`` and ``minp``;
* ``pairs``: the kNN set plus ``fmr_vals=(1e-3, 1e-2)``, ``eer`` and ``min_dcf_p_target=(0.01,)``;
* ``roc_auc``: the kNN set plus ``roc_auc``;
* ``contrastive``: ``ContrastiveAccuracy(top_k=(1, 5))``, the second view a slightly perturbed copy of the first;
* ``cross_modal``: ``CrossModalRetrieval`` with the kNN set, A the embeddings and B the perturbed copy, row i of A
  and row i of B one pair (group id i).

Every process (one thread each) holds the rows ``r::P`` of the data (``indexes`` given, as a DistributedSampler
without padding), calls ``compute()`` once on a fresh metric to warm up (the first call loads compiled kernels),
then ``--later`` more times on fresh metrics; the fastest of those is the timed call. Its time is the slowest
rank's; its CPU time (``time.process_time``: every thread, gloo's included) is summed over the ranks, so that "work"
(that sum over one process's) shows what sharding adds apart from how the machine shares its cores. The working
memory is measured in processes of their own (``working_memory``), in the first round only, and is the largest
rank's. Every rank's values are checked identical (``torch.equal`` on every key) to one process's.

``--modes copies`` runs P one-process ``compute()`` calls at once instead, each on the whole set and without a
process group: P problems' time alone over their time together is the speed-up that sharing this machine's cores
and caches leaves to sharded mode at best, and their CPU time over P alone the least work it can show.

With ``--rounds R`` each (family, N) runs R rounds in turn (one process, then each P): each ratio compares runs
seconds apart, and the medians over rounds are printed with the ratio of every round. Usage::

    python benchmarks/bench_ddp.py
    python benchmarks/bench_ddp.py --n 20000 --ranks 2 --rounds 1 --no-memory
    python benchmarks/bench_ddp.py --families pairs contrastive --n 60000 --json ddp.json
    python benchmarks/bench_ddp.py --n 60000 --ranks 2 3 --modes shard gather
    python benchmarks/bench_ddp.py --n 20000 --ranks 2 --modes shard copies
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import clustered_embeddings, memory_mib, reset_peak_memory
from _results import run_info, write
from torch import Tensor
from torchmetrics import Metric

from torchmetrics_retrieval import ContrastiveAccuracy, CrossModalRetrieval, EmbeddingMetrics

Mode = Literal["shard", "gather", "copies"]

KNN: dict[str, Any] = {
    "cmc_top_k": (1, 5),
    "precision_top_k": (5,),
    "map_top_k": (5,),
    "map_at_r": True,
    "r_precision": True,
}
EMBEDDING_FAMILIES: dict[str, dict[str, Any]] = {
    "knn": KNN,
    "full_ranking": {**KNN, "mrr": True, "map_full": True, "minp": True},
    "pairs": {**KNN, "fmr_vals": (1e-3, 1e-2), "eer": True, "min_dcf_p_target": (0.01,)},
    "roc_auc": {**KNN, "roc_auc": True},
}
FAMILIES: tuple[str, ...] = (*EMBEDDING_FAMILIES, "contrastive", "cross_modal")
PERTURBATION = 0.05  # per coordinate: a view's partner stays its nearest candidate for most rows, not all

# the project's targets: speed-up at 2 ranks, work at every P, working memory per rank at 2 ranks and N >= 60k
TARGET_SPEEDUP, TARGET_WORK, TARGET_MEMORY = 1.7, 1.15, 0.6


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _data(family: str, n: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """The embeddings, their labels and (for the two-view families) the perturbed copy; the same on every rank."""
    x, labels = clustered_embeddings(n, "per_class20")
    if family not in ("contrastive", "cross_modal"):
        return x, labels, None
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    return x, labels, x + PERTURBATION * noise


def _metric(family: str, mode: Mode) -> Metric:
    if family == "contrastive":
        return ContrastiveAccuracy(top_k=(1, 5), distributed=mode)
    if family == "cross_modal":
        return CrossModalRetrieval(**KNN, distributed=mode)
    return EmbeddingMetrics(**EMBEDDING_FAMILIES[family], distributed=mode)


def _feed(metric: Metric, data: tuple[Tensor, Tensor, Tensor | None], rows: Tensor) -> None:
    x, labels, second = data
    if isinstance(metric, ContrastiveAccuracy):
        assert second is not None
        metric.update(x[rows], second[rows], indexes=rows)
    elif isinstance(metric, CrossModalRetrieval):
        assert second is not None
        metric.update(x[rows], rows, second[rows], rows, indexes_a=rows, indexes_b=rows)
    else:
        metric.update(x[rows], labels[rows], indexes=rows)


def _rank(rank: int, world: int, port: int, family: str, n: int, mode: Mode, calls: int, out: str) -> None:
    torch.set_num_threads(1)
    data = _data(family, n)
    grouped = world > 1 and mode != "copies"  # copies: every process computes the whole set on its own
    if grouped:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = torch.arange(n) if mode == "copies" else torch.arange(rank, n, world)
    seconds, cpu, mib = [], [], []
    for _ in range(calls):
        metric = _metric(family, "shard" if mode == "copies" else mode)
        _feed(metric, data, rows)
        if grouped:
            dist.barrier()  # a rank's time is its compute(), not its wait for slower updates
        can_reset = reset_peak_memory()
        base, _ = memory_mib()
        start, start_cpu = time.perf_counter(), time.process_time()
        values = metric.compute()
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        _, peak = memory_mib()
        mib.append(peak - base if can_reset else float("nan"))
        del metric
    torch.save({"seconds": seconds, "cpu": cpu, "mib": mib, "values": values}, Path(out) / f"{rank}.pt")
    if grouped:
        dist.destroy_process_group()


def _spawn(family: str, n: int, world: int, mode: Mode, calls: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, _port(), family, n, mode, calls, out), nprocs=world, join=True)
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]


def identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


class Run(NamedTuple):
    """The calls of one spawn: a warm-up, then ``later`` timed ones."""

    warmup: float  # the slowest rank's first call
    seconds: float  # the slowest rank's, in the fastest timed call
    cpu: float  # CPU seconds of that call, summed over the ranks
    mib: float  # the largest rank's working memory (see ``working_memory``; NaN: not measured)
    values: list[dict[str, Tensor]]  # every rank's


def working_memory(family: str, n: int, world: int, mode: Mode) -> float:
    """The largest rank's peak RSS during a second call above its RSS before it, in processes whose C library
    maps every allocation from 1 MiB on by itself (``MALLOC_MMAP_THRESHOLD_``), so that RSS follows live memory.

    By default glibc keeps freed blocks (up to 32 MiB each) for reuse: a later call's peak would then show what
    earlier calls left, and a first call's would count the compiled kernels it loads. These processes are not
    timed: mapping every large block by itself slows them down.
    """
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(2**20)  # read by glibc when a spawned process starts
    try:
        results = _spawn(family, n, world, mode, calls=2)
    finally:
        del os.environ["MALLOC_MMAP_THRESHOLD_"]
    return max(r["mib"][1] for r in results)


def run(family: str, n: int, world: int, mode: Mode, later: int = 1, memory: bool = True) -> Run:
    """A warm-up and ``later`` timed calls on ``world`` processes (one: the reference); with ``memory``, the working
    memory from processes of their own."""
    results = _spawn(family, n, world, mode, calls=1 + later)
    slowest = [max(r["seconds"][call] for r in results) for call in range(1 + later)]
    best = min(range(1, 1 + later), key=slowest.__getitem__)
    mib = working_memory(family, n, world, mode) if memory else float("nan")
    cpu = sum(r["cpu"][best] for r in results)
    return Run(slowest[0], slowest[best], cpu, mib, [r["values"] for r in results])


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN


def _record(family: str, n: int, world: int, mode: Mode, round_: int, ranks: Run, one: Run) -> dict[str, Any]:
    """One run against one process. For ``copies`` (P whole problems at once) the speed-up is the throughput, P
    problems' time alone over their time together, and the work their CPU time over P alone: the ceiling that
    sharing the machine's cores and caches sets on sharded mode, and the floor it sets on its work."""
    problems = world if mode == "copies" else 1
    return {
        "family": family,
        "n": n,
        "ranks": world,
        "mode": mode,
        "round": round_,
        "seconds": ranks.seconds,
        "warmup_seconds": ranks.warmup,
        "cpu": ranks.cpu,
        "memory_mib": _finite(ranks.mib),
        "one_seconds": one.seconds,
        "one_cpu": one.cpu,
        "one_memory_mib": _finite(one.mib),
        "speedup": problems * one.seconds / ranks.seconds,
        "work": ranks.cpu / (problems * one.cpu),
        "memory_ratio": _finite(ranks.mib / one.mib),
        "identical": all(identical(values, one.values[0]) for values in ranks.values),
        "load": os.getloadavg()[0],
    }


def measure(
    family: str,
    n: int,
    ranks: Sequence[int] = (2, 3, 4),
    rounds: int = 3,
    modes: Sequence[Mode] = ("shard",),
    later: int = 1,
    memory: bool = True,
) -> list[dict[str, Any]]:
    """``rounds`` interleaved rounds of one (family, N): one process, then each P and mode in turn. One record per
    run, the one-process run included (``ranks`` 1); the memory in the first round only (None in the others)."""
    if family not in FAMILIES:
        raise ValueError(f"`family` must be one of {FAMILIES}, got {family!r}.")
    records = []
    for round_ in range(rounds):
        with_memory = memory and round_ == 0
        one = run(family, n, 1, "shard", later, with_memory)
        records.append(_record(family, n, 1, "shard", round_, one, one))
        for world in ranks:
            for mode in modes:
                ranks_run = run(family, n, world, mode, later, with_memory)
                records.append(_record(family, n, world, mode, round_, ranks_run, one))
    return records


def _ratios(values: list[float]) -> str:
    median = statistics.median(values)
    return f"{median:.2f}x" + (f" ({', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else "")


def summary(records: list[dict[str, Any]]) -> list[str]:
    """One line per (family, N, P, mode) of ``measure``'s records: medians over rounds, each round's ratio."""
    lines = []
    keys = dict.fromkeys((r["family"], r["n"], r["ranks"], r["mode"]) for r in records if r["ranks"] > 1)
    for family, n, world, mode in keys:
        runs = [r for r in records if (r["family"], r["n"], r["ranks"], r["mode"]) == (family, n, world, mode)]
        speedup, work = [r["speedup"] for r in runs], [r["work"] for r in runs]
        missed = []
        if mode != "copies":  # copies are the machine's reference, not sharded mode: no target
            if world == 2 and statistics.median(speedup) < TARGET_SPEEDUP:
                missed.append("speed-up")
            if statistics.median(work) > TARGET_WORK:
                missed.append("work")
        memory = ""
        if runs[0]["memory_ratio"] is not None:
            ratio = runs[0]["memory_ratio"]
            memory = f", memory {runs[0]['memory_mib']:.0f} vs {runs[0]['one_memory_mib']:.0f} MiB = {ratio:.2f}x"
            if world == 2 and n >= 60_000 and ratio > TARGET_MEMORY:
                missed.append("memory")
        lines.append(
            f"{family:<12} N={n:<6} P={world} {mode}: 1 proc {statistics.median(r['one_seconds'] for r in runs):.2f} s,"
            f" P {statistics.median(r['seconds'] for r in runs):.2f} s, speed-up {_ratios(speedup)}, work "
            f"{_ratios(work)}{memory}, identical {all(r['identical'] for r in runs)}"
            + (f"  MISSES: {', '.join(missed)}" if missed else "")
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 60_000])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4], help="numbers of processes besides 1")
    parser.add_argument(
        "--modes", nargs="+", choices=["shard", "gather", "copies"], default=["shard"],
        help="copies: P one-process computes at once, each on the whole set (what sharing the machine costs)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per (family, N)")
    parser.add_argument("--later", type=int, default=1, help="timed calls after the warm-up; the fastest is kept")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the working memory")
    parser.add_argument("--json", type=Path, default=None, help="write every run's record and the machine here")
    args = parser.parse_args(argv)
    info = run_info([1], argv=argv)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"{info['date']}, {os.cpu_count()} CPUs, load average {load}, torch {torch.__version__}, D = 128, one "
        f"thread per rank; medians over {args.rounds} round(s), each round's ratio in brackets; targets: speed-up "
        f">= {TARGET_SPEEDUP}x at P = 2, work <= {TARGET_WORK}x, memory <= {TARGET_MEMORY}x at P = 2, N >= 60000",
        flush=True,
    )
    records: list[dict[str, Any]] = []
    for family in args.families:
        for n in args.n:
            found = measure(family, n, args.ranks, args.rounds, args.modes, args.later, args.memory)
            records += found
            print("\n".join(summary(found)), flush=True)
            if args.json is not None:  # rewritten after each (family, N): a stopped run keeps what it measured
                write(args.json, info, records)
    print(f"load average at the end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
