"""Trial lists at scale: the values of given scores against a numpy sort of those scores, and the working memory of
a trial list over a large set of embeddings. Usage::

    python benchmarks/bench_trials.py                       # 10M scores; 10M trials over 1M x 128 embeddings
    python benchmarks/bench_trials.py --scores 2000000 --embeddings 200000 --trials 2000000
    python benchmarks/bench_trials.py --trials 0            # the scores alone

Each figure is taken at one thread and at every core (torch's and numba's threads), in the same run, and each time
of given scores is printed as a ratio to a numpy sort of the same scores, timed next to it. The scores are Gaussian
float32, 10% targets shifted by 2. The trials pair random rows of L2-normalised random embeddings (cosine); the
memory is the peak RSS of ``trial_metrics`` above the RSS with the embeddings and the trial list already held.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numba
import numpy as np
import torch
from _common import best_of, memory_mib, reset_peak_memory

from torchmetrics_retrieval.functional import score_metrics, trial_metrics

OPTION_SETS = {
    "eer + min_dcf + cllr": {"eer": True, "min_dcf_p_target": 0.01, "cllr": True},
    "eer + min_dcf": {"eer": True, "min_dcf_p_target": 0.01},
    "fmr_vals": {"fmr_vals": (1e-4, 1e-3, 1e-2)},
    "roc_auc": {"roc_auc": True},
    "act_dcf": {"act_dcf_p_target": (0.01, 0.05)},
}


def set_threads(threads: int) -> None:
    """Every thread pool the values use: torch's, and numba's (the package's kernels follow torch's count)."""
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def scores_against_sort(n: int, threads: int) -> list[str]:
    set_threads(threads)
    g = torch.Generator().manual_seed(0)
    is_target = torch.rand(n, generator=g) < 0.1
    scores = torch.randn(n, generator=g) + 2.0 * is_target
    # a warm-up of full size: the kernels compiled, and the process's first touch of that much memory not timed
    score_metrics(scores, is_target, **OPTION_SETS["eer + min_dcf + cllr"])
    sort_seconds, _ = best_of(lambda: np.sort(scores.numpy()), 5)
    lines = [f"{n:,} scores, {threads} thread(s): numpy sort {sort_seconds:.3f} s"]
    for name, options in OPTION_SETS.items():
        seconds, _ = best_of(lambda options=options: score_metrics(scores, is_target, **options), 5)
        lines.append(f"  {name:<22} {seconds:.3f} s = {seconds / sort_seconds:.2f}x the sort")
    return lines


def trials_memory(n_embeddings: int, n_trials: int, threads: int, dim: int = 128) -> str:
    set_threads(threads)
    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(n_embeddings, dim, generator=g), dim=1)
    enrol, test = torch.randint(0, n_embeddings, (2, n_trials), generator=g)
    is_target = torch.rand(n_trials, generator=g) < 0.1
    held = x.numel() * x.element_size() / 2**20
    can_reset = reset_peak_memory()
    base, _ = memory_mib()
    seconds, _ = best_of(lambda: trial_metrics(x, (enrol, test, is_target), eer=True, min_dcf_p_target=0.01), 1)
    _, peak = memory_mib()
    working = f"{peak - base:.0f} MiB" if can_reset else "not measured"
    return (
        f"{n_trials:,} trials over {n_embeddings:,} x {dim} embeddings ({held:.0f} MiB), {threads} thread(s): "
        f"{seconds:.2f} s, working memory {working}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scores", type=int, default=10_000_000)
    parser.add_argument("--embeddings", type=int, default=1_000_000)
    parser.add_argument("--trials", type=int, default=10_000_000)
    args = parser.parse_args(argv)
    for threads in sorted({1, os.cpu_count() or 1}):
        print("\n".join(scores_against_sort(args.scores, threads)), flush=True)
        if args.trials:
            print(trials_memory(args.embeddings, args.trials, threads), flush=True)


if __name__ == "__main__":
    main()
