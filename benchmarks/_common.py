"""Shared pieces of the benchmarks: seeded synthetic embeddings, timing and peak-memory probes.

Only torch and the standard library are imported here, so a benchmark worker can run in another
interpreter (for example a scratch venv holding open-metric-learning) and still build the very same data.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

import torch
from torch import Tensor

__all__ = [
    "REGIMES",
    "Regime",
    "best_of",
    "clustered_embeddings",
    "memory_mib",
    "n_classes",
    "reset_peak_memory",
]

T = TypeVar("T")

Regime = Literal["per_class20", "classes100"]
#: ``per_class20``: N / 20 classes of 20 samples; ``classes100``: 100 classes of N / 100 samples.
REGIMES: tuple[str, ...] = ("per_class20", "classes100")

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def n_classes(n: int, regime: Regime) -> int:
    """Number of classes of a data set of ``n`` samples in ``regime``."""
    if regime == "per_class20":
        return max(1, n // 20)
    if regime == "classes100":
        return 100
    raise ValueError(f"`regime` must be one of {REGIMES}, got {regime!r}.")


def clustered_embeddings(
    n: int, regime: Regime, *, dim: int = 128, noise: float = 0.14, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Seeded clustered embeddings: one Gaussian blob per class, rows scaled to unit L2 norm.

    Class sizes are balanced (they differ by at most one); the samples are in a random order. The
    class centres are ``N(0, I / dim)`` (norm about 1) and each sample adds ``N(0, noise^2 I)``, so
    with the default ``noise`` the neighbourhoods mix classes a little (precision@5 well below 1).

    Returns:
        ``(embeddings (n, dim) float32, labels (n,) int64)``, identical for a given seed on any machine
        with the same torch version.
    """
    generator = torch.Generator().manual_seed(seed)
    classes = n_classes(n, regime)
    labels = torch.arange(n) % classes
    labels = labels[torch.randperm(n, generator=generator)]
    centres = torch.randn(classes, dim, generator=generator) / dim**0.5
    x = centres[labels]
    x += noise * torch.randn(n, dim, generator=generator)
    return torch.nn.functional.normalize(x, dim=1), labels


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), flags=re.MULTILINE)
    if match is None:  # pragma: no cover - Linux always reports these fields
        raise RuntimeError(f"{field} is missing from {_STATUS}")
    return int(match.group(1))


def _release_freed_memory() -> None:
    # glibc keeps freed blocks for reuse: without handing them back, a call measured after another one in the
    # same process would allocate inside the RSS already counted, and its peak above that RSS would read low.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back
        pass


def reset_peak_memory() -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS, after handing freed heap memory back to the
    system; False where the kernel does not allow the reset."""
    _release_freed_memory()
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def memory_mib() -> tuple[float, float]:
    """``(current RSS, peak RSS since start or the last reset)`` of this process, in MiB."""
    return _status_kib("VmRSS") / 1024, _status_kib("VmHWM") / 1024


def best_of(fn: Callable[[], T], repeats: int = 2) -> tuple[float, T]:
    """Run ``fn`` ``repeats`` times; the shortest wall-clock time in seconds and the last result."""
    best = float("inf")
    result: T
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result
