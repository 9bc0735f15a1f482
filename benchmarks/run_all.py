"""Run every benchmark the page needs and write its results files under ``benchmarks/results/``.

    python benchmarks/run_all.py                 # the full sweep: about 40 minutes on 2 cores
    python benchmarks/run_all.py --quick         # tiny sizes, a few minutes: checks the plumbing only
    python benchmarks/run_all.py --only verification cross_modal
    python benchmarks/make_page.py               # then regenerate benchmarks/README.md and its plots

Each step is one run of one script with ``--json``; the file records the machine, the exact command, the date,
the sweep mode (``full`` or ``quick``, shown on the page) and the versions. Open-metric-learning pins its own
torchvision, so it is usually not installed beside this package: give ``--oml-python`` an interpreter that can
import ``oml`` (and this package's dependencies), or its rows read "not installed".
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CORES = str(os.cpu_count() or 1)

#: step -> (script, arguments of the full sweep, arguments of the quick one); every step writes results/<step>.json.
STEPS: dict[str, tuple[str, list[str], list[str]]] = {
    # time and memory against faiss, PML and OML, one thread and all cores measured in turn in one worker per method
    "retrieval": (
        "bench_retrieval.py",
        "--sizes 10000 30000 100000 --regimes per_class20 --methods faiss ours pml oml --paired-threads"
        " --repeats 1 --skip-oml-above 30000".split(),
        "--sizes 2000 5000 --regimes per_class20 --methods faiss ours pml oml --paired-threads --repeats 1".split(),
    ),
    # the full-ranking and all-pairs metrics, with few and with many relevant items per query
    "full_ranking": (
        "bench_retrieval.py",
        "--sizes 30000 --regimes per_class20 classes100 --methods faiss ours ours_map_full ours_mrr ours_fnmr"
        " --paired-threads --repeats 1".split(),
        "--sizes 3000 --regimes per_class20 classes100 --methods faiss ours ours_map_full ours_mrr ours_fnmr"
        " --paired-threads --repeats 1".split(),
    ),
    # peak memory beyond 100k: all cores only, the page shows its memory, not its time
    "memory": (
        "bench_retrieval.py",
        f"--sizes 200000 --regimes per_class20 --methods faiss ours --threads {CORES} --repeats 1".split(),
        f"--sizes 10000 --regimes per_class20 --methods faiss ours --threads {CORES} --repeats 1".split(),
    ),
    "verification": ("bench_reid_verification.py", "--n 20000".split(), "--n 3000".split()),
    "cross_modal": (
        "bench_intervals_cross_modal.py",
        "--n 30000 --images 10000".split(),
        "--n 3000 --images 1000".split(),
    ),
    "ddp": (
        "bench_ddp.py",
        "--n 20000 --ranks 2 3 4 --rounds 3 --no-memory".split(),
        "--n 2000 --ranks 2 --rounds 1 --no-memory".split(),
    ),
    "ddp_memory": (
        "bench_ddp.py",
        "--n 60000 --ranks 2 --rounds 1".split(),
        "--n 3000 --ranks 2 --rounds 1 --families knn".split(),
    ),
}


def _oml_python(given: str | None) -> str | None:
    """The interpreter of the OML rows: the one given, else this one when it can import ``oml``."""
    if given is not None:
        return given
    return sys.executable if importlib.util.find_spec("oml") is not None else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check the plumbing, not the speed")
    parser.add_argument("--only", nargs="+", choices=list(STEPS), default=list(STEPS), help="run these steps only")
    parser.add_argument("--oml-python", default=None, help="interpreter with open-metric-learning installed")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the results files")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    oml = _oml_python(args.oml_python)
    # the scripts import their siblings (_common, _results) by name, and the benchmarked package from the checkout
    paths = [str(HERE.parent), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "BENCH_MODE": mode, "PYTHONPATH": os.pathsep.join(paths)}
    start = time.perf_counter()
    for step in args.only:
        script, full, quick = STEPS[step]
        command = [sys.executable, f"benchmarks/{script}", *(quick if args.quick else full)]
        if "oml" in command and oml is not None:
            command += ["--oml-python", oml]
        command += ["--json", os.path.relpath(args.results / f"{step}.json", HERE.parent)]
        print(f"== {step}: {' '.join(command[1:])}", flush=True)
        began = time.perf_counter()
        subprocess.run(command, check=True, env=env, cwd=HERE.parent)
        print(f"== {step} done in {time.perf_counter() - began:.0f} s", flush=True)
    print(f"sweep ({mode}) done in {time.perf_counter() - start:.0f} s; now: python benchmarks/make_page.py")


if __name__ == "__main__":
    main()
