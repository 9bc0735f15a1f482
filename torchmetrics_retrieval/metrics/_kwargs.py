"""``MetricKwargs``: the keyword arguments of ``torchmetrics.Metric.__init__``, typed.

The metric classes type their ``**kwargs`` with it: mypy then refuses a misspelt option, which torchmetrics would
otherwise take for one of its own keywords (and refuse only at run time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from torchmetrics_retrieval.functional._options import Unpack

__all__ = ["MetricKwargs", "Unpack"]


class MetricKwargs(TypedDict, total=False):
    """The keywords ``torchmetrics.Metric.__init__`` takes (see its documentation)."""

    compute_on_cpu: bool
    dist_sync_on_step: bool
    process_group: Any
    dist_sync_fn: Callable[..., Any] | None
    distributed_available_fn: Callable[[], bool] | None
    sync_on_compute: bool
    compute_with_cache: bool
