"""The tables ``bench_retrieval.py`` prints: one per (N, regime, thread count), and the speed-up from the fewest
threads to the most. Plain functions of the workers' results (dicts with ``status``, ``seconds``, ``peak_mib``,
``data_mib``, ``values``), kept apart from the measuring code.
"""

from __future__ import annotations

from typing import Any

__all__ = ["format_scaling", "format_table"]


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
