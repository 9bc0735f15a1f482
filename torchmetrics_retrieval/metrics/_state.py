"""Machinery shared by the metric classes that accumulate samples: storage, DDP gather, de-duplication, helpers.

A metric that keeps every sample (``EmbeddingMetrics``, ``FNMRAtFMR``, ...) subclasses
:class:`SampleAccumulator` and declares its per-sample fields as :class:`FieldSpec` entries. The base class

* adds one list state per field (``dist_reduce_fx="cat"``, gathered by torchmetrics in rank order);
* validates every batch on its own and against the batches stored before (:func:`validate_batch`, in
  ``_batch``): same embedding dimension, same label shape and dtype, same optional fields present; nothing
  is stored when a check fails, and a zero-row batch stores nothing;
* makes the gather safe when a rank holds no sample (:meth:`SampleAccumulator._sync_dist`): torchmetrics
  replaces an empty list state by a 1-D float tensor, which breaks the gather of 2-D or integer states,
  so every rank first learns the shape and dtype of each state from the others and builds a zero-row
  tensor of the right kind;
* returns the gathered samples, de-duplicated by ``indexes`` when they were given (:func:`deduplicate`):
  one row per distinct index, ordered by index, so results do not depend on the number of processes.

The helpers below it serve every metric class, including those that keep sums instead of samples
(``PCF``): :func:`cast_like_first`, :func:`non_empty_fractions`, :func:`on_gathered_states`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.distributed import gather_all_tensors

from torchmetrics_retrieval.functional._checks import check_choice, check_fractions
from torchmetrics_retrieval.metrics._batch import DTYPES, FieldKind, FieldSpec, validate_batch

__all__ = [
    "FieldKind",
    "FieldSpec",
    "SampleAccumulator",
    "cast_like_first",
    "check_distributed",
    "deduplicate",
    "non_empty_fractions",
    "on_gathered_states",
    "runs_sharded",
    "validate_batch",
]

T = TypeVar("T")


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
    receives the output of :meth:`_collect`. A field of kind ``"indexes"`` enables the de-duplication.
    """

    _fields: tuple[FieldSpec, ...] = ()
    #: ``"shard"``: under DDP ``compute`` keeps each process's samples where they are (a subclass that supports
    #: it sets this from its ``distributed`` argument and computes the sharded values in its ``compute``).
    distributed: str = "gather"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for spec in self._fields:
            self.add_state(spec.name, default=[], dist_reduce_fx="cat")

    # ---- sharded mode -------------------------------------------------------------------------------------------

    def _sharded_values(self) -> bool:
        """Whether the sharded path computes every value this metric was asked for."""
        return False

    def _sharding(self) -> bool:
        """Whether ``compute`` runs sharded (:func:`runs_sharded`)."""
        return runs_sharded(self, self.distributed, self._sharded_values())

    def sync(self, *args: Any, **kwargs: Any) -> None:
        """torchmetrics' gather of the states, skipped in sharded mode (each process keeps its own samples)."""
        if not self._sharding():
            super().sync(*args, **kwargs)

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
        index_field = next((spec.name for spec in self._fields if spec.kind == "indexes"), None)
        indexes = None if index_field is None else fields.pop(index_field)
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
            rows.append([value.shape[0], value.ndim, trailing, DTYPES.index(value.dtype)])
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
        templates[spec.name] = (DTYPES[code], trailing) if ndim == 2 else (DTYPES[code],)
    return templates


def _describe_layout(row: list[int]) -> str:
    ndim, trailing, code = row
    shape = "(N, " + str(trailing) + ")" if ndim == 2 else "(N,)"
    return f"{shape} {DTYPES[code]}"


# ---- helpers of the metric classes --------------------------------------------------------------------------------


def cast_like_first(batch: dict[str, Tensor | None], name: str, stored: list[Tensor] | Tensor) -> None:
    """Cast ``batch[name]`` to the dtype of the first stored batch of that field (no-op when nothing is stored)."""
    value = batch[name]
    if value is not None and len(stored):
        batch[name] = value.to(stored[0].dtype)


def non_empty_fractions(name: str, values: float | Iterable[float]) -> tuple[float, ...]:
    """:func:`check_fractions`, and at least one value (a metric class without a value to report is a mistake).

    Example:
        >>> non_empty_fractions("fmr_vals", ())
        Traceback (most recent call last):
            ...
        ValueError: `fmr_vals` must hold at least one number in [0, 1], got ().
    """
    fractions = check_fractions(name, values)
    if not fractions:
        raise ValueError(f"`{name}` must hold at least one number in [0, 1], got {values!r}.")
    return fractions


def on_gathered_states(metric: Metric, fn: Callable[[], T]) -> T:
    """Call ``fn`` while the states of ``metric`` are gathered across processes (as ``compute`` does).

    Outside DDP (or with ``sync_on_compute=False``) the states stay local. The local states are restored
    afterwards, also when ``fn`` raises. Under DDP every process must call this (it is a collective).
    """
    metric.sync(dist_sync_fn=metric.dist_sync_fn, should_sync=metric._to_sync)
    try:
        return fn()
    finally:
        if metric._is_synced:
            metric.unsync()


#: The values of the metrics' ``distributed`` argument.
DISTRIBUTED_MODES = ("shard", "gather")


def check_distributed(value: Any) -> str:
    """Return ``value`` if it is one of :data:`DISTRIBUTED_MODES` (the metrics' ``distributed`` argument)."""
    return str(check_choice("distributed", value, DISTRIBUTED_MODES))


def runs_sharded(metric: Any, distributed: str, sharded_values: bool) -> bool:
    """Whether ``metric.compute`` runs sharded: ``distributed="shard"``, syncing on compute, several processes
    in its group, and ``sharded_values``: the sharded path computes every requested value (for the retrieval
    metrics, :func:`shardable` of their options)."""
    return (
        sharded_values
        and distributed == "shard"
        and metric._to_sync
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size(metric.process_group) > 1
    )
