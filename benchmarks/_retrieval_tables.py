"""The tables ``bench_retrieval.py`` prints: one (N, regime, thread count), the speed-up from the fewest threads
to the most, and the medians over rounds. Plain functions of the workers' results (dicts with ``status``,
``seconds``, ``peak_mib``, ``data_mib``, ``values``), kept apart from the measuring code.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["format_medians", "format_scaling", "format_table"]


def _value_check(rows: dict[str, dict[str, Any]]) -> str:
    """Largest difference between our values and each anchor's on the keys both computed."""
    ours = rows.get("ours", {}).get("values")
    if not ours:
        return ""
    parts = []
    for method in ("pml", "oml"):
        theirs = rows.get(method, {}).get("values") or {}
        common = sorted(set(ours) & set(theirs))
        if common:
            diff = max(abs(ours[key] - theirs[key]) for key in common)
            parts.append(f"max |ours - {method}| over {', '.join(common)}: {diff:.2e}")
    shown = ", ".join(f"{key} {value:.4f}" for key, value in ours.items())
    return "\n".join([f"our values: {shown}", *parts])


def format_table(n: int, regime: str, rows: dict[str, dict[str, Any]]) -> str:
    """One Markdown table for one (N, regime): seconds, peak MiB above the data, ratios."""
    k = next((row["k"] for row in rows.values() if "k" in row), "?")
    data = next((row["data_mib"] for row in rows.values() if "data_mib" in row), float("nan"))
    faiss_s = rows.get("faiss", {}).get("seconds")
    ours_s = rows.get("ours", {}).get("seconds")
    lines = [
        f"N = {n}, {regime}, K = {k} (faiss K + 1 = {k + 1 if isinstance(k, int) else '?'}), embeddings {data:.0f} MiB",
        "",
        "| method | seconds | peak MiB above data | x bare faiss | ours faster by |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for method, row in rows.items():
        if row.get("status") != "ok":
            lines.append(f"| {method} | {row.get('status')} | | | |")
            continue
        seconds = row["seconds"]
        ratio = f"{seconds / faiss_s:.2f}" if faiss_s else ""
        speedup = f"{seconds / ours_s:.2f}x" if ours_s and method in ("pml", "oml") else ""
        peak = f"{row['peak_mib']:.0f}" if row["peak_mib"] >= 0 else "n/a"
        lines.append(f"| {method} | {seconds:.2f} | {peak} | {ratio} | {speedup} |")
    check = _value_check(rows)
    return "\n".join(lines) + ("\n\n" + check if check else "")


def format_scaling(tables: dict[int, dict[str, dict[str, Any]]]) -> str:
    """How much faster each method ran with the most threads than with the fewest (same data, one run)."""
    fewest, most = min(tables), max(tables)
    lines = [f"| method | {fewest} thread(s) | {most} threads | speed-up |", "| --- | ---: | ---: | ---: |"]
    for method, row in tables[fewest].items():
        other = tables[most].get(method, {})
        if row.get("status") == "ok" and other.get("status") == "ok":
            a, b = row["seconds"], other["seconds"]
            lines.append(f"| {method} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    return "\n".join(lines)


def format_medians(rounds: list[dict[int, dict[str, dict[str, Any]]]]) -> str:
    """Median over the rounds of each method's ratio to faiss (taken within its round) and of its speed-up from
    the fewest threads to the most."""
    lines = ["| method | threads | x bare faiss, median (each round) |", "| --- | ---: | --- |"]
    speedups: dict[str, list[float]] = {}
    for threads in rounds[0]:
        for method in rounds[0][threads]:
            ratios = []
            for tables in rounds:
                row, faiss_row = tables[threads].get(method, {}), tables[threads].get("faiss", {})
                if row.get("status") == "ok" and faiss_row.get("status") == "ok":
                    ratios.append(row["seconds"] / faiss_row["seconds"])
            if ratios:
                shown = ", ".join(f"{r:.2f}" for r in ratios)
                lines.append(f"| {method} | {threads} | {statistics.median(ratios):.2f} ({shown}) |")
    fewest, most = min(rounds[0]), max(rounds[0])
    for tables in rounds if fewest != most else []:
        for method, row in tables[fewest].items():
            other = tables[most].get(method, {})
            if row.get("status") == "ok" and other.get("status") == "ok":
                speedups.setdefault(method, []).append(row["seconds"] / other["seconds"])
    for method, values in speedups.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {method} | {fewest} -> {most} speed-up | {statistics.median(values):.2f}x ({shown}) |")
    # the machine's second core comes and goes on a shared host: faiss's speed-up in the same round says how much
    # of it there was, so a method's speed-up over faiss's compares the code, not the moment
    faiss_speedups = speedups.get("faiss", [])
    for method, values in speedups.items():
        if method != "faiss" and len(values) == len(faiss_speedups):
            relative = [v / f for v, f in zip(values, faiss_speedups, strict=True)]
            shown = ", ".join(f"{r:.2f}" for r in relative)
            lines.append(f"| {method} | speed-up / faiss's | {statistics.median(relative):.2f} ({shown}) |")
    return "\n".join(lines)
