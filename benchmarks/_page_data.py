"""What the benchmarks page reads from the results files, and how it writes numbers: plain functions of the
records ``_results.py`` writes, shared by the sections (``_page_sections.py``) and the plots.
"""

from __future__ import annotations

import statistics
from typing import Any

PLOTS = "benchmark-plots"
MARKERS = ("<!-- benchmarks-headline:start -->", "<!-- benchmarks-headline:end -->")
FILES = ("retrieval", "full_ranking", "memory", "verification", "cross_modal", "ddp", "ddp_memory")
NAMES = {"faiss": "bare faiss", "ours": "ours", "pml": "PML", "oml": "OML", "matmul": "matmul"}
NAMES |= {"ours_map_full": "ours + `map_full`", "ours_mrr": "ours + `mrr`", "ours_fnmr": "`fnmr_at_fmr`"}
REGIMES = {"per_class20": "20 per class", "classes100": "100 classes"}
DDP = {"knn": "kNN metrics", "full_ranking": "+ mrr, map_full, minp", "pairs": "+ fnmr@fmr, eer, min_dcf"}
DDP |= {"roc_auc": "+ roc_auc", "contrastive": "ContrastiveAccuracy", "cross_modal": "CrossModalRetrieval"}


# ----------------------------------------------------------------------------------------------------------------------
# formatting
# ----------------------------------------------------------------------------------------------------------------------


def sec(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f} s" if value >= 100 else f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def ratio(a: float | None, b: float | None, suffix: str = "") -> str:
    return f"{a / b:.2f}{suffix}" if a and b else ""


def mib(value: float | None) -> str:
    """MiB, "n/a" where the probe could not read it (-1 or NaN in the records); a peak a few pages below the
    baseline it was measured from is shown as 0."""
    if value is None or value == -1 or value != value:
        return "n/a"
    return f"{max(value, 0.0):.0f} MiB"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def source(doc: dict[str, Any], name: str) -> str:
    run = doc["run"]
    return f"Results: `results/{name}.json` ({run['mode']} run, {run['date']}): `{run['command']}`."


def image(name: str, alt: str) -> str:
    return f"![{alt}]({PLOTS}/{name}.png)"


# ----------------------------------------------------------------------------------------------------------------------
# the records
# ----------------------------------------------------------------------------------------------------------------------


def ok_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["records"] if r.get("status") == "ok"]


def row_of(doc: dict[str, Any], method: str, n: int, threads: int, regime: str = "per_class20") -> dict[str, Any]:
    for r in ok_rows(doc):
        if (r["method"], r["n"], r["threads"], r["regime"]) == (method, n, threads, regime):
            return r
    return {}


def counts(doc: dict[str, Any]) -> tuple[int, int]:
    threads = doc["run"]["threads"]
    return min(threads), max(threads)


def sizes(doc: dict[str, Any]) -> list[int]:
    return sorted({r["n"] for r in doc["records"]})


def max_diff(ours: dict[str, float], theirs: dict[str, float]) -> float | None:
    common = set(ours) & set(theirs)
    return max(abs(ours[k] - theirs[k]) for k in common) if common else None


def thread_speedups(doc: dict[str, Any], methods: list[str]) -> dict[str, dict[int, float]]:
    one, all_ = counts(doc)
    out: dict[str, dict[int, float]] = {}
    for method in methods:
        for n in sizes(doc):
            a, b = row_of(doc, method, n, one), row_of(doc, method, n, all_)
            if a and b:
                out.setdefault(method, {})[n] = a["seconds"] / b["seconds"]
    return out


def ddp_medians(records: list[dict[str, Any]], mode: str = "shard") -> dict[str, dict[int, dict[str, Any]]]:
    """``{family: {P: record}}`` of the runs of ``mode`` (one process is ``P = 1``), each record's times and ratios
    the medians over the rounds of that (family, P), ``identical`` whether every round's values were, ``rounds``
    how many there were."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in records:
        if r["mode"] == mode or r["ranks"] == 1:
            runs.setdefault(r["family"], {}).setdefault(r["ranks"], []).append(r)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for family, by_p in runs.items():
        for p, rounds in by_p.items():
            median = {key: statistics.median(r[key] for r in rounds) for key in ("seconds", "speedup", "work")}
            same = all(r["identical"] for r in rounds)
            out.setdefault(family, {})[p] = {**rounds[0], **median, "identical": same, "rounds": len(rounds)}
    return out


def ddp_speedups(doc: dict[str, Any]) -> dict[str, dict[int, float]]:
    return {
        DDP[family]: {p: r["speedup"] for p, r in by_p.items() if p > 1}
        for family, by_p in ddp_medians(doc["records"]).items()
    }


def memory_points(docs: dict[str, dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Peak RSS above the embeddings per (method, N), the largest over the thread counts of the run."""
    peaks: dict[tuple[str, int], float] = {}
    for name in ("retrieval", "memory"):
        for r in ok_rows(docs[name]):
            if r["peak_mib"] >= 0:
                key = (r["method"], r["n"])
                peaks[key] = max(peaks.get(key, 0.0), r["peak_mib"])
    points: dict[str, list[tuple[int, float]]] = {}
    for (method, n), peak in sorted(peaks.items()):
        points.setdefault(method, []).append((n, peak))
    return points
