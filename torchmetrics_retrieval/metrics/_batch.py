"""Validation of one batch of per-sample fields, on its own and against the batches a metric stored before.

A metric that keeps every sample declares its fields as :class:`FieldSpec` entries;
:func:`validate_batch` checks a batch against them (same embedding dimension, same label shape and dtype,
same optional fields present as in the stored batches) before anything is stored, so a rejected batch
leaves the state untouched. ``_state.SampleAccumulator`` calls it in ``update`` and ``forward``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings, check_labels, check_mask, describe

__all__ = [
    "DTYPES",
    "SET_FIELDS",
    "FieldKind",
    "FieldSpec",
    "validate_batch",
]

FieldKind = Literal["embeddings", "labels", "mask", "ids", "indexes"]

#: dtypes a list state may hold; a dtype's position is its code in the shape exchange before a gather (`_state`).
DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    *(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)),
)


@dataclass(frozen=True)
class FieldSpec:
    """One per-sample field accumulated by a metric.

    Attributes:
        name: argument name in ``update`` and name of the list state.
        kind: ``"embeddings"`` (2-D floating, finite, same number of columns in every batch), ``"labels"``
            (1-D or 2-D, any real dtype, same trailing shape and dtype in every batch), ``"mask"`` (1-D bool),
            ``"ids"`` (1-D integer or bool, same dtype in every batch), ``"indexes"`` (1-D integer dataset
            indexes).
        optional: whether the field may be None; a field given in one batch must then be given in all.
    """

    name: str
    kind: FieldKind
    optional: bool = False


#: The fields of a labelled set split into queries and gallery (``split_query_gallery``'s), in ``update``'s order:
#: the metrics that evaluate such a set store these first.
SET_FIELDS = (
    FieldSpec("embeddings", "embeddings"),
    FieldSpec("labels", "labels"),
    FieldSpec("is_query", "mask", optional=True),
    FieldSpec("is_gallery", "mask", optional=True),
    FieldSpec("sequence_ids", "ids", optional=True),
    FieldSpec("search_groups", "ids", optional=True),
)


def _check_1d(name: str, value: Any, n_rows: int, rows_name: str, *, allow_bool: bool) -> Tensor:
    """A 1-D tensor of integers (or bools when allowed) with ``n_rows`` rows."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D torch.Tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(value)}.")
    if value.is_floating_point() or value.is_complex() or (value.dtype == torch.bool and not allow_bool):
        raise TypeError(f"`{name}` must have an integer dtype, got {describe(value)}.")
    if value.shape[0] != n_rows:
        raise ValueError(f"`{name}` must have {n_rows} rows like `{rows_name}`, got {describe(value)}.")
    return value


def _check_field(spec: FieldSpec, value: Any, n_rows: int, rows_name: str) -> Tensor:
    """Checks of one field on its own (the rows name is the field that fixes the batch length)."""
    if spec.kind == "embeddings":
        checked = check_embeddings(spec.name, value, allow_empty=True)
    elif spec.kind == "labels":
        checked = check_labels(spec.name, value, n_rows, rows_name)
    elif spec.kind == "mask":
        checked = check_mask(spec.name, value, n_rows, rows_name)
    else:
        checked = _check_1d(spec.name, value, n_rows, rows_name, allow_bool=spec.kind == "ids")
    if checked.dtype not in DTYPES:
        raise TypeError(f"`{spec.name}` must have a real or bool dtype, got {describe(value)}.")
    return checked


def _check_against(spec: FieldSpec, value: Tensor, previous: Tensor) -> None:
    """Checks of one field against the first batch stored before."""
    if spec.kind == "embeddings":
        if value.shape[1] != previous.shape[1]:
            raise ValueError(
                f"`{spec.name}` must have {previous.shape[1]} columns like the previous batches, got {describe(value)}."
            )
        return
    if value.shape[1:] != previous.shape[1:]:
        raise ValueError(
            f"`{spec.name}` must have the shape (N, {', '.join(map(str, previous.shape[1:]))}) of the previous "
            f"batches, got {describe(value)}."
            if previous.ndim > 1
            else f"`{spec.name}` must be 1-D like in the previous batches, got {describe(value)}."
        )
    if value.dtype != previous.dtype:
        raise TypeError(
            f"`{spec.name}` must have dtype {previous.dtype} like the previous batches, got {describe(value)}."
        )


def validate_batch(
    specs: Sequence[FieldSpec], batch: Mapping[str, Any], previous: Mapping[str, Tensor | None] | None
) -> dict[str, Tensor | None]:
    """Check one batch on its own and against the batches stored before; return it detached.

    Args:
        specs: the fields; the first one fixes the number of rows of the batch.
        batch: field name -> value given to ``update`` (None for a missing optional field).
        previous: field name -> a tensor of the first stored batch (None for a field that was not given),
            or None when nothing is stored yet.

    Returns:
        field name -> detached tensor on the device of the first field (None for missing optional fields).

    Raises:
        TypeError, ValueError: naming the argument and the value; a field given now but not before (or the
            reverse) is a ``ValueError``.

    Example:
        >>> specs = (FieldSpec("embeddings", "embeddings"), FieldSpec("labels", "labels"))
        >>> first = validate_batch(specs, {"embeddings": torch.zeros(2, 3), "labels": torch.tensor([0, 1])}, None)
        >>> validate_batch(specs, {"embeddings": torch.zeros(1, 4), "labels": torch.tensor([0])}, first)
        Traceback (most recent call last):
        ...
        ValueError: `embeddings` must have 3 columns like the previous batches, got a tensor of shape (1, 4) ...
    """
    lead = specs[0]
    first = _check_field(lead, batch[lead.name], 0, lead.name)
    n_rows = first.shape[0]
    checked: dict[str, Tensor | None] = {}
    for spec in specs:
        value = batch.get(spec.name)
        if value is None:
            if not spec.optional:
                raise TypeError(f"`{spec.name}` must be a torch.Tensor, got None.")
            if previous is not None and previous.get(spec.name) is not None:
                raise ValueError(f"`{spec.name}` must be given in every batch (it was given before), got None.")
            checked[spec.name] = None
            continue
        value = _check_field(spec, value, n_rows, lead.name)
        if previous is not None:
            before = previous.get(spec.name)
            if before is None:
                raise ValueError(
                    f"`{spec.name}` must be None in every batch (it was not given before), got {describe(value)}."
                )
            _check_against(spec, value, before)
        checked[spec.name] = value.detach().to(first.device)
    return checked
