"""The metrics on stdout: as JSON (``--json``) or as a table under a title, for every command of the tool."""

from __future__ import annotations

import json

from torch import Tensor

__all__ = ["print_metrics", "print_table"]


def print_table(title: str, metrics: dict[str, Tensor], seconds: float) -> None:
    """The title, one line per metric (4 decimals) and how long the evaluation took."""
    width = max(len("metric"), *(len(key) for key in metrics))
    print(title)
    print(f"{'metric'.ljust(width)}  value")
    print(f"{'-' * width}  ------")
    for key, value in metrics.items():
        print(f"{key.ljust(width)}  {float(value):.4f}")
    print(f"({len(metrics)} metrics in {seconds:.2f} s)")


def print_metrics(as_json: bool, title: str, metrics: dict[str, Tensor], seconds: float) -> None:
    """The metrics as a JSON object of floats (``as_json``) or as :func:`print_table`'s table."""
    if as_json:
        print(json.dumps({key: float(value) for key, value in metrics.items()}, indent=2))
    else:
        print_table(title, metrics, seconds)
