"""Face/speaker verification and re-identification metrics against bare faiss, at one thread and at all cores.

* ``eer`` + ``min_dcf`` over every ordered pair (with three fmr values, sharing the passes) against one bare faiss
  kNN search (K = 21) on the same data, and the peak RSS above the embeddings; then the same with ``roc_auc``
  (its own pass of float64 blocks);
* ``camera_ids`` against the same call with ``sequence_ids``: random sequence ids (the same number of distinct
  ids, so both exclude about as many items, but camera_ids leaves out near neighbours of the query's own label,
  which the search must look past), and one sequence per (label, camera) (the very same items, so only the code
  path differs). Two calls: the re-identification protocol (full MAP, mINP, MAP@R: every value from the
  full-ranking pass, no search) and one that searches (CMC, MAP@R, mINP).

Data: seeded clustered embeddings (``_common.py``), D = 128, 20 samples per class; every figure from one run,
each ratio taken between timings seconds apart. ``--json PATH`` writes the records with the machine, the command
and the versions (``_results.py``). Usage::

    python benchmarks/bench_reid_verification.py                 # N = 20000
    python benchmarks/bench_reid_verification.py --json benchmarks/results/verification.json
    python benchmarks/bench_reid_verification.py --n 100000 --threads 2 --rates-only
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import torch
from _common import clustered_embeddings, memory_mib, reset_peak_memory
from _results import run_info, write

from torchmetrics_retrieval.functional import fnmr_at_fmr, retrieval_metrics

#: The calls timed with camera_ids and with sequence_ids: the full-ranking pass alone, and the search with it.
CALLS: dict[str, dict[str, Any]] = {
    "map + minp + map@r (no search)": {"map_full": True, "minp": True, "map_at_r": True},
    "cmc + map@r + minp (search)": {"cmc_top_k": (1, 5), "map_at_r": True, "minp": True},
}


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(seconds, peak MiB above the RSS before the call)."""
    can_reset = reset_peak_memory()
    base, _ = memory_mib()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    _, peak = memory_mib()
    return seconds, (peak - base) if can_reset else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--rates-only", action="store_true", help="skip the camera_ids rows")
    parser.add_argument("--json", type=Path, default=None, help="write the records, the machine and the run here")
    args = parser.parse_args()
    x, labels = clustered_embeddings(args.n, "per_class20")
    g = torch.Generator().manual_seed(1)
    cameras = torch.randint(0, 6, (args.n,), generator=g)
    sequences = torch.randint(0, int(torch.unique(labels * 6 + cameras).numel()), (args.n,), generator=g)
    # one sequence per (label, camera): the very items camera_ids leaves out, so only the code path differs
    same_items = torch.unique(labels * 6 + cameras, return_inverse=True)[1]
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, N = {args.n}, {os.cpu_count()} CPUs, load average {load}")
    fnmr_at_fmr(x[:2000], labels[:2000], eer=True, roc_auc=True)  # warm-up: every compiled kernel loaded
    for options in CALLS.values():
        retrieval_metrics(x[:3000], labels[:3000], sequence_ids=sequences[:3000], **options)
        retrieval_metrics(x[:3000], labels[:3000], camera_ids=cameras[:3000], **options)
    info = run_info(args.threads)
    records: list[dict[str, Any]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(threads)

        def bare() -> None:
            index = faiss.IndexFlatL2(x.shape[1])
            index.add(x.numpy())
            index.search(x.numpy(), 22)

        faiss_s, _ = timed(bare)
        rates_s, rates_mib = timed(
            lambda: fnmr_at_fmr(x, labels, fmr_vals=(1e-3, 1e-2, 1e-1), eer=True, min_dcf_p_target=(0.01, 0.05))
        )
        auc_s, auc_mib = timed(
            lambda: fnmr_at_fmr(x, labels, fmr_vals=(), eer=True, min_dcf_p_target=(0.01, 0.05), roc_auc=True)
        )
        common = {"n": args.n, "threads": threads, "faiss_seconds": faiss_s}
        records.append({**common, "call": "rates", "seconds": rates_s, "peak_mib": rates_mib})
        records.append({**common, "call": "roc_auc", "seconds": auc_s, "peak_mib": auc_mib})
        print(f"{threads} thread(s): faiss K=21 {faiss_s:.2f} s")
        print(f"  eer + min_dcf (2 targets) + fnmr@fmr (3): {rates_s:.2f} s = {rates_s / faiss_s:.2f}x faiss, "
              f"peak {rates_mib:.0f} MiB above the data")  # fmt: skip
        print(f"  eer + min_dcf (2 targets) + roc_auc: {auc_s:.2f} s = {auc_s / faiss_s:.2f}x faiss, "
              f"peak {auc_mib:.0f} MiB above the data")  # fmt: skip
        if args.rates_only:
            continue
        for call, options in CALLS.items():
            seq_s, _ = timed(functools.partial(retrieval_metrics, x, labels, sequence_ids=sequences, **options))
            cam_s, _ = timed(functools.partial(retrieval_metrics, x, labels, camera_ids=cameras, **options))
            same_s, _ = timed(functools.partial(retrieval_metrics, x, labels, sequence_ids=same_items, **options))
            times = {"sequence_seconds": seq_s, "camera_seconds": cam_s, "same_items_seconds": same_s}
            records.append({**common, "call": call, **times})
            print(f"  {call}: sequence_ids {seq_s:.2f} s, camera_ids {cam_s:.2f} s: camera_ids costs "
                  f"{100 * (cam_s / seq_s - 1):+.1f}%; against sequence_ids leaving out the same items "
                  f"({same_s:.2f} s): {100 * (cam_s / same_s - 1):+.1f}%")  # fmt: skip
    if args.json is not None:
        write(args.json, info, records)


if __name__ == "__main__":
    main()
