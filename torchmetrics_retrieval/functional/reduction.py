"""From per-query values to scalars: empty-target handling, mean, average of per-label averages, per label.

Queries whose gallery holds no relevant item (n(q) = 0, "lone" queries) follow
``empty_target_action`` (torchmetrics' name for it):

* ``"skip"`` (default): left out of every average (pytorch-metric-learning's behaviour);
* ``"neg"``: counted with value 0;
* ``"pos"``: counted with value 1;
* ``"error"``: a ``ValueError``.

Every reduction is vectorised over queries and labels (``torch.unique`` + ``index_add``). Each public
function checks its arguments (shapes and dtypes) and calls its private ``_<name>_compute`` twin, which
internal callers holding checked data call directly.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_choice,
    check_counts,
    check_labels,
    check_mask,
    check_str,
    describe,
)

__all__ = [
    "EMPTY_TARGET_ACTIONS",
    "EmptyTargetAction",
    "apply_empty_target_action",
    "grouped_mean",
    "label_names",
    "masked_mean",
]


EmptyTargetAction = Literal["skip", "neg", "pos", "error"]
EMPTY_TARGET_ACTIONS: tuple[str, ...] = ("skip", "neg", "pos", "error")


def _check_values(values: object) -> Tensor:
    """Per-query values: a ``(Q,)`` or ``(Q, T)`` tensor."""
    if not isinstance(values, Tensor):
        raise TypeError(f"`values` must be a torch.Tensor of shape (Q,) or (Q, T), got {describe(values)}.")
    if values.ndim not in (1, 2):
        raise ValueError(f"`values` must be 1-D or 2-D of shape (Q,) or (Q, T), got {describe(values)}.")
    return values


def apply_empty_target_action(
    values: Tensor, n_relevant: Tensor, empty_target_action: EmptyTargetAction = "skip"
) -> tuple[Tensor, Tensor]:
    """Apply the lone-query rule to per-query values.

    Args:
        values: ``(Q,)`` or ``(Q, T)`` per-query values.
        n_relevant: ``(Q,)`` number of relevant items of each query.
        empty_target_action: ``"skip"``, ``"neg"``, ``"pos"`` or ``"error"``.

    Returns:
        ``(values, counted)``: the values with lone queries set to 0/1 where the action says so, and
        the ``(Q,)`` bool mask of the queries that count in averages.

    Example:
        >>> values, counted = apply_empty_target_action(torch.tensor([0.5, 0.0]), torch.tensor([2, 0]), "pos")
        >>> values.tolist(), counted.tolist()
        ([0.5, 1.0], [True, True])
    """
    n_query = _check_values(values).shape[0]
    check_counts("n_relevant", n_relevant, n_query, "values")
    check_choice("empty_target_action", empty_target_action, EMPTY_TARGET_ACTIONS)
    return _apply_empty_target_action_compute(values, n_relevant, empty_target_action)


def _apply_empty_target_action_compute(
    values: Tensor, n_relevant: Tensor, empty_target_action: EmptyTargetAction
) -> tuple[Tensor, Tensor]:
    """:func:`apply_empty_target_action` of checked arguments (``"error"`` still raises on a lone query)."""
    lone = n_relevant == 0
    if empty_target_action == "skip":
        return values, ~lone
    if empty_target_action == "error" and bool(lone.any()):
        raise ValueError(
            f"`empty_target_action` is 'error' and {int(lone.sum())} of {lone.numel()} queries have no relevant "
            "item in their gallery."
        )
    if empty_target_action in ("neg", "pos"):
        fill = 0.0 if empty_target_action == "neg" else 1.0
        mask = lone if values.ndim == 1 else lone[:, None]
        values = torch.where(mask, torch.full_like(values, fill), values)
    return values, torch.ones_like(lone)


def masked_mean(values: Tensor, counted: Tensor, *, name: str = "metric", warn: bool = True) -> Tensor:
    """Mean over the counted queries (along dim 0); NaN with a warning when no query counts.

    Args:
        values: ``(Q,)`` or ``(Q, T)`` per-query values.
        counted: ``(Q,)`` bool mask of the queries that count.
        name: the metric named by the warning.
        warn: whether to warn when no query counts.

    Returns:
        A 0-dim tensor, or ``(T,)``.

    Example:
        >>> masked_mean(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([True, False, True]))
        tensor(0.7500)
    """
    check_mask("counted", counted, _check_values(values).shape[0], "values")
    check_str("name", name)
    check_bool("warn", warn)
    return _masked_mean_compute(values, counted, name=name, warn=warn, stacklevel=4)


def _masked_mean_compute(
    values: Tensor, counted: Tensor, *, name: str = "metric", warn: bool = True, stacklevel: int = 3
) -> Tensor:
    """:func:`masked_mean` of checked arguments; ``stacklevel`` of the warning counts from this function."""
    n_counted = int(counted.sum())
    if n_counted == 0:
        if warn:
            warnings.warn(
                f"Every query was skipped for `{name}` (no query has a relevant item in its gallery); "
                "the value is NaN. Use `empty_target_action='neg'` or 'pos' to count such queries.",
                UserWarning,
                stacklevel=stacklevel,
            )
        return torch.full(values.shape[1:], float("nan"), dtype=values.dtype, device=values.device)
    return values[counted].sum(dim=0) / n_counted


def _group_ids(groups: Tensor) -> tuple[Tensor, Tensor]:
    """(distinct groups, id of each row's group); 2-D groups are grouped by whole rows."""
    return torch.unique(groups, dim=0 if groups.ndim == 2 else None, return_inverse=True)


def grouped_mean(values: Tensor, counted: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Mean of the counted values of each group (a label or a category).

    Args:
        values: ``(Q,)`` or ``(Q, T)``.
        counted: ``(Q,)`` bool mask of the queries that count.
        groups: ``(Q,)`` or ``(Q, L)`` group of each query (any dtype).

    Returns:
        ``(distinct_groups, means, has_counted)``: the distinct groups in sorted order, the mean of
        each (NaN for a group without counted query) and whether each group has a counted query.

    Example:
        >>> groups, means, ok = grouped_mean(torch.tensor([1.0, 0.0, 0.5]), torch.ones(3, dtype=torch.bool),
        ...                                  torch.tensor([4, 4, 9]))
        >>> groups.tolist(), means.tolist(), ok.tolist()
        ([4, 9], [0.5, 0.5], [True, True])
    """
    n_query = _check_values(values).shape[0]
    check_mask("counted", counted, n_query, "values")
    check_labels("groups", groups, n_query, "values")
    return _grouped_mean_compute(values, counted, groups)


def _grouped_mean_compute(values: Tensor, counted: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`grouped_mean` of checked arguments."""
    distinct, ids = _group_ids(groups)
    n_groups = distinct.shape[0]
    weights = counted.to(values.dtype)
    totals = torch.zeros((n_groups, *values.shape[1:]), dtype=values.dtype, device=values.device)
    totals.index_add_(0, ids, values * (weights if values.ndim == 1 else weights[:, None]))
    sizes = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, weights)
    has_counted = sizes > 0
    denominator = sizes if values.ndim == 1 else sizes[:, None]
    means = torch.where(
        has_counted if values.ndim == 1 else has_counted[:, None],
        totals / denominator.clamp(min=1),
        torch.full_like(totals, float("nan")),
    )
    return distinct, means, has_counted


def label_names(distinct_labels: Tensor) -> list[str]:
    """Names of labels for result keys: a value as Python prints it, a 2-D row joined by ``_``.

    Example:
        >>> label_names(torch.tensor([[1, 3], [2, 0]]))
        ['1_3', '2_0']
    """
    rows = distinct_labels.tolist()
    if distinct_labels.ndim == 1:
        return [str(v) for v in rows]
    return ["_".join(str(v) for v in row) for row in rows]
