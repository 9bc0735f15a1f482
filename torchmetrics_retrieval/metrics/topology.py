"""``PCF``: principal components fraction of the embeddings, from streaming covariance sums (memory O(d^2))."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities.distributed import gather_all_tensors

from torchmetrics_retrieval.functional.topology import _sorted_eigenvalues, covariance_sums, pcf_from_sums
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._state import (
    FieldSpec,
    SampleAccumulator,
    cast_like_first,
    non_empty_fractions,
    on_gathered_states,
    validate_batch,
)

__all__ = ["PCF"]

Sums = tuple[Tensor, Tensor, Tensor]


class PCF(SampleAccumulator):
    r"""Principal components fraction: the share of dimensions needed to explain a share of the variance.

    With :math:`\lambda_1 \ge \dots \ge \lambda_m` the :math:`m = \min(N, d)` largest eigenvalues of the
    covariance of the N embeddings (dimension d), for each required fraction ``r``

    .. math:: n = 1 + \#\{j \le m : (\lambda_1 + \dots + \lambda_j) / (\lambda_1 + \dots + \lambda_m) \le r\}

    and the value is :math:`\min(n, d) / d` (see :func:`~torchmetrics_retrieval.functional.topology.pcf`).
    A low value means the embeddings use few directions (dimensional collapse).

    State: by default the streaming sums of
    :func:`~torchmetrics_retrieval.functional.topology.covariance_sums` (row count, row sum, sum of outer
    products, float64), added across batches and summed across processes: memory O(d^2), whatever N.
    When ``indexes`` are given, the rows are kept instead (list states), so that the duplicates that
    ``DistributedSampler`` adds can be dropped after the gather; then ``indexes`` must be given in every
    batch, on every process (a mix is a ``ValueError``).

    Args:
        pcf_variance: required explained-variance fractions ``r`` in [0, 1] (at least one); keys ``pcf/{r}``.
        kwargs: torchmetrics' options (``compute_on_cpu``, ``sync_on_compute``, ``process_group``, ...);
            any other keyword is an error.

    Example:
        >>> metric = PCF(pcf_variance=(0.5, 1.0))
        >>> metric.update(torch.eye(4, 10)[:2])
        >>> metric.update(torch.eye(4, 10)[2:])
        >>> metric.compute()
        {'pcf/0.5': tensor(0.2000), 'pcf/1.0': tensor(0.5000)}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    _fields = (FieldSpec("embeddings", "embeddings"), FieldSpec("indexes", "indexes", optional=True))

    embeddings: list[Tensor]
    indexes: list[Tensor]
    count: Tensor
    row_sum: Tensor
    outer_sum: Tensor

    def __init__(self, *, pcf_variance: float | Iterable[float] = (0.5,), **kwargs: Unpack[MetricKwargs]) -> None:
        fractions = non_empty_fractions("pcf_variance", pcf_variance)
        super().__init__(**kwargs)
        self.pcf_variance = fractions
        # Empty sums mean "no streamed sample yet": the dimension is learnt from the first batch.
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("row_sum", default=torch.zeros(0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("outer_sum", default=torch.zeros(0, 0, dtype=torch.float64), dist_reduce_fx="sum")

    # ---- update -------------------------------------------------------------------------------------------------

    def _check(self, embeddings: Tensor, labels: Tensor | None, indexes: Tensor | None) -> dict[str, Tensor | None]:
        """Validate a batch against the state: same dimension, ``indexes`` given always or never."""
        if labels is not None and (not isinstance(labels, Tensor) or labels.ndim == 0):
            raise TypeError(f"`labels` must be None or a (B,) or (B, L) tensor, got {labels!r}.")
        if labels is not None and isinstance(embeddings, Tensor) and labels.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"`labels` must have one row per embedding, got {labels.shape[0]} rows for {embeddings.shape[0]}."
            )
        if self.row_sum.numel():  # streamed sums fix the dimension; indexes were never given
            previous: dict[str, Tensor | None] | None = {
                "embeddings": self.row_sum.new_empty(0, self.row_sum.shape[0]),
                "indexes": None,
            }
        else:
            previous = self._previous_batch()
        return validate_batch(self._fields, {"embeddings": embeddings, "indexes": indexes}, previous)

    def update(self, embeddings: Tensor, labels: Tensor | None = None, *, indexes: Tensor | None = None) -> None:
        """Add a batch (nothing changes if a check fails; a batch of zero rows is a no-op).

        Args:
            embeddings: ``(B, D)`` floating, finite; D the same in every batch.
            labels: not used (PCF needs no labels); accepted, and checked for one row per embedding, so that
                PCF sits in a ``MetricCollection`` beside the label-based metrics: ``collection.update(x, y)``.
            indexes: ``(B,)`` integer dataset index of each sample: the rows are then kept (not only their
                sums) to drop DDP duplicates after the gather. Given in every batch or in none. Keyword-only, so
                that a positional second argument can never be taken for indexes.

        Raises:
            TypeError, ValueError: naming the argument and what was expected.
        """
        batch = self._check(embeddings, labels, indexes)
        x, index = batch["embeddings"], batch["indexes"]
        if x is None or x.shape[0] == 0:
            return
        if index is None:
            self._add_sums(covariance_sums(x))
            return
        cast_like_first(batch, "embeddings", self.embeddings)
        self.embeddings.append(batch["embeddings"])  # type: ignore[arg-type]
        self.indexes.append(index)

    def _add_sums(self, sums: Sums) -> None:
        count, row_sum, outer_sum = (t.to(self.count.device) for t in sums)
        if self.row_sum.numel():
            row_sum, outer_sum = self.row_sum + row_sum, self.outer_sum + outer_sum
        self.count, self.row_sum, self.outer_sum = self.count + count, row_sum, outer_sum

    def forward(
        self, embeddings: Tensor, labels: Tensor | None = None, *, indexes: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Add the batch to the state and return the value of the batch alone (torchmetrics' ``forward``).

        The batch is checked against the state first, so a bad batch leaves the state as it was.

        Raises:
            ValueError: also when the batch holds fewer than 2 distinct samples (its value is undefined).
        """
        batch = self._check(embeddings, labels, indexes)
        x, index = batch["embeddings"], batch["indexes"]
        n = 0 if x is None else x.shape[0] if index is None else int(index.unique().numel())
        if n < 2:
            raise ValueError(f"`embeddings` must hold at least 2 distinct samples in forward(), got {n}.")
        return super().forward(embeddings, labels, indexes=indexes)

    # ---- compute ------------------------------------------------------------------------------------------------

    def _collect(self) -> tuple[dict[str, Tensor | None], Tensor | None]:
        """The rows (de-duplicated by index) when ``indexes`` were given; ``{"embeddings": None}`` when streamed."""
        if len(self.embeddings):
            return super()._collect()
        return {"embeddings": None}, None

    def _gathered_sums(self) -> Sums:
        """Count, row sum and outer-product sum of every sample (call with the states gathered)."""
        rows = self._collect()[0]["embeddings"]
        sums = (self.count, self.row_sum, self.outer_sum) if rows is None else covariance_sums(rows)
        n = int(sums[0])
        if n < 2:
            raise ValueError(
                f"PCF needs at least 2 samples, got {n}: call update() with more samples first (on any process)."
            )
        return sums

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> dict[str, Tensor]:
        values = pcf_from_sums(*self._gathered_sums(), pcf_variance=self.pcf_variance)
        return {f"pcf/{r}": values[i] for i, r in enumerate(self.pcf_variance)}

    def explained_variance(self) -> Tensor:
        """Cumulative explained-variance shares: entry ``j - 1`` is the share of the ``j`` largest eigenvalues.

        Gathers the states like ``compute`` (every process must call it under DDP).

        Returns:
            ``(min(N, d),)`` float64, non-decreasing, the last entry exactly 1 (NaN when every row is equal).

        Example:
            >>> metric = PCF()
            >>> metric.update(torch.eye(4, 10))
            >>> metric.explained_variance()
            tensor([0.3333, 0.6667, 1.0000, 1.0000], dtype=torch.float64)
        """
        return _shares(*on_gathered_states(self, self._gathered_sums))

    # ---- distributed --------------------------------------------------------------------------------------------

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors, process_group: Any | None = None) -> None:
        """Check that the processes agree (streamed sums or rows, same dimension), then gather the states.

        A process without streamed sample gets zero sums of the right dimension, so the sums can be added.
        Disagreement is a ``ValueError`` raised identically on every process (no hang, state unchanged).
        """
        local = torch.tensor([self.row_sum.shape[0], len(self.embeddings) > 0], dtype=torch.long, device=self.device)
        layouts = torch.stack(
            [t.to(self.device) for t in dist_sync_fn(local, group=process_group or self.process_group)]
        )
        dims, has_rows = layouts[:, 0], layouts[:, 1] > 0
        streamed = dims > 0
        if bool(streamed.any()) and bool(has_rows.any()):
            raise ValueError(
                "`indexes` must be given on every process or on none: processes "
                f"{torch.nonzero(has_rows).flatten().tolist()} gave them, processes "
                f"{torch.nonzero(streamed).flatten().tolist()} did not."
            )
        distinct = torch.unique(dims[streamed])
        if distinct.numel() > 1:
            raise ValueError(
                f"`embeddings` must have the same number of columns on every process, got {distinct.tolist()}."
            )
        if distinct.numel() == 1 and not self.row_sum.numel():
            d = int(distinct)
            self.row_sum = torch.zeros(d, dtype=torch.float64, device=self.device)
            self.outer_sum = torch.zeros(d, d, dtype=torch.float64, device=self.device)
        super()._sync_dist(dist_sync_fn, process_group=process_group)

    def _reduce_states(self, incoming_state: dict[str, Any]) -> None:
        """``forward``: add the batch's state to the global one; empty sums (nothing streamed yet) count as zeros."""
        incoming = dict(incoming_state)
        for name in ("row_sum", "outer_sum"):
            batch_value, global_value = getattr(self, name), incoming[name]
            if not global_value.numel():
                incoming[name] = torch.zeros_like(batch_value)
            elif not batch_value.numel():
                setattr(self, name, torch.zeros_like(global_value))
        super()._reduce_states(incoming)

    # ---- plots --------------------------------------------------------------------------------------------------

    def plot(self, val: dict[str, Tensor] | list[dict[str, Tensor]] | None = None, ax: Any = None) -> Any:
        """Plot the values (torchmetrics' convention): one point per key, or one line per key over steps.

        Args:
            val: a result of ``compute()`` or a list of them (one per step); None: call ``compute()``.
            ax: a matplotlib axis (None: a new figure).

        Returns:
            ``(figure, axis)``. See :meth:`plot_curve` for the explained-variance curve.
        """
        from torchmetrics_retrieval.plotting import require_matplotlib

        require_matplotlib()
        return self._plot(val, ax)

    def plot_curve(self, ax: Any = None) -> Any:
        """Plot the cumulative explained-variance share against the number of components, marking ``pcf/{r}``.

        For each required fraction ``r``: a dashed line at the share ``r`` and a marker at the number of
        components ``n = pcf * d`` the metric reports.

        Returns:
            ``(figure or None, axis)``.

        Example:
            >>> import matplotlib; matplotlib.use("Agg")
            >>> metric = PCF(pcf_variance=(0.5, 0.9))
            >>> metric.update(torch.eye(4, 10))
            >>> fig, ax = metric.plot_curve()
            >>> ax.get_xlabel()
            'number of components'
        """
        from torchmetrics_retrieval.plotting import plot_curve

        sums = on_gathered_states(self, self._gathered_sums)
        shares = _shares(*sums).cpu()
        values = pcf_from_sums(*sums, pcf_variance=self.pcf_variance).cpu()
        d = sums[1].shape[0]
        fig, ax = plot_curve(
            torch.arange(0, shares.numel() + 1),
            torch.cat([shares.new_zeros(1), shares]),
            ax=ax,
            label="explained variance",
            xlabel="number of components",
            ylabel="cumulative share of variance",
            marker="o" if shares.numel() <= 30 else None,
        )
        for r, value in zip(self.pcf_variance, values.tolist(), strict=True):
            if math.isnan(value):
                continue
            n = round(value * d)
            ax.axhline(r, linestyle="--", color="tab:gray", linewidth=1)
            ax.scatter([n], [r], color="tab:red", zorder=3)
            ax.annotate(f"pcf/{r} = {n}/{d}", (n, r), textcoords="offset points", xytext=(4, -12), fontsize=8)
        return fig, ax


def _shares(count: Tensor, row_sum: Tensor, outer_sum: Tensor) -> Tensor:
    """Cumulative shares of the sorted covariance eigenvalues, the last exactly 1 (NaN without variance)."""
    eigenvalues = _sorted_eigenvalues(int(count), row_sum, outer_sum)
    total = eigenvalues.sum()
    shares = eigenvalues.cumsum(0) / total
    shares[-1] = 1.0 if bool(total > 0) else float("nan")
    return shares
