"""Speed and peak memory of ``retrieval_metrics`` against bare faiss kNN, pytorch-metric-learning and OML.

Every method runs in its own fresh subprocess on the same seeded clustered data (``_common.py``): the
worker builds the data, runs the method once on its first 1000 samples (what a fresh process loads once),
resets the peak-RSS counter, runs the method twice (``--repeats``) and reports the best time and the peak RSS
above the RSS it had once the data existed. The orchestrator prints one table per
(N, label regime, thread count) with the ratio of every method to the bare faiss kNN and our speed-up over
the anchors, then how much faster each method ran with all cores than with one (``--threads``, default: one
thread and every core, the same data). With ``--paired-threads`` one worker per method measures every thread
count, the counts taking turns pass after pass, so each speed-up compares passes seconds apart: on a shared
machine faiss alone moves by up to 2x between runs minutes apart. ``--json PATH`` writes every row, with the
machine, the command and the versions (``_results.py``), for ``make_page.py``.

Methods (K = max(5, max n(q)): what our call needs for cmc@5/precision@5/map@5, map@r and r-precision):

* ``matmul``: the float32 matrix product alone, row block by row block (a floor, no selection);
* ``faiss``: ``faiss.IndexFlatL2`` search with K + 1 neighbours (the self match comes back first);
* ``ours``: ``retrieval_metrics(cmc@1, cmc@5, precision@5, map@5, map@r, r_precision)``;
* ``ours_map_full``: the same plus ``map_full=True`` (full-ranking MAP; only up to ``--map-full-max``); every
  value then comes from the full ranks, with no kNN search;
* ``ours_mrr``: the same plus ``mrr=True`` (the reciprocal rank over the full ranking: the search, then a count
  for the queries with no hit in the first K);
* ``ours_fnmr``: ``fnmr_at_fmr(fmr_vals=(1e-3, 1e-2, 1e-1))`` over every ordered pair (up to ``--map-full-max``);
* ``pml``: ``AccuracyCalculator(precision_at_1, r_precision, mean_average_precision_at_r,
  k="max_bin_count")`` with ``ref_includes_query=True``;
* ``oml``: open-metric-learning's ``batched_knn_qg`` (top_n = K, self masked by id) and
  ``calc_retrieval_metrics`` (cmc@1, cmc@5, precision@5, map@5), run by ``--oml-python``.

Usage::

    python benchmarks/bench_retrieval.py                      # smoke run, N = 10k, both regimes
    python benchmarks/bench_retrieval.py --sizes 10000 30000 100000 --regimes per_class20 classes100 \\
        --oml-python /tmp/omlvenv/bin/python
    python benchmarks/bench_retrieval.py --sizes 20000 30000 --methods faiss ours --paired-threads --json r.json
    python benchmarks/bench_retrieval.py --profile --sizes 100000 --regimes classes100   # where our time goes
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REGIMES, Regime, best_of, clustered_embeddings, memory_mib, reset_peak_memory
from _results import run_info, version, write
from _retrieval_tables import format_scaling, format_table

METHODS: tuple[str, ...] = ("matmul", "faiss", "ours", "ours_map_full", "ours_mrr", "ours_fnmr", "pml", "oml")
#: The FMR values of the ``ours_fnmr`` row.
FMR_VALS = (1e-3, 1e-2, 1e-1)
#: Our cutoffs, and the keys of every method's values that estimate the same quantity as ours.
OURS_OPTIONS: dict[str, Any] = {
    "cmc_top_k": (1, 5),
    "precision_top_k": (5,),
    "map_top_k": (5,),
    "map_at_r": True,
    "r_precision": True,
}
PML_KEYS = {"precision_at_1": "cmc/1", "r_precision": "r_precision", "mean_average_precision_at_r": "map_at_r"}
MATMUL_ROWS = 4096
MIB = 2**20


# ----------------------------------------------------------------------------------------------------------------------
# the methods (each returns a flat {our key: float} of the values it computed)
# ----------------------------------------------------------------------------------------------------------------------


def search_k(labels: Tensor) -> int:
    """K of our call: the largest cutoff (5) or the largest number of relevant items of a query."""
    counts = torch.bincount(torch.unique(labels, return_inverse=True)[1])
    return max(5, int(counts.max()) - 1)


def run_matmul(x: Tensor, labels: Tensor) -> dict[str, float]:
    block = torch.empty(min(MATMUL_ROWS, x.shape[0]), x.shape[0])
    for start in range(0, x.shape[0], MATMUL_ROWS):
        rows = x[start : start + MATMUL_ROWS]
        torch.mm(rows, x.T, out=block[: rows.shape[0]])
    return {}


def run_faiss(x: Tensor, labels: Tensor) -> dict[str, float]:
    import faiss

    index = faiss.IndexFlatL2(x.shape[1])
    data = x.numpy()
    index.add(data)
    _, indices = index.search(data, search_k(labels) + 1)
    hits = labels[torch.from_numpy(indices[:, 1:2])].squeeze(1) == labels
    return {"cmc/1": float(hits.float().mean())}  # ignores exact ties with the self match; a sanity value


def _ours(x: Tensor, labels: Tensor, **extra: Any) -> dict[str, float]:
    from torchmetrics_retrieval.functional import retrieval_metrics

    return {key: float(value) for key, value in retrieval_metrics(x, labels, **OURS_OPTIONS, **extra).items()}


def run_ours(x: Tensor, labels: Tensor) -> dict[str, float]:
    return _ours(x, labels)


def run_ours_map_full(x: Tensor, labels: Tensor) -> dict[str, float]:
    return _ours(x, labels, map_full=True)


def run_ours_mrr(x: Tensor, labels: Tensor) -> dict[str, float]:
    return _ours(x, labels, mrr=True)


def run_ours_fnmr(x: Tensor, labels: Tensor) -> dict[str, float]:
    from torchmetrics_retrieval.functional import fnmr_at_fmr

    return {key: float(value) for key, value in fnmr_at_fmr(x, labels, fmr_vals=FMR_VALS).items()}


def run_pml(x: Tensor, labels: Tensor) -> dict[str, float]:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calculator = AccuracyCalculator(include=tuple(PML_KEYS), k="max_bin_count", device=torch.device("cpu"))
    values = calculator.get_accuracy(x, labels, x, labels, ref_includes_query=True)
    return {PML_KEYS[key]: float(value) for key, value in values.items()}


def run_oml(x: Tensor, labels: Tensor) -> dict[str, float]:
    from oml.functional.knn import batched_knn_qg
    from oml.functional.metrics import calc_retrieval_metrics

    ids = torch.arange(x.shape[0])
    _, retrieved, gt_ids = batched_knn_qg(
        x, x, search_k(labels), labels_query=labels, labels_gallery=labels, ids_query=ids, ids_gallery=ids
    )
    metrics = calc_retrieval_metrics(
        retrieved, gt_ids, cmc_top_k=(1, 5), precision_top_k=(5,), map_top_k=(5,), verbose=False
    )
    return {f"{name}/{k}": float(value) for name, by_k in metrics.items() for k, value in by_k.items()}


RUNNERS: dict[str, Callable[[Tensor, Tensor], dict[str, float]]] = {
    "matmul": run_matmul,
    "faiss": run_faiss,
    "ours": run_ours,
    "ours_map_full": run_ours_map_full,
    "ours_mrr": run_ours_mrr,
    "ours_fnmr": run_ours_fnmr,
    "pml": run_pml,
    "oml": run_oml,
}


# ----------------------------------------------------------------------------------------------------------------------
# one measurement (run in a fresh process by the orchestrator)
# ----------------------------------------------------------------------------------------------------------------------


def _import_for(method: str) -> None:
    """Import the method's libraries before the data exists, so the memory baseline includes them."""
    modules = {
        "faiss": ["faiss"],
        "ours": ["torchmetrics_retrieval.functional"],
        "ours_map_full": ["torchmetrics_retrieval.functional"],
        "ours_mrr": ["torchmetrics_retrieval.functional"],
        "ours_fnmr": ["torchmetrics_retrieval.functional"],
        "pml": ["pytorch_metric_learning.utils.accuracy_calculator"],
        "oml": ["oml.functional.knn", "oml.functional.metrics"],
    }
    for module in modules.get(method, []):
        __import__(module)


