"""Argument checks shared by the functional core and the metric classes.

Every check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (wrong value or
shape) with a message that names the argument and echoes what was given, in the form
``"`name` must be <expected>, got <value>."``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_counts",
    "check_embeddings",
    "check_fractions",
    "check_id_pair",
    "check_ids",
    "check_label_shape",
    "check_labels",
    "check_mask",
    "check_positive_int",
    "check_same_length",
    "check_self_index",
    "check_top_k",
    "describe",
]


def describe(value: Any) -> str:
    """Short description of ``value`` for error messages (tensors by shape and dtype, not content)."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
    return repr(value)


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 1 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int >= 1, got {describe(value)}.")
    if value < 1:
        raise ValueError(f"`{name}` must be an int >= 1, got {value}.")
    return value


def check_positive_int_or_none(name: str, value: Any) -> int | None:
    """Return ``value`` if it is None or a positive int (``chunk_size`` and the like: None means automatic)."""
    return None if value is None else check_positive_int(name, value)


def check_top_k(name: str, values: int | Iterable[int], *, allow_empty: bool = True) -> tuple[int, ...]:
    """Normalise a cutoff or a collection of cutoffs to a sorted tuple of distinct ints >= 1."""
    if isinstance(values, int) and not isinstance(values, bool):
        values = (values,)
    if isinstance(values, (str, bytes, Tensor)) or not isinstance(values, Iterable):
        raise TypeError(f"`{name}` must be an int or a tuple of ints >= 1, got {describe(values)}.")
    items = tuple(values)
    for k in items:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"`{name}` must contain ints >= 1, got {describe(k)} in {items!r}.")
        if k < 1:
            raise ValueError(f"`{name}` must contain ints >= 1, got {k} in {items!r}.")
    if not items and not allow_empty:
        raise ValueError(f"`{name}` must not be empty, got {items!r}.")
    return tuple(sorted(set(items)))


def check_fractions(name: str, values: float | Iterable[float]) -> tuple[float, ...]:
    """Normalise a fraction or a collection of fractions in [0, 1] to a tuple (order kept)."""
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = (values,)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"`{name}` must be a number or a tuple of numbers in [0, 1], got {describe(values)}.")
    items = tuple(values)
    for f in items:
        if isinstance(f, bool) or not isinstance(f, (int, float)):
            raise TypeError(f"`{name}` must contain numbers in [0, 1], got {describe(f)} in {items!r}.")
        if not (0.0 <= f <= 1.0) or math.isnan(f):
            raise ValueError(f"`{name}` must contain numbers in [0, 1], got {f} in {items!r}.")
    return items


def check_open_fractions(name: str, values: float | Iterable[float]) -> tuple[float, ...]:
    """:func:`check_fractions` with every value strictly between 0 and 1 (prior probabilities of a target)."""
    items = check_fractions(name, values)
    for f in items:
        if not 0.0 < f < 1.0:
            raise ValueError(f"`{name}` must contain numbers strictly between 0 and 1, got {f} in {items!r}.")
    return items


def check_costs(name: str, value: Any) -> tuple[float, float]:
    """A pair of positive finite numbers (the costs of a miss and of a false alarm), as floats."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"`{name}` must be a pair (C_miss, C_fa) of positive numbers, got {describe(value)}.")
    items = tuple(value)
    if len(items) != 2 or any(isinstance(c, bool) or not isinstance(c, (int, float)) for c in items):
        raise TypeError(f"`{name}` must be a pair (C_miss, C_fa) of positive numbers, got {items!r}.")
    if not all(0.0 < c < math.inf for c in items):
        raise ValueError(f"`{name}` must hold two positive finite costs, got {items!r}.")
    return float(items[0]), float(items[1])


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)!r}, got {value!r}.")
    return value


def check_embeddings(name: str, value: Any, *, allow_empty: bool = False) -> Tensor:
    """A 2-D floating tensor with finite values, at least one column (and one row unless allowed)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor of shape (N, D), got {describe(value)}.")
    if value.ndim != 2:
        raise ValueError(f"`{name}` must be 2-D of shape (N, D), got {describe(value)}.")
    if not value.is_floating_point():
        raise TypeError(f"`{name}` must have a floating dtype, got {describe(value)}.")
    if value.shape[1] == 0:
        raise ValueError(f"`{name}` must have at least one column, got {describe(value)}.")
    if value.shape[0] == 0 and not allow_empty:
        raise ValueError(f"`{name}` must have at least one row, got {describe(value)}.")
    if not _all_finite(value):
        n_bad = sum(int((~torch.isfinite(block)).any(dim=1).sum()) for block in value.split(_check_rows(value)))
        raise ValueError(f"`{name}` must be finite, got NaN or inf in {n_bad} row(s) of {describe(value)}.")
    return value


