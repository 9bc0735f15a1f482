"""Speed and peak memory of ``FNMRAtFMR.compute()`` (the metric class), leave-one-out, one process.

Synthetic clustered unit-norm embeddings (100 classes), fed in batches of 1024 with their dataset
``indexes`` (so the de-duplication step runs too). N = 60k means 3.6e9 ordered pairs, which a direct
computation would have to hold in memory. Not a test: run it by hand, e.g.

    python benchmarks/bench_fnmr_metric.py                     # N = 60k, D = 64, the class only
    python benchmarks/bench_fnmr_metric.py --functional        # also the functional on the same data
    python benchmarks/bench_fnmr_metric.py --n 4000 --functional  # quick run

Prints, for each, the seconds of the call and the peak RSS of the process during it (the embeddings are
already allocated before), and checks that the class gives the functional's values bit for bit.

Peak RSS depends on the allocation history under glibc's default malloc: once a large block has been
freed, glibc raises its mmap threshold and serves the distance blocks from the heap, which then holds on
to freed memory. The same functional call can thus show +0.14 GiB or +2.2 GiB at N = 60k. Fix the
threshold to measure what the computation itself needs:

    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/bench_fnmr_metric.py --functional
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from _common import clustered_embeddings, memory_mib, reset_peak_memory

from torchmetrics_retrieval.functional.verification import fnmr_at_fmr
from torchmetrics_retrieval.metrics.verification import FNMRAtFMR

FMR_VALS = (0.001, 0.01, 0.1)
BATCH = 1024


def measure(name: str, fn: Callable[[], dict[str, torch.Tensor]], n: int) -> dict[str, torch.Tensor]:
    rss_before, _ = memory_mib()
    exact_peak = reset_peak_memory()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    _, peak = memory_mib()
    n_pairs = n * (n - 1)
    peak_kind = "peak RSS during the call" if exact_peak else "peak RSS of the process (reset not allowed)"
    print(f"{name}: {seconds:.1f} s ({n_pairs / seconds / 1e6:.0f} M pairs/s)")
    print(f"  RSS before {rss_before:.0f} MiB, {peak_kind} {peak:.0f} MiB (+{peak - rss_before:.0f} MiB)")
    for key, value in result.items():
        print(f"  {key} = {value.item():.6f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--functional", action="store_true", help="also time the functional on the same data")
    args = parser.parse_args()

    x, labels = clustered_embeddings(args.n, "classes100", dim=args.dim)
    metric = FNMRAtFMR(fmr_vals=FMR_VALS)
    start = time.perf_counter()
    for rows in torch.arange(args.n).split(BATCH):
        metric.update(x[rows], labels[rows], indexes=rows)
    print(f"N={args.n} D={args.dim} pairs={args.n * (args.n - 1):.3g} torch threads={torch.get_num_threads()}")
    print(f"update() of {len(metric.embeddings)} batches: {time.perf_counter() - start:.2f} s")
    from_class = measure("FNMRAtFMR.compute()", metric.compute, args.n)
    if args.functional:
        from_functional = measure("fnmr_at_fmr()", lambda: fnmr_at_fmr(x, labels, fmr_vals=FMR_VALS), args.n)
        same = all(torch.equal(from_class[key], from_functional[key]) for key in from_functional)
        print(f"class == functional bit for bit: {same}")


if __name__ == "__main__":
    main()
