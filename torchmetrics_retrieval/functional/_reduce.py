"""Scalars from per-query values: the mean (or average of per-label averages), per class, per category, and
their percentile-bootstrap intervals (:func:`reduce_per_query`, the last stage of ``retrieval_metrics``)."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._bootstrap import bootstrap_interval
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional.reduction import (
    _apply_empty_target_action_compute,
    _grouped_mean_compute,
    _masked_mean_compute,
    label_names,
)

__all__ = ["reduce_per_query"]


def _grouped_keys(keys: list[str], table: Tensor, counted: Tensor, groups: Tensor, pattern: str) -> dict[str, Tensor]:
    """Per-group means (one vectorised pass) named by ``pattern``; groups without a counted query are left out.

    The loop only names the results: ``{key}/class/{label}`` or ``{category}/{key}``.
    """
    distinct, means, has_counted = _grouped_mean_compute(table, counted, groups)
    return {
        pattern.format(key=key, group=group): value
        for group, row, ok in zip(label_names(distinct), means.unbind(), has_counted.tolist(), strict=True)
        if ok
        for key, value in zip(keys, row.unbind(), strict=True)
    }


def reduce_per_query(result: RetrievalResult, options: RetrievalOptions) -> dict[str, Tensor]:
    """Scalars from per-query values: the mean (or average of per-label averages), per class, per category."""
    metrics: dict[str, Tensor] = {}
    if not result.values:
        return metrics
    keys = list(result.values)
    table, counted = _apply_empty_target_action_compute(
        torch.stack([result.values[key] for key in keys], dim=1), result.n_relevant, options.empty_target_action
    )
    if options.avg_of_avgs:
        _, means, has_counted = _grouped_mean_compute(table, counted, result.query_labels)
        overall = _masked_mean_compute(means, has_counted, name=", ".join(keys))
    else:
        overall = _masked_mean_compute(table, counted, name=", ".join(keys))
    metrics.update(zip(keys, overall.unbind(), strict=True))
    if options.confidence_level is not None:
        metrics.update(_intervals(keys, table, counted, result.query_labels, options))
    if options.per_class:
        metrics.update(_grouped_keys(keys, table, counted, result.query_labels, "{key}/class/{group}"))
    if result.query_categories is not None:
        metrics.update(_grouped_keys(keys, table, counted, result.query_categories, "{group}/{key}"))
        if options.confidence_level is not None:
            metrics.update(_category_intervals(keys, table, counted, result, options))
    return metrics


def _intervals(
    keys: list[str], table: Tensor, counted: Tensor, labels: Tensor, options: RetrievalOptions, prefix: str = ""
) -> dict[str, Tensor]:
    """``{key}/ci_low`` and ``{key}/ci_high`` of every key: the percentile bootstrap over the counted queries of
    the mean the key reports (with ``avg_of_avgs``, of the average of per-label means, resampled as one)."""
    rows = torch.nonzero(counted).flatten()
    if rows.numel() == 0:
        nan = torch.full((), float("nan"), dtype=table.dtype, device=table.device)
        return {f"{prefix}{key}/{end}": nan for key in keys for end in ("ci_low", "ci_high")}
    groups = None
    if options.avg_of_avgs:
        chosen = labels[rows]
        _, groups = torch.unique(chosen, dim=0 if chosen.ndim == 2 else None, return_inverse=True)
    assert options.confidence_level is not None
    low, high = bootstrap_interval(
        table[rows],
        confidence_level=options.confidence_level,
        n_bootstrap=options.n_bootstrap,
        seed=options.seed,
        groups=groups,
    )
    ends = {f"{prefix}{key}/ci_low": value for key, value in zip(keys, low.unbind(), strict=True)}
    ends.update({f"{prefix}{key}/ci_high": value for key, value in zip(keys, high.unbind(), strict=True)})
    return ends


def _category_intervals(
    keys: list[str], table: Tensor, counted: Tensor, result: RetrievalResult, options: RetrievalOptions
) -> dict[str, Tensor]:
    """The intervals of the per-category keys, each resampled within its category. A loop over the categories
    (a handful: shop / consumer photos, seen / unseen classes), each one vectorised over its queries."""
    categories = cast(Tensor, result.query_categories)
    distinct = torch.unique(categories)
    ends: dict[str, Tensor] = {}
    for name, value in zip(label_names(distinct), distinct.unbind(), strict=True):
        inside = categories == value
        if bool((counted & inside).any()):
            ends.update(_intervals(keys, table, counted & inside, result.query_labels, options, prefix=f"{name}/"))
    return ends