def _check_rows(value: Tensor) -> int:
    """Rows per block of the finiteness check: about 16 MiB of the tensor (``torch.isfinite`` makes an ``abs``
    copy and boolean masks as large as its input: a 1M x 384 corpus would take 2.5 GiB at once)."""
    return max(1, (16 * 2**20) // max(1, value.shape[1] * value.element_size()))


def _all_finite(value: Tensor) -> bool:
    """Whether every entry is finite, without a copy of ``value``: a NaN or an infinity makes the sum NaN or
    infinite, so a finite sum proves every entry finite; an infinite sum (an overflow, or a bad entry) is settled
    block by block."""
    if value.numel() == 0 or bool(torch.isfinite(value.sum())):
        return True
    return all(bool(torch.isfinite(block).all()) for block in value.split(_check_rows(value)))


def check_labels(name: str, value: Any, n_rows: int | None, rows_name: str = "") -> Tensor:
    """Labels: a 1-D or 2-D tensor with ``n_rows`` rows (any number when None), any dtype (no casting)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor of shape (N,) or (N, L), got {describe(value)}.")
    if value.ndim not in (1, 2):
        raise ValueError(f"`{name}` must be 1-D or 2-D, got {describe(value)}.")
    if n_rows is not None:
        check_same_length(name, value, n_rows, rows_name)
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"`{name}` must be finite, got NaN or inf in {describe(value)}.")
    return value


def check_mask(name: str, value: Any, n_rows: int, rows_name: str) -> Tensor:
    """A 1-D bool tensor with one entry per row."""
    return _check_typed_rows(name, value, torch.bool, "a bool torch.Tensor of shape (N,)", "1-D", n_rows, rows_name)


def _check_typed_rows(
    name: str, value: Any, dtype: torch.dtype, expected: str, one_d: str, n_rows: int, rows_name: str
) -> Tensor:
    """A 1-D tensor of exactly ``dtype`` with ``n_rows`` entries, checked in this order: a tensor (``expected``
    names what it must be), its dtype, 1-D (worded ``one_d``), its length."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be {expected}, got {describe(value)}.")
    if value.dtype != dtype:
        raise TypeError(f"`{name}` must have dtype {dtype}, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be {one_d}, got {describe(value)}.")
    check_same_length(name, value, n_rows, rows_name)
    return value


def check_same_length(name: str, value: Tensor, n_rows: int, rows_name: str) -> None:
    """``value`` must have ``n_rows`` rows, as ``rows_name`` has."""
    if value.shape[0] != n_rows:
        raise ValueError(f"`{name}` must have {n_rows} rows like `{rows_name}`, got {describe(value)}.")


def check_ids(name: str, value: Any, n_rows: int, rows_name: str, *, integer: bool = True) -> Tensor:
    """Per-row ids (sequence ids, search groups, categories): a 1-D tensor with ``n_rows`` entries, of an
    integer or bool dtype unless ``integer`` is False."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D torch.Tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(value)}.")
    if integer and (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"`{name}` must have an integer or bool dtype, got {describe(value)}.")
    check_same_length(name, value, n_rows, rows_name)
    return value


def check_id_pair(
    name: str,
    value: Any,
    n_query: int,
    n_gallery: int,
    device: torch.device,
    *,
    sides: tuple[str, str] = ("query", "gallery"),
    when: str = " when `gallery` is given",
) -> tuple[Tensor, Tensor] | None:
    """Ids given as a ``(query_side, gallery_side)`` pair for a query set and a separate gallery, on ``device``
    (None stays None). ``sides`` names the arguments whose rows each side follows; ``when`` ends the message
    of a value that is not a pair."""
    if value is None:
        return None
    if not (isinstance(value, tuple) and len(value) == 2):
        raise TypeError(f"`{name}` must be a (query_side, gallery_side) pair of tensors{when}, got {describe(value)}.")
    query_side = check_ids(f"{name}[0]", value[0], n_query, sides[0]).to(device)
    gallery_side = check_ids(f"{name}[1]", value[1], n_gallery, sides[1]).to(device)
    return query_side, gallery_side


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {describe(value)}.")
    return value


def check_str(name: str, value: Any) -> str:
    """Return ``value`` if it is a str."""
    if not isinstance(value, str):
        raise TypeError(f"`{name}` must be a str, got {describe(value)}.")
    return value


def check_callable(name: str, value: Any) -> Any:
    """Return ``value`` if it is callable or None."""
    if value is not None and not callable(value):
        raise TypeError(f"`{name}` must be callable or None, got {describe(value)}.")
    return value


def check_label_shape(name: str, value: Tensor, other: Tensor, other_name: str) -> None:
    """Labels compared with other labels: the same label shape (``()`` for 1-D, ``(L,)`` for 2-D)."""
    if value.shape[1:] != other.shape[1:]:
        raise ValueError(
            f"`{name}` must have the label shape {tuple(other.shape[1:])} of `{other_name}`, got {describe(value)}."
        )


def check_counts(name: str, value: Any, n_rows: int, rows_name: str) -> Tensor:
    """Per-row counts (numbers of relevant or candidate items): a 1-D integer tensor with ``n_rows`` entries."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D integer torch.Tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(value)}.")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"`{name}` must have an integer dtype, got {describe(value)}.")
    check_same_length(name, value, n_rows, rows_name)
    return value


def check_self_index(name: str, value: Any, n_query: int, n_gallery: int, rows_name: str = "query") -> Tensor:
    """Gallery position of each query, -1 when it is not in the gallery: a 1-D int64 tensor with ``n_query``
    entries in ``[-1, n_gallery)`` (one min/max pass)."""
    value = _check_typed_rows(
        name, value, torch.int64, "an int64 tensor of shape (Q,)", "1-D of shape (Q,)", n_query, rows_name
    )
    if value.numel() and (int(value.min()) < -1 or int(value.max()) >= n_gallery):
        raise ValueError(
            f"`{name}` must hold gallery positions in [0, {n_gallery}) or -1, "
            f"got values in [{int(value.min())}, {int(value.max())}]."
        )
    return value
