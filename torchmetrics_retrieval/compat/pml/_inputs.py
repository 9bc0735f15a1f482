"""Inputs of ``AccuracyCalculator.get_accuracy``: torch or numpy in, checked tensors on the device out.

Also the 1.x call forms: the argument order ``(query, reference, query_labels, reference_labels)`` recognised
by shape, and queries that are any rows of the reference set, located by embedding and label.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings, describe

__all__ = [
    "as_device",
    "as_embeddings",
    "as_labels",
    "as_numpy",
    "check_inputs",
    "locate_rows",
    "row_codes",
    "v1_order",
]


def as_device(device: torch.device | str | None) -> torch.device:
    """``device`` as a ``torch.device``; None: CUDA if available, else CPU.

    Example:
        >>> as_device("gpu7")
        Traceback (most recent call last):
            ...
        ValueError: `device` must be a torch.device or a device string such as 'cpu' or 'cuda:0', got 'gpu7'.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"`device` must be a torch.device or a device string such as 'cpu' or 'cuda:0', got {device!r}."
        ) from error


def _as_tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, Tensor):
        return value
    raise TypeError(f"`{name}` must be a torch.Tensor or a numpy array, got {describe(value)}.")


def as_embeddings(name: str, value: Any, device: torch.device) -> Tensor:
    """Embeddings as float32 on ``device`` (pytorch-metric-learning computes in float32 too)."""
    tensor = _as_tensor(name, value)
    if tensor.ndim == 2 and tensor.dtype != torch.float32:
        tensor = tensor.float()
    return check_embeddings(name, tensor.to(device))


def as_labels(name: str, value: Any, n_rows: int, rows_name: str, device: torch.device) -> Tensor:
    """Labels on ``device`` in their own dtype, one per embedding."""
    tensor = _as_tensor(name, value)
    if tensor.ndim not in (1, 2):
        raise ValueError(f"`{name}` must be 1-D or 2-D, got {describe(tensor)}.")
    if tensor.shape[0] != n_rows:
        raise ValueError(
            f"embeddings and labels must have the same length: `{rows_name}` has {n_rows} rows, "
            f"`{name}` is {describe(tensor)}."
        )
    return tensor.to(device)


def v1_order(query: Any, second: Any, third: Any, fourth: Any) -> bool:
    """Whether positional arguments follow 1.x's ``(query, reference, query_labels, reference_labels)``.

    Decided by shapes: the second argument is a floating 2-D array of the query's width, the third has one
    row per query and the fourth one per reference row, and the 2.x reading does not fit as well.
    """
    shaped = all(hasattr(x, "shape") and hasattr(x, "dtype") for x in (query, second, third, fourth))
    if not shaped or second.ndim != 2 or query.ndim != 2 or second.shape[1] != query.shape[1]:
        return False
    floating = (
        torch.is_floating_point(second) if isinstance(second, Tensor) else np.issubdtype(second.dtype, np.floating)
    )
    v1 = floating and len(third) == len(query) and len(fourth) == len(second)
    v2 = (
        len(second) == len(query) and third.ndim == 2 and third.shape[1] == query.shape[1] and len(fourth) == len(third)
    )
    return bool(v1 and not v2)


def _is_prefix(query: Tensor, query_labels: Tensor, reference: Tensor, reference_labels: Tensor) -> bool:
    """pytorch-metric-learning's rule: the queries are the first rows of the reference set."""
    n = query.shape[0]
    if reference.shape[0] < n or reference_labels.shape[1:] != query_labels.shape[1:]:
        return False
    return bool(torch.allclose(query, reference[:n])) and bool((query_labels == reference_labels[:n]).all())


def row_codes(rows: Tensor) -> Tensor:
    return torch.unique(rows.reshape(rows.shape[0], -1), dim=0, return_inverse=True)[1]


def _occurrence(keys: Tensor) -> Tensor:
    """For every entry, how many earlier entries have the same key (0 for a first occurrence)."""
    order = torch.sort(keys, stable=True).indices
    sorted_keys = keys[order]
    starts = torch.ones_like(sorted_keys, dtype=torch.bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    positions = torch.arange(keys.shape[0], device=keys.device)
    group_start = torch.cummax(torch.where(starts, positions, 0), dim=0).values
    rank = torch.empty_like(positions)
    rank[order] = positions - group_start
    return rank


def locate_rows(query: Tensor, query_labels: Tensor, reference: Tensor, reference_labels: Tensor) -> Tensor:
    """Reference position of every query row: same embedding and label, j-th repeat to j-th occurrence."""
    n = query.shape[0]
    embedding_ids = row_codes(torch.cat([query, reference]))
    label_ids = row_codes(torch.cat([query_labels, reference_labels.to(query_labels.dtype)]))
    row_ids = embedding_ids * (int(label_ids.max()) + 1) + label_ids
    keys = torch.cat([_occurrence(row_ids[:n]), _occurrence(row_ids[n:])]) * (int(row_ids.max()) + 1) + row_ids
    reference_keys, order = torch.sort(keys[n:])
    where = torch.searchsorted(reference_keys, keys[:n]).clamp(max=max(reference_keys.shape[0] - 1, 0))
    found = reference_keys[where] == keys[:n]
    if not bool(found.all()):
        missing = int(torch.nonzero(~found)[0])
        raise ValueError(
            "With `embeddings_come_from_same_source=True` every query must be a row of `reference` (same embedding "
            f"and label); query row {missing} is not."
        )
    return order[where]


def as_numpy(x: Any) -> Any:
    return x.cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)


def check_inputs(
    query: Any,
    query_labels: Any,
    reference: Any,
    reference_labels: Any,
    ref_includes_query: bool,
    legacy: bool,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, bool]:
    """The inputs of ``get_accuracy`` checked and on ``device``: ``(query, query_labels, reference,
    reference_labels, own, ref_includes_query)``, ``own`` the reference position of every query (None: the
    queries are not in the reference set). ``legacy``: a 1.x call, whose queries may be any reference rows."""
    q = as_embeddings("query", query, device)
    ql = as_labels("query_labels", query_labels, q.shape[0], "query", device)
    if reference is None:
        if reference_labels is not None:
            raise ValueError(
                f"`reference_labels` must be None when `reference` is None, got {describe(reference_labels)}."
            )
        return q, ql, q, ql, torch.arange(q.shape[0], device=device), True
    if reference_labels is None:
        raise ValueError("`reference_labels` must be given with `reference`, got None.")
    r = as_embeddings("reference", reference, device)
    if r.shape[1] != q.shape[1]:
        raise ValueError(f"`reference` must have {q.shape[1]} columns like `query`, got {describe(r)}.")
    rl = as_labels("reference_labels", reference_labels, r.shape[0], "reference", device)
    if ql.shape[1:] != rl.shape[1:]:
        raise ValueError(f"`reference_labels` must have the label shape of `query_labels`, got {describe(rl)}.")
    if not ref_includes_query:
        return q, ql, r, rl, None, False
    if _is_prefix(q, ql, r, rl):
        return q, ql, r, rl, torch.arange(q.shape[0], device=device), True
    if legacy:
        return q, ql, r, rl, locate_rows(q, ql, r, rl), True
    raise ValueError(
        "When ref_includes_query is True, the first len(query) elements of reference must be equal to query. "
        "Likewise, the first len(query_labels) elements of reference_labels must be equal to query_labels."
    )
