"""Flat keys of this package -> the nested layout of OML's ``EmbeddingMetrics`` (``to_oml_nested``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchmetrics_retrieval.compat.oml._inputs import OVERALL_CATEGORIES_KEY

__all__ = ["to_oml_nested"]


def _parse_number(text: str) -> int | float | None:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    return None


def to_oml_nested(flat_metrics: Mapping[str, Any], *, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Flat keys of this package (``"cmc/1"``, ``"cat/precision/5"``) -> OML's ``EmbeddingMetrics`` layout.

    ``{"OVERALL": {"cmc": {1: value}, "pcf": {0.5: value}, ...}, "cat": {"cmc": {1: value}, ...}}``:
    a key ``[category/]name/number`` goes to ``[category or "OVERALL"][name][number]`` (the number as
    an int when it is one, else a float), a key ``[category/]name`` without a number to
    ``[category or "OVERALL"][name]``. The values are kept as they are. ``"OVERALL"`` always comes first.

    Args:
        flat_metrics: flat ``{key: value}``, e.g. the result of ``retrieval_metrics`` or
            ``EmbeddingMetrics.compute()``.
        prefix: a prefix every key starts with (the metric's ``prefix``), removed first.

    Returns:
        The nested dictionary.

    Raises:
        ValueError: a key without ``prefix``, a per-class key (``.../class/...``: OML has no per-class
            results), or two keys landing on the same place (e.g. ``"map"`` and ``"map/5"``).

    Example:
        >>> import torch
        >>> flat = {"cmc/1": torch.tensor(0.5), "pcf/0.5": torch.tensor(0.25), "shoes/cmc/1": torch.tensor(1.0)}
        >>> to_oml_nested(flat)
        {'OVERALL': {'cmc': {1: tensor(0.5000)}, 'pcf': {0.5: tensor(0.2500)}}, 'shoes': {'cmc': {1: tensor(1.)}}}
    """
    nested: dict[str, dict[str, Any]] = {OVERALL_CATEGORIES_KEY: {}}
    for key, value in flat_metrics.items():
        if not key.startswith(prefix):
            raise ValueError(f"`flat_metrics` keys must start with prefix {prefix!r}, got {key!r}.")
        parts = key[len(prefix) :].split("/")
        if len(parts) >= 3 and parts[-2] == "class":
            raise ValueError(f"`flat_metrics` has a per-class key {key!r}, which OML's layout has no place for.")
        number = _parse_number(parts[-1]) if len(parts) >= 2 else None
        name_at = -2 if number is not None else -1
        category = "/".join(parts[:name_at]) or OVERALL_CATEGORIES_KEY
        metrics = nested.setdefault(category, {})
        name = parts[name_at]
        if number is None:
            if name in metrics:
                raise ValueError(f"`flat_metrics` key {key!r} collides with another key of metric {name!r}.")
            metrics[name] = value
            continue
        slot = metrics.setdefault(name, {})
        if not isinstance(slot, dict):
            raise ValueError(f"`flat_metrics` key {key!r} collides with the scalar metric {name!r}.")
        slot[number] = value
    return nested
