"""Machinery shared by the metric classes that accumulate samples: validation, storage, DDP gather, de-duplication.

A metric that keeps every sample (``EmbeddingMetrics``, ``FNMRAtFMR``, ...) subclasses
:class:`SampleAccumulator` and declares its per-sample fields as :class:`FieldSpec` entries. The base class

* adds one list state per field (``dist_reduce_fx="cat"``, gathered by torchmetrics in rank order);
* validates every batch on its own and against the batches stored before (:func:`validate_batch`): same
  embedding dimension, same label shape and dtype, same optional fields present; nothing is stored when a
  check fails, and a zero-row batch stores nothing;
* makes the gather safe when a rank holds no sample (:meth:`SampleAccumulator._sync_dist`): torchmetrics
  replaces an empty list state by a 1-D float tensor, which breaks the gather of 2-D or integer states,
  so every rank first learns the shape and dtype of each state from the others and builds a zero-row
  tensor of the right kind;
* returns the gathered samples, de-duplicated by ``indexes`` when they were given (:func:`deduplicate`):
  one row per distinct index, ordered by index, so results do not depend on the number of processes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.distributed import gather_all_tensors

from torchmetrics_retrieval.functional._checks import check_embeddings, check_labels, check_mask, describe

__all__ = ["FieldKind", "FieldSpec", "SampleAccumulator", "deduplicate", "validate_batch"]

FieldKind = Literal["embeddings", "labels", "mask", "ids", "indexes"]

#: dtypes a list state may hold, by code, for the shape exchange before a gather.
_DTYPES: tuple[torch.dtype, ...] = (
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
    if checked.dtype not in _DTYPES:
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


def deduplicate(fields: Mapping[str, Tensor | None], indexes: Tensor) -> tuple[dict[str, Tensor | None], Tensor]:
    """Keep one row per distinct index (its first occurrence), ordered by index.

    DistributedSampler pads the last batches by repeating samples, and the gather puts the ranks one
    after the other; after this step the rows are those of a single process that saw every sample once.

    Args:
        fields: name -> ``(N, ...)`` tensor (or None, kept as None).
        indexes: ``(N,)`` integer dataset index of every row.

    Returns:
        ``(fields, kept_indexes)``: the rows kept, in index order, and their ``(M,)`` distinct indexes.

    Example:
        >>> rows, kept = deduplicate({"x": torch.tensor([10, 20, 30, 40])}, torch.tensor([3, 1, 3, 0]))
        >>> rows["x"].tolist(), kept.tolist()
        ([40, 20, 10], [0, 1, 3])
    """
    sorted_indexes, order = torch.sort(indexes, stable=True)
    first = torch.ones_like(sorted_indexes, dtype=torch.bool)
    first[1:] = sorted_indexes[1:] != sorted_indexes[:-1]
    rows = order[first]
    return {name: None if value is None else value[rows] for name, value in fields.items()}, sorted_indexes[first]


def _concat(value: list[Tensor] | Tensor) -> Tensor | None:
    """A list state (or its gathered tensor) as one tensor; None when it holds no row."""
    if isinstance(value, Tensor):
        return value if value.numel() else None
    if not value:
        return None
    return value[0] if len(value) == 1 else torch.cat(value)


class SampleAccumulator(Metric):
    """Base of the metrics that store every sample (list states), DDP-safe, de-duplicated by ``indexes``.

    Subclasses set ``_fields`` (the first field fixes the batch length and must be non-optional), call
    ``self._store(**batch)`` in ``update`` and implement ``_compute_samples(fields, indexes)``, which
    receives the output of :meth:`_collect`. A field named ``"indexes"`` (kind ``"indexes"``) enables the
    de-duplication.
    """

    _fields: tuple[FieldSpec, ...] = ()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for spec in self._fields:
            self.add_state(spec.name, default=[], dist_reduce_fx="cat")

    # ---- update -------------------------------------------------------------------------------------------------

    def _previous_batch(self) -> dict[str, Tensor | None] | None:
        """The first stored batch, field by field (None when nothing is stored)."""
        lead: list[Tensor] | Tensor = getattr(self, self._fields[0].name)
        if _concat(lead) is None:
            return None
        previous: dict[str, Tensor | None] = {}
        for spec in self._fields:
            state = getattr(self, spec.name)
            previous[spec.name] = (state[0] if isinstance(state, list) else state) if len(state) else None
        return previous

    def _store(self, **batch: Any) -> dict[str, Tensor | None]:
        """Validate a batch and append it to the list states (nothing stored on error or for zero rows)."""
        checked = self._prepare(validate_batch(self._fields, batch, self._previous_batch()))
        lead = checked[self._fields[0].name]
        if lead is not None and lead.shape[0] > 0:
            for name, value in checked.items():
                if value is not None:
                    getattr(self, name).append(value)
        return checked

    def _prepare(self, batch: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
        """Hook: transform a validated batch before storage (e.g. cast embeddings to a storage dtype)."""
        return batch

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """torchmetrics' ``forward`` (store the batch, return its own value), the batch checked against the state first.

        torchmetrics resets the state before it stores the batch, so without this check a batch that contradicts
        the stored ones (another dimension, a field given only now) would be accepted and break ``compute`` later.
        """
        batch = inspect.signature(self.update).bind(*args, **kwargs).arguments
        self._prepare(validate_batch(self._fields, batch, self._previous_batch()))
        return super().forward(*args, **kwargs)

    # ---- compute ------------------------------------------------------------------------------------------------

    def _collect(self) -> tuple[dict[str, Tensor | None], Tensor | None]:
        """Every accumulated (and gathered) sample: ``(fields, indexes)``.

        With an ``indexes`` field, rows are de-duplicated and ordered by index, and ``indexes`` holds the
        distinct dataset index of each row; otherwise rows are in gather order (rank 0's samples first,
        each rank's in update order) and ``indexes`` is None.

        Raises:
            ValueError: when no sample was accumulated on any process.
        """
        fields = {spec.name: _concat(getattr(self, spec.name)) for spec in self._fields}
        if fields[self._fields[0].name] is None:
            raise ValueError(
                f"{self.__class__.__name__}.compute() needs at least one sample, got none: call update() with a "
                "non-empty batch first (on at least one process)."
            )
        indexes = fields.pop("indexes", None)
        if indexes is None:
            return fields, None
        return deduplicate(fields, indexes)

    def compute(self) -> Any:
        """Gather, de-duplicate and hand the samples to ``_compute_samples``.

        If that raises while the states are gathered across processes, the local states are restored first
        (torchmetrics would otherwise leave the metric synced), so the metric stays usable.
        """
        try:
            return self._compute_samples(*self._collect())
        except Exception:
            if self._is_synced and self._cache is not None:
                self.unsync()
            raise

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> Any:
        """Hook: the metric value from every sample (see :meth:`_collect`)."""
        raise NotImplementedError

    # ---- distributed --------------------------------------------------------------------------------------------

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors, process_group: Any | None = None) -> None:
        """Gather the list states, first giving every empty state a zero-row tensor of the right shape and dtype.

        Every process learns from the others which shape and dtype each state has; a field present on one
        process but missing on another (while both hold samples), or stored with another shape or dtype, is a
        ``ValueError`` raised identically on every process (no hang, state unchanged).
        """
        group = process_group or self.process_group
        local = {spec.name: _concat(getattr(self, spec.name)) for spec in self._fields}
        layouts = dist_sync_fn(_layout(local, self._fields, self.device), group=group)
        templates = _templates(torch.stack([layout.to(self.device) for layout in layouts]), self._fields)
        for spec in self._fields:
            value, template = local[spec.name], templates[spec.name]
            if value is None and template is not None:
                value = torch.zeros((0, *template[1:]), dtype=template[0], device=self.device)
            setattr(self, spec.name, [] if value is None else [value])
        super()._sync_dist(dist_sync_fn, process_group=process_group)


def _layout(local: Mapping[str, Tensor | None], specs: Sequence[FieldSpec], device: torch.device) -> Tensor:
    """``(F, 4)`` int64 rows ``(n_rows, ndim, trailing size, dtype code)`` of the local states (-1 if empty)."""
    rows = []
    for spec in specs:
        value = local[spec.name]
        if value is None:
            rows.append([0, -1, -1, -1])
        else:
            trailing = value.shape[1] if value.ndim == 2 else -1
            rows.append([value.shape[0], value.ndim, trailing, _DTYPES.index(value.dtype)])
    return torch.tensor(rows, dtype=torch.long, device=device)


def _templates(layouts: Tensor, specs: Sequence[FieldSpec]) -> dict[str, tuple[Any, ...] | None]:
    """From the ``(P, F, 4)`` layouts of every process: ``(dtype, *trailing shape)`` of each state, or None.

    Raises:
        ValueError: the same on every process when the processes disagree.
    """
    has_samples = layouts[:, 0, 0] > 0
    templates: dict[str, tuple[Any, ...] | None] = {}
    for j, spec in enumerate(specs):
        rows = layouts[:, j]
        present = rows[:, 0] > 0
        if bool((present != has_samples).any()) and bool(present.any()):
            raise ValueError(
                f"`{spec.name}` must be given on every process that has samples or on none; processes "
                f"{torch.nonzero(present).flatten().tolist()} of {torch.nonzero(has_samples).flatten().tolist()} "
                "gave it."
            )
        kinds = torch.unique(rows[present][:, 1:], dim=0)
        if kinds.shape[0] > 1:
            raise ValueError(
                f"`{spec.name}` must have the same trailing shape and dtype on every process, got "
                f"{[_describe_layout(k) for k in kinds.tolist()]}."
            )
        if kinds.shape[0] == 0:
            templates[spec.name] = None
            continue
        ndim, trailing, code = kinds[0].tolist()
        templates[spec.name] = (_DTYPES[code], trailing) if ndim == 2 else (_DTYPES[code],)
    return templates


def _describe_layout(row: list[int]) -> str:
    ndim, trailing, code = row
    shape = "(N, " + str(trailing) + ")" if ndim == 2 else "(N,)"
    return f"{shape} {_DTYPES[code]}"
