"""Reading the command line's inputs: arrays (``.npy``, ``.npz``, ``.pt``, ``.safetensors``) and tables of labels
(``.csv``, ``.parquet``), checked against each other so that a bad file is named in one line.

A file holding several arrays (``.npz``, ``.safetensors``, a ``.pt`` dict) is read as ``FILE:KEY``; without a key
its only (or first) array is taken. A table gives the labels from its ``--label-column`` and the per-sample fields
(``--camera-ids camera`` ...) from its other columns, so one CSV can describe a whole evaluation.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["Inputs", "UsageError", "load_array", "load_labels", "read_side"]

ARRAY_SUFFIXES = (".npy", ".npz", ".pt", ".safetensors")
TABLE_SUFFIXES = (".csv", ".parquet")


class UsageError(Exception):
    """A mistake in the command line or its files: printed as one line, exit code 2."""


@dataclass
class Inputs:
    """The tensors of one evaluation, as :func:`~torchmetrics_retrieval.functional.retrieval_metrics` takes them."""

    embeddings: Tensor
    labels: Tensor
    gallery: Tensor | None = None
    gallery_labels: Tensor | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def _split_key(spec: str, what: str) -> tuple[Path, str | None]:
    """``FILE`` or ``FILE:KEY`` (a path that exists as written is never split)."""
    path = Path(spec)
    if path.is_file():
        return path, None
    head, sep, key = spec.rpartition(":")
    if sep and Path(head).is_file():
        return Path(head), key
    raise UsageError(f"{what} file not found: {spec}")


def _pick(arrays: dict[str, Any], path: Path, key: str | None, what: str) -> Any:
    if not arrays:
        raise UsageError(f"{what} file {path} holds no array")
    if key is None:
        return next(iter(arrays.values()))
    if key not in arrays:
        raise UsageError(f"{what} file {path} has no array {key!r}; it has {sorted(arrays)}")
    return arrays[key]


def load_array(spec: str, what: str) -> Tensor:
    """The tensor in ``spec`` (``FILE`` or ``FILE:KEY``); ``what`` names it in errors."""
    path, key = _split_key(spec, what)
    suffix = path.suffix.lower()
    try:
        if suffix == ".pt":
            value = torch.load(path, map_location="cpu", weights_only=True)
            value = _pick(value, path, key, what) if isinstance(value, dict) else value
            if not isinstance(value, Tensor):
                raise UsageError(f"{what} file {path} must hold a tensor, got {type(value).__name__}")
            return value
        if suffix in (".npy", ".npz"):
            loaded = np.load(path, allow_pickle=False)
            array = _pick(dict(loaded), path, key, what) if isinstance(loaded, np.lib.npyio.NpzFile) else loaded
            return torch.from_numpy(np.ascontiguousarray(array))
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return _pick(load_file(str(path)), path, key, what)
    except UsageError:
        raise
    except ImportError as error:
        raise UsageError(f"reading {path} needs {error.name}: pip install {error.name}") from error
    except Exception as error:  # a damaged or foreign file: say which, in one line
        raise UsageError(f"cannot read {what} file {path}: {type(error).__name__}: {error}") from error
    raise UsageError(f"{what} file must end in {', '.join(ARRAY_SUFFIXES + TABLE_SUFFIXES)}, got {path}")


def load_table(path: Path) -> dict[str, np.ndarray]:
    """The columns of a ``.csv`` (with a header row) or ``.parquet`` file."""
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
        with path.open(newline="") as file:
            rows = list(csv.reader(file))
    except ImportError as error:
        raise UsageError(f"reading {path} needs {error.name}: pip install {error.name}") from error
    except Exception as error:
        raise UsageError(f"cannot read table {path}: {type(error).__name__}: {error}") from error
    if not rows:
        raise UsageError(f"table {path} is empty: it needs a header row")
    header, body = rows[0], rows[1:]
    if any(len(row) != len(header) for row in body):
        raise UsageError(f"table {path} has rows whose length differs from its header's ({len(header)} columns)")
    return {name: np.array([row[i] for row in body], dtype=str) for i, name in enumerate(header)}


def _typed(values: np.ndarray) -> np.ndarray:
    """Text columns as integers, floats or booleans when every entry reads as one; other text stays text."""
    if values.dtype.kind not in "US":
        return values
    for parse in (np.int64, np.float64):
        try:
            return values.astype(parse)
        except ValueError:
            pass
    lowered = np.char.lower(values)
    if np.isin(lowered, ("true", "false")).all():
        return lowered == "true"
    return values


def encode(query_side: np.ndarray, gallery_side: np.ndarray | None = None) -> tuple[Tensor, Tensor | None]:
    """Tensors of one field on both sides; text (``"0001_c1"``) becomes integer codes shared by the two sides."""
    query_side = _typed(query_side)
    gallery_side = None if gallery_side is None else _typed(gallery_side)
    if query_side.dtype.kind in "USO" or (gallery_side is not None and gallery_side.dtype.kind in "USO"):
        both = np.concatenate([query_side.astype(str), [] if gallery_side is None else gallery_side.astype(str)])
        codes = np.unique(both, return_inverse=True)[1].astype(np.int64)
        query_side, gallery_side = codes[: len(query_side)], None if gallery_side is None else codes[len(query_side) :]
    as_tensor = lambda a: torch.from_numpy(np.array(a))  # noqa: E731  (a copy: tables can be read-only)
    return as_tensor(query_side), None if gallery_side is None else as_tensor(gallery_side)


def load_labels(spec: str, label_column: str, what: str) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
    """``(labels, table)``: from a table (its ``label_column``; the table is returned for the other fields) or
    from an array file (``table`` None)."""
    path, key = _split_key(spec, what)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        return load_array(spec, what).numpy(), None
    table = load_table(path)
    column = key or label_column
    if column not in table:
        raise UsageError(f"{what} table {path} has no column {column!r}; it has {sorted(table)} (see --label-column)")
    return table[column], table


def read_side(source: str, table: dict[str, np.ndarray] | None, option: str) -> np.ndarray:
    """A per-sample field: a column of the labels table, else an array file (``--option`` names it in errors)."""
    if table is not None and source in table:
        return table[source]
    if table is not None and not Path(source).is_file() and ":" not in source:
        raise UsageError(f"{option} {source!r} is neither a column of the labels table ({sorted(table)}) nor a file")
    return load_array(source, option).numpy()


def check_rows(name: str, values: Any, n: int, of: str) -> None:
    """One row per sample: ``len(values) == n`` (``of`` names what gives ``n``)."""
    if len(values) != n:
        raise UsageError(f"{name} has {len(values)} rows, not {n} like {of}")
