"""The PNG plots of the benchmarks page, drawn from the same records as its tables (``make_page.py``).

Each function takes the records it needs and a target path and returns nothing: the page refers to the files by
name. The Agg backend and fixed sizes keep the output the same for the same data and matplotlib version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["ddp_speedup", "memory_vs_n", "thread_speedup", "time_vs_n"]

LABELS = {"faiss": "bare faiss kNN", "ours": "torchmetrics-retrieval", "pml": "pytorch-metric-learning", "oml": "OML"}
STYLE = {"faiss": "s--", "ours": "o-", "pml": "^-", "oml": "v-"}
#: One colour per method on every plot.
COLOR = {"faiss": "tab:blue", "ours": "tab:orange", "pml": "tab:green", "oml": "tab:red"}
#: No date or software stamp in the PNG, so a re-run on the same data writes the same bytes.
METADATA = {"Software": None}


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata=METADATA)
    plt.close(fig)


def time_vs_n(rows: list[dict[str, Any]], counts: list[int], path: Path) -> None:
    """Seconds against N, log-log, one panel per thread count, one line per method."""
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 3.8), sharey=True, squeeze=False)
    for ax, threads in zip(axes[0], counts, strict=True):
        for method in LABELS:
            points = sorted((r["n"], r["seconds"]) for r in rows if r["method"] == method and r["threads"] == threads)
            if points:
                ax.plot(*zip(*points, strict=True), STYLE[method], color=COLOR[method], label=LABELS[method])
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="N (queries = gallery)",
            title=f"{threads} thread" + ("s" if threads > 1 else ""),
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("seconds")
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def thread_speedup(speedups: dict[str, dict[int, float]], counts: tuple[int, int], path: Path) -> None:
    """Grouped bars: the speed-up from one thread to all cores of each method, one group per N."""
    sizes = sorted({n for by_n in speedups.values() for n in by_n})
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / max(1, len(speedups))
    for i, (method, by_n) in enumerate(speedups.items()):
        xs = [j + i * width for j, n in enumerate(sizes) if n in by_n]
        ax.bar(xs, [by_n[n] for n in sizes if n in by_n], width, color=COLOR[method], label=LABELS[method])
    ax.axhline(counts[1] / counts[0], color="grey", linestyle=":", label=f"ideal ({counts[1]}x)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(speedups) - 1) / 2 for j in range(len(sizes))], [f"N = {n:,}" for n in sizes])
    ax.set(ylabel=f"speed-up, {counts[0]} -> {counts[1]} threads")
    ax.legend(fontsize=8)
    _save(fig, path)


def ddp_speedup(speedups: dict[str, dict[int, float]], path: Path) -> None:
    """Grouped bars: the speed-up of every metric family on P processes against one process."""
    ranks = sorted({p for by_p in speedups.values() for p in by_p})
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / max(1, len(ranks))
    for i, p in enumerate(ranks):
        xs = [j + i * width for j, by_p in enumerate(speedups.values()) if p in by_p]
        ax.bar(xs, [by_p[p] for by_p in speedups.values() if p in by_p], width, label=f"{p} processes")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ticks = [j + width * (len(ranks) - 1) / 2 for j in range(len(speedups))]
    ax.set_xticks(ticks, list(speedups), fontsize=8, rotation=20, ha="right")
    ax.set(ylabel="speed-up against 1 process")
    ax.legend(fontsize=8)
    _save(fig, path)


def memory_vs_n(points: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Peak RSS above the embeddings against N, log-log, one line per method, with the embeddings' own size."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for method in [m for m in LABELS if m in points]:  # the legend in the same order as the other plots
        line = zip(*sorted(points[method]), strict=True)
        ax.plot(*line, STYLE[method], color=COLOR[method], label=LABELS[method])
    sizes = sorted({n for values in points.values() for n, _ in values})
    ax.plot(sizes, [n * 128 * 4 / 2**20 for n in sizes], "k:", label="the embeddings (D = 128, float32)")
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="peak MiB above the embeddings")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