def _version(method: str) -> str | None:
    """The version of the library the method runs, read in the worker (the OML worker runs another interpreter)."""
    if method == "matmul":
        return None
    names = {"faiss": "faiss-cpu", "pml": "pytorch-metric-learning", "oml": "open-metric-learning"}
    return version(names.get(method, "torchmetrics-retrieval"))


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads in torch and, where it is importable, faiss (the same for every method)."""
    torch.set_num_threads(threads)
    try:
        import faiss
    except ImportError:
        return
    faiss.omp_set_num_threads(threads)


def _compiled_forced(method: str) -> contextlib.AbstractContextManager[None]:
    """Our compiled kernels for every size inside the block (for our methods; nothing for the anchors)."""
    if not method.startswith("ours"):
        return contextlib.nullcontext()
    from torchmetrics_retrieval.functional._search import plan

    return plan.force_compiled(True)


def measure(method: str, n: int, regime: Regime, *, seed: int = 0, repeats: int = 2) -> dict[str, Any]:
    """Time ``method`` on the seeded data set (best of ``repeats``) and its peak RSS above the data.

    Returns:
        ``{"method", "n", "regime", "k", "seconds", "peak_mib", "data_mib", "threads", "values"}``; ``peak_mib``
        is the peak RSS above the RSS once the data existed (over all repeats), -1 where it cannot be read.
    """
    return measure_paired(method, n, regime, [torch.get_num_threads()], seed=seed, repeats=repeats)[0]


def measure_paired(
    method: str, n: int, regime: Regime, counts: Sequence[int], *, seed: int = 0, repeats: int = 2
) -> list[dict[str, Any]]:
    """:func:`measure` at every thread count of ``counts`` in one process, the counts taking turns pass after pass
    (``--paired-threads``): a speed-up between two counts then compares passes seconds apart, not processes
    minutes apart on a shared machine. ``peak_mib`` is the peak over all the passes."""
    if method not in RUNNERS:
        raise ValueError(f"`method` must be one of {METHODS}, got {method!r}.")
    _import_for(method)
    x, labels = clustered_embeddings(n, regime, seed=seed)
    # a small call first loads what a fresh process loads once (compiled kernels from their disk cache, taken on
    # this small set only when forced): a single timed pass (``repeats=1``, for the largest N) then measures the
    # call, not the start-up
    with _compiled_forced(method):
        RUNNERS[method](x[: min(n, 1000)], labels[: min(n, 1000)])
    can_reset = reset_peak_memory()
    baseline, _ = memory_mib()
    best = dict.fromkeys(counts, float("inf"))
    for _ in range(repeats):
        for threads in counts:
            set_threads(threads)
            seconds, values = best_of(lambda: RUNNERS[method](x, labels), 1)
            best[threads] = min(best[threads], seconds)
    _, peak = memory_mib()
    common = {"method": method, "n": n, "regime": regime, "k": search_k(labels), "values": values}
    common["version"] = _version(method)
    common |= {"peak_mib": peak - baseline if can_reset else -1.0, "data_mib": x.numel() * x.element_size() / MIB}
    return [{**common, "seconds": best[threads], "threads": threads} for threads in counts]


def profile_ours(n: int, regime: Regime, *, seed: int = 0, top: int = 25) -> str:
    """cProfile of one warm call of ``retrieval_metrics``: the functions with the largest cumulative time."""
    x, labels = clustered_embeddings(n, regime, seed=seed)
    run_ours(x, labels)  # warm-up
    profiler = cProfile.Profile()
    profiler.runcall(run_ours, x, labels)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"torchmetrics_retrieval|torch/functional|sparse", top)
    return out.getvalue()


# ----------------------------------------------------------------------------------------------------------------------
# orchestration
# ----------------------------------------------------------------------------------------------------------------------


def _run_worker(
    python: str, method: str, n: int, regime: str, threads: Sequence[int], args: argparse.Namespace
) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (at every count of ``threads`` in turn with ``--paired-threads``,
    the results under ``"paired"``); a failure becomes ``{"status": ...}``."""
    command = [python, str(Path(__file__).resolve()), "--worker", method, "--sizes", str(n), "--regimes", regime]
    command += ["--seed", str(args.seed), "--repeats", str(args.repeats), "--threads", *map(str, threads)]
    command += ["--paired-threads"] if args.paired_threads else []
    timeout = args.timeout
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"method": method, "status": f"timeout > {timeout:.0f} s"}
    if done.returncode == -signal.SIGKILL:
        return {"method": method, "status": "OOM/killed"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"method": method, "status": f"failed (exit {done.returncode}): {last[:80]}"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"status": "ok", "paired": result} if isinstance(result, list) else {"status": "ok", **result}


