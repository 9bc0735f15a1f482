"""compat.pml.AccuracyCalculator vs pytorch-metric-learning's, same data, same call, one run.

Clustered embeddings (N = 30k, D = 128, about 20 per class), the query set is the reference set
(``ref_includes_query=True``), the default metrics without NMI/AMI, ``k="max_bin_count"``. Prints the
wall time of each (best of ``--repeat``), the ratio, and the largest absolute difference per metric.

    python benchmarks/bench_compat_pml.py [--n 30000] [--dim 128] [--per-class 20] [--repeat 2]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

import torch


def clustered(n: int, dim: int, per_class: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n_classes = max(1, n // per_class)
    labels = torch.randint(0, n_classes, (n,), generator=g)
    centres = torch.randn(n_classes, dim, generator=g)
    x = centres[labels] + 1.3 * torch.randn(n, dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1), labels


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator as PMLCalculator

    from torchmetrics_retrieval.compat.pml import AccuracyCalculator

    logging.getLogger("PML").setLevel(logging.WARNING)
    x, labels = clustered(args.n, args.dim, args.per_class)
    options: dict[str, Any] = {"exclude": ("NMI", "AMI"), "k": "max_bin_count", "device": torch.device("cpu")}
    ours = AccuracyCalculator(**options)
    theirs = PMLCalculator(**options)
    call = (x, labels, x, labels)
    t_ours, r_ours = best_time(lambda: ours.get_accuracy(*call, ref_includes_query=True), args.repeat)
    t_theirs, r_theirs = best_time(lambda: theirs.get_accuracy(*call, ref_includes_query=True), args.repeat)

    print(f"N={args.n} D={args.dim} ~{args.per_class}/class, threads={torch.get_num_threads()}")
    print(f"pytorch-metric-learning: {t_theirs:8.2f} s")
    print(f"compat.pml:              {t_ours:8.2f} s")
    print(f"speed-up:                {t_theirs / t_ours:8.2f} x")
    for name in r_theirs:
        diff = abs(r_ours[name] - r_theirs[name])
        print(f"  {name:30s} pml={r_theirs[name]:.8f} ours={r_ours[name]:.8f} |diff|={diff:.2e}")


if __name__ == "__main__":
    main()
