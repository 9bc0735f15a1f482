"""The results files of the benchmarks: one JSON document per script run, with what a reader needs to judge it.

Every file holds ``{"machine": {...}, "run": {...}, "records": [...]}``: the machine (CPU model, cores, load), the
run (the exact command, the UTC date, the threads used, the sweep mode, the package and library versions, the git
commit) and the script's own records. ``make_page.py`` reads nothing else, so every figure on the page can be
traced to one of these files. Only the standard library is imported: the page generator must not need torch.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "load", "machine", "run_info", "version", "write"]

RESULTS = Path(__file__).resolve().parent / "results"
#: Distributions whose versions decide the figures; a missing one is recorded as null.
DISTRIBUTIONS = (
    "torchmetrics-retrieval",
    "torch",
    "faiss-cpu",
    "numba",
    "numpy",
    "torchmetrics",
    "pytorch-metric-learning",
    "open-metric-learning",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The CPU model, the number of cores and the load average when the run started."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "os": platform.platform(terse=True),
    }


def version(name: str) -> str | None:
    """The installed version of distribution ``name``; None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The git commit of the benchmarked tree, with ``+dirty`` when its code has uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        # the results and plots a sweep writes as it goes are not changes of the benchmarked code
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results", ":!*.png"],
            cwd=root,
            capture_output=True,
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_info(threads: list[int], mode: str | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """The command (relative to the repository), date, thread counts, sweep mode and versions of this run."""
    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parents[1]
    shown = script.relative_to(root) if script.is_relative_to(root) else script
    return {
        "command": shlex.join(["python", str(shown), *(sys.argv[1:] if argv is None else argv)]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": threads,
        "mode": mode or os.environ.get("BENCH_MODE", "manual"),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in DISTRIBUTIONS},
        "commit": _commit(),
    }


def write(path: Path, info: dict[str, Any], records: list[dict[str, Any]], **extra: Any) -> None:
    """Write one results file (indented, keys in the order given, so diffs between runs stay readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"machine": machine(), "run": info, **extra, "records": records}
    path.write_text(json.dumps(document, indent=1) + "\n")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
