"""Speed and peak memory of the exact streaming ``fnmr_at_fmr``, leave-one-out, one process.

Synthetic clustered unit-norm embeddings (100 classes). Every ordered pair of distinct samples is a pair
(N = 60k: 3.6e9 pairs, of which about 1% positive), which a direct computation would have to hold in
memory (14 GB of float32 distances alone). Not a test: run it by hand, e.g.

    python benchmarks/bench_verification.py                  # N = 60k, D = 64
    python benchmarks/bench_verification.py --n 20000 --check  # also against numpy over all pairs

``--check`` materialises all pairs with numpy to compare (only for small N). Prints seconds, the peak
RSS of the process during the call (the embeddings are already allocated) and the values.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import clustered_embeddings, memory_mib, reset_peak_memory

from torchmetrics_retrieval.functional.verification import fnmr_at_fmr

FMR_VALS = (0.001, 0.01, 0.1)


def direct(x: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """All pairs in memory: numpy quantile of the negative distances, then the share of positives above."""
    d = torch.cdist(x.double(), x.double()).numpy()
    same = (labels[:, None] == labels[None, :]).numpy()
    off_diagonal = ~np.eye(len(x), dtype=bool)
    positives, negatives = d[same & off_diagonal], d[~same]
    return [float((positives >= t).mean()) for t in np.quantile(negatives, FMR_VALS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--check", action="store_true", help="compare with numpy over all pairs (small N only)")
    args = parser.parse_args()

    x, labels = clustered_embeddings(args.n, "classes100", dim=args.dim)
    rss_before, _ = memory_mib()
    exact_peak = reset_peak_memory()
    start = time.perf_counter()
    result = fnmr_at_fmr(x, labels, fmr_vals=FMR_VALS)
    seconds = time.perf_counter() - start
    _, peak = memory_mib()
    n_pairs = args.n * (args.n - 1)
    print(f"fnmr_at_fmr  N={args.n} D={args.dim} pairs={n_pairs:.3g} torch threads={torch.get_num_threads()}")
    print(f"  time {seconds:.1f} s ({n_pairs / seconds / 1e6:.0f} M pairs/s)")
    peak_kind = "peak RSS during the call" if exact_peak else "peak RSS of the process (reset not allowed)"
    print(f"  RSS before {rss_before:.0f} MiB, {peak_kind} {peak:.0f} MiB (+{peak - rss_before:.0f} MiB)")
    for key, value in result.items():
        print(f"  {key} = {value.item():.6f}")
    if args.check:
        expected = direct(x, labels)
        got = [result[f"fnmr@fmr/{f}"].item() for f in FMR_VALS]
        worst = max(abs(a - b) for a, b in zip(got, expected, strict=True))
        print(f"  numpy over all pairs: {expected}; max |diff| = {worst:.2e}")


if __name__ == "__main__":
    main()
