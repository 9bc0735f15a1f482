"""Overhead of ``EmbeddingMetrics.compute()`` over the direct functional call on the same data.

The data (seeded clustered embeddings, ``_common.py``): N samples, D dimensions, about 20 per class. The
metric is fed in batches like a validation loop, then ``compute()`` is timed; the direct call is
``retrieval_metrics`` on the concatenated tensors with the same options. Both run in this process: each
``compute()`` is bracketed by two direct calls and compared with their mean, so every ratio comes from
one run. Wall-clock and process CPU time are both printed; on a shared, loaded machine the CPU-time
ratio is the more stable one (compare ratios, not seconds). Variants: plain; with ``indexes`` (shuffled
order, 1% DistributedSampler-like duplicates, de-duplicated in compute); ``storage_dtype=torch.float16``.
Every variant must give the same numbers as the direct call (checked). ``collect s`` is the time of the
only work ``compute()`` adds in one process (concatenating the batches, de-duplicating by index).

Usage::

    python benchmarks/bench_metric_overhead.py                 # N = 20000, D = 128
    python benchmarks/bench_metric_overhead.py --n 5000 --batch-size 128
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import clustered_embeddings

from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.metrics import EmbeddingMetrics

OPTIONS: dict[str, Any] = {"cmc_top_k": (1, 5), "precision_top_k": (5,), "map_top_k": (5,), "map_at_r": True}


def timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """``((wall seconds, CPU seconds of this process, all threads), result)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu), result


def fed_metric(x: torch.Tensor, labels: torch.Tensor, batch_size: int, variant: str) -> tuple[float, EmbeddingMetrics]:
    """A metric fed batch by batch; returns the total update time and the metric."""
    metric = EmbeddingMetrics(**OPTIONS, storage_dtype=torch.float16 if variant == "float16" else None)
    order, indexes = torch.arange(x.shape[0]), None
    if variant == "indexes":
        generator = torch.Generator().manual_seed(1)
        order = torch.randperm(x.shape[0], generator=generator)
        order = torch.cat([order, order[: x.shape[0] // 100]])  # padded duplicates, as DistributedSampler adds
        indexes = order
    start = time.perf_counter()
    for rows in order.split(batch_size):
        metric.update(x[rows], labels[rows], indexes=None if indexes is None else rows)
    return time.perf_counter() - start, metric


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, labels = clustered_embeddings(args.n, "per_class20", dim=args.dim)
    if args.dim <= 2048:  # float16 storage is exact only for values float16 can hold: round the data once
        x = x.half().float()
    retrieval_metrics(x[:500], labels[:500], **OPTIONS)  # warm-up (imports, thread pools)

    direct = lambda: retrieval_metrics(x, labels, **OPTIONS)  # noqa: E731
    _, expected = timed(direct)
    print(f"N={args.n} D={args.dim} classes={int(labels.max()) + 1} batch_size={args.batch_size}")
    print(
        f"{'variant':<9} {'update s':>9} {'collect s':>10} {'compute s':>10} {'direct s':>9} "
        f"{'ratio wall':>11} {'ratio cpu':>10}"
    )
    for variant in ("plain", "indexes", "float16"):
        update_time, metric = fed_metric(x, labels, args.batch_size, variant)
        (collect_time, _), _ = timed(metric._collect)  # the only extra work of compute(): concatenation, de-duplication
        before, _ = timed(direct)
        (compute_wall, compute_cpu), values = timed(metric.compute)
        after, _ = timed(direct)
        for key, value in expected.items():
            if not torch.equal(values[key], value):
                raise AssertionError(f"{variant}: {key} = {float(values[key])} differs from {float(value)}")
        direct_wall, direct_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        print(
            f"{variant:<9} {update_time:>9.3f} {collect_time:>10.4f} {compute_wall:>10.3f} {direct_wall:>9.3f} "
            f"{compute_wall / direct_wall:>11.3f} {compute_cpu / direct_cpu:>10.3f}"
        )


if __name__ == "__main__":
    main()