def _skip_reason(method: str, n: int, args: argparse.Namespace) -> str | None:
    if method == "oml" and args.oml_python is None:
        return "not installed (give --oml-python)"
    if method == "oml" and n > args.skip_oml_above:
        return f"skipped (N > --skip-oml-above {args.skip_oml_above})"
    if method in ("ours_map_full", "ours_fnmr") and n > args.map_full_max:
        return f"skipped (N > --map-full-max {args.map_full_max})"
    return None


def run_all(args: argparse.Namespace) -> None:
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    counts = args.threads or [1, os.cpu_count() or 1]
    info = run_info(counts)
    print(f"{info['date']}, {os.cpu_count()} CPUs, threads {counts}, load average {load}", flush=True)
    records: list[dict[str, Any]] = []
    for n in args.sizes:
        for regime in args.regimes:
            tables = _measure_every_method(n, regime, counts, args)
            for threads, rows in tables.items():
                for method, row in rows.items():
                    records.append({"n": n, "regime": regime, **row, "method": method, "threads": threads})
            if args.json is not None:  # rewritten after each (N, regime): a stopped run keeps what it measured
                write(args.json, info, records)


def _method_row(method: str, n: int, regime: str, counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """One worker's measurement of ``method`` (at every count of ``counts`` in turn when paired), or why not."""
    reason = _skip_reason(method, n, args)
    if reason is not None:
        return {"method": method, "status": reason}
    python = args.oml_python if method == "oml" else sys.executable
    row = _run_worker(python, method, n, regime, counts, args)
    done = [r["seconds"] for r in row["paired"]] if "paired" in row else row.get("seconds", row["status"])
    print(f"  ... {n} {regime} {counts} threads {method}: {done}", flush=True)
    return row


def _measure_every_method(
    n: int, regime: str, counts: list[int], args: argparse.Namespace
) -> dict[int, dict[str, dict[str, Any]]]:
    """Every method at every thread count once, in turn; the tables printed and returned."""
    tables: dict[int, dict[str, dict[str, Any]]] = {threads: {} for threads in dict.fromkeys(counts)}
    for method in args.methods if args.paired_threads else []:
        row = _method_row(method, n, regime, list(tables), args)
        by_threads = {result["threads"]: {**result, "status": "ok"} for result in row.get("paired", [])}
        for threads, rows in tables.items():
            rows[method] = by_threads.get(threads, row)
    for threads, rows in tables.items():
        for method in [] if args.paired_threads else args.methods:
            rows[method] = _method_row(method, n, regime, [threads], args)
        print(f"\n{threads} thread(s): " + format_table(n, regime, rows) + "\n", flush=True)
    if len(tables) > 1:
        print(format_scaling(tables) + "\n", flush=True)
    return tables


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="passes per method; the best one is reported")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=None, help="CPU thread counts of torch and faiss (default: 1 and all)"
    )
    parser.add_argument(
        "--paired-threads",
        action="store_true",
        help="measure every thread count in one process per method, the counts taking turns pass after pass",
    )
    parser.add_argument("--oml-python", default=None, help="interpreter with open-metric-learning installed")
    parser.add_argument("--skip-oml-above", type=int, default=30_000)
    parser.add_argument("--map-full-max", type=int, default=100_000, help="largest N of the map_full and FNMR@FMR rows")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to one worker")
    parser.add_argument("--json", type=Path, default=None, help="write every row, the machine and the run here")
    parser.add_argument("--worker", choices=METHODS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile our call instead of the benchmark")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None and (args.worker is not None or args.profile):
        set_threads(args.threads[0])
    if args.worker is not None and args.paired_threads:
        shape = (args.worker, args.sizes[0], args.regimes[0], args.threads or [1, os.cpu_count() or 1])
        print(json.dumps(measure_paired(*shape, seed=args.seed, repeats=args.repeats)))
    elif args.worker is not None:
        print(json.dumps(measure(args.worker, args.sizes[0], args.regimes[0], seed=args.seed, repeats=args.repeats)))
    elif args.profile:
        for n in args.sizes:
            for regime in args.regimes:
                print(f"== N = {n}, {regime}\n{profile_ours(n, regime, seed=args.seed)}")
    else:
        run_all(args)


if __name__ == "__main__":
    main()
