"""``FNMRAtFMR``: FNMR@FMR and TAR@FAR over every (query, gallery) pair of the accumulated samples, exact under DDP."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_fractions
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._progress import shown
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.search import Distance
from torchmetrics_retrieval.functional.verification import (
    DEFAULT_FMR_GRID,
    PairRequest,
    _operating_points,
    det_curve,
    fnmr_at_fmr,
)
from torchmetrics_retrieval.metrics._batch import SET_FIELDS
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._state import (
    FieldSpec,
    SampleAccumulator,
    cast_like_first,
    check_distributed,
    non_empty_fractions,
    on_gathered_states,
)

__all__ = ["FNMRAtFMR"]


class FNMRAtFMR(SampleAccumulator):
    r"""False non-match rate at given false match rates, over every pair of the accumulated embeddings.

    ``update`` stores the embeddings, labels and optional per-sample fields of a batch; ``compute``
    gathers them across processes, drops the duplicates that ``DistributedSampler`` adds (when ``indexes``
    are given) and calls :func:`~torchmetrics_retrieval.functional.verification.fnmr_at_fmr` once (under DDP with
    ``distributed="shard"``, only the small fields are gathered: the embeddings stay where they are, same values).

    Pairs (see docs/definitions.md): every ordered pair ``(q, g)`` of a query ``q`` and an item ``g`` of its
    gallery ``G(q)`` (``q`` itself, its sequence and other search groups left out); positive when the labels
    match, negative otherwise. With :math:`T_f` the ``f``-quantile of the negative distances (numpy's
    linear interpolation),

    .. math:: \mathrm{FNMR@FMR}{=}f = \frac{\#\{\text{positive pairs with distance} \ge T_f\}}{\#\text{positive pairs}},
        \qquad \mathrm{TAR@FAR}{=}f = 1 - \mathrm{FNMR@FMR}{=}f.

    The value is exact and no pair is materialised (two streaming passes over the distance blocks), so
    N = 60k samples (3.6e9 pairs) fit in a few hundred MB besides the embeddings. NaN with a warning when
    there is no positive or no negative pair.

    Args:
        fmr_vals: FMR values in [0, 1] of fnmr@fmr and tar@far: keys ``fnmr@fmr/{f}`` and ``tar@far/{f}`` (at
            least one value unless ``eer``, ``roc_auc`` or ``min_dcf_p_target`` is given).
        eer: equal error rate over every pair, key ``eer``.
        roc_auc: area under the ROC curve over every pair (exact), key ``roc_auc`` (one more pass).
        min_dcf_p_target: target priors p in (0, 1) of min_dcf/{p} over every pair, the minimum normalised
            detection cost.
        dcf_costs: costs (C_miss, C_fa) of the detection cost of min_dcf, positive.
        distance: distance between embeddings: ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"`` or ``"dot"``.
        label_comparison_fn: custom relevance fn(query_labels[:, None], gallery_labels[None]) (must be picklable
            to pickle or clone the metric).
        chunk_size: rows per distance block (None: from a memory budget).
        progress: progress bars (tqdm, on stderr) on the passes that take more than a second (of ``compute``).
        distributed: under DDP, ``"shard"`` (default): each process keeps its own samples; only the small fields
            (labels, ids, dataset indexes) are gathered and the passes over the pairs move blocks of rows
            between processes (each pair computed on one process, the histograms summed), with the values of
            one process; ``roc_auc`` too (each process places its pairs' negatives among every positive, the
            counts summed). ``"gather"``: every process gathers every sample and computes everything.
            ``operating_points``, ``det_curve`` and ``plot_curve`` always gather.
        kwargs: torchmetrics' options (``compute_on_cpu``, ``sync_on_compute``, ``process_group``, ...);
            any other keyword is an error.

    ``higher_is_better`` is False (it refers to FNMR; TAR@FAR, also returned, is better when higher). States
    hold every embedding and are not saved in ``state_dict`` unless ``metric.persistent(True)``.

    Example:
        >>> import torch
        >>> metric = FNMRAtFMR(fmr_vals=(0.1, 0.5))
        >>> metric.update(torch.tensor([[0.0], [1.0]]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([[3.0], [7.0]]), torch.tensor([1, 1]))
        >>> metric.compute()  # positive distances (1, 1, 4, 4), negative (2, 2, 3, 3, 6, 6, 7, 7)
        {'fnmr@fmr/0.1': tensor(0.5000), 'fnmr@fmr/0.5': tensor(0.),
         'tar@far/0.1': tensor(0.5000), 'tar@far/0.5': tensor(1.)}
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    _fields = (
        *SET_FIELDS,
        FieldSpec("indexes", "indexes", optional=True),
    )

    embeddings: list[Tensor]
    labels: list[Tensor]

    def __init__(
        self,
        *,
        fmr_vals: float | Iterable[float] = (0.1,),
        eer: bool = False,
        roc_auc: bool = False,
        min_dcf_p_target: float | Iterable[float] = (),
        dcf_costs: tuple[float, float] = (1.0, 1.0),
        distance: Distance = "euclidean",
        label_comparison_fn: LabelComparisonFn | None = None,
        chunk_size: int | None = None,
        progress: bool = False,
        distributed: Literal["shard", "gather"] = "shard",
        **kwargs: Unpack[MetricKwargs],
    ) -> None:
        options = RetrievalOptions.from_arguments(locals())  # first: locals() holds the parameters only
        check_distributed(distributed)
        if not (options.eer or options.min_dcf_p_target or options.roc_auc):  # then at least one FMR value
            non_empty_fractions("fmr_vals", options.fmr_vals)
        super().__init__(**kwargs)
        self.options = options  # the options it does not take keep their defaults, unused
        self.distributed = distributed
        self._gather_always = False  # set while operating_points / det_curve gather the states

    def update(
        self,
        embeddings: Tensor,
        labels: Tensor,
        is_query: Tensor | None = None,
        is_gallery: Tensor | None = None,
        sequence_ids: Tensor | None = None,
        search_groups: Tensor | None = None,
        indexes: Tensor | None = None,
    ) -> None:
        """Store a batch (nothing is stored if a check fails; a batch of zero rows is a no-op).

        Args:
            embeddings: ``(B, D)`` floating, finite; D the same in every batch (later batches are cast to
                the dtype of the first).
            labels: ``(B,)`` or ``(B, L)``, any real dtype; shape and dtype the same in every batch.
            is_query: ``(B,)`` bool, which samples are queries; a missing mask means all True (leave-one-out:
                every sample is paired with every other one, in both orders).
            is_gallery: ``(B,)`` bool, which samples are gallery items (missing: all True).
            sequence_ids: ``(B,)`` integer; pairs within a sequence are left out.
            search_groups: ``(B,)`` integer; only pairs within a group are formed.
            indexes: ``(B,)`` integer dataset index of each sample, to drop DDP duplicates and fix the order.

        An optional field given in one batch must be given in every batch (and vice versa).

        Raises:
            TypeError, ValueError: naming the argument and what was expected.
        """
        self._store(
            embeddings=embeddings,
            labels=labels,
            is_query=is_query,
            is_gallery=is_gallery,
            sequence_ids=sequence_ids,
            search_groups=search_groups,
            indexes=indexes,
        )

    def _prepare(self, batch: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
        cast_like_first(batch, "embeddings", self.embeddings)
        return batch

    def _pair_inputs(self, fields: dict[str, Tensor | None]) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """Embeddings (half precision as held), labels and the keyword arguments of the functional calls."""
        embeddings = cast(Tensor, fields["embeddings"])  # never None: _collect raises first
        options: dict[str, Any] = {
            name: fields[name] for name in ("is_query", "is_gallery", "sequence_ids", "search_groups")
        }
        o = self.options
        options.update(distance=o.distance, label_comparison_fn=o.label_comparison_fn, chunk_size=o.chunk_size)
        return embeddings, cast(Tensor, fields["labels"]), options

    # ---- sharded mode -------------------------------------------------------------------------------------------

    def _sharded_values(self) -> bool:
        """Not while a curve gathers the states."""
        return not self._gather_always

    def compute(self) -> dict[str, Tensor]:
        """The values over every sample of every process (sharded or gathered, identical values)."""
        if not self._sharding():
            return cast(dict[str, Tensor], super().compute())
        from torchmetrics_retrieval.metrics._sharded.faults import agreed
        from torchmetrics_retrieval.metrics._sharded.pairs import sharded_pair_compute

        # a rank's failure raised on every rank
        with shown(self.options.progress), agreed(self.process_group, f"{type(self).__name__}.compute()"):
            return sharded_pair_compute(self, self.process_group, *PairRequest.of(self.options))

    def _gathered_fields(self) -> dict[str, Tensor | None]:
        """The samples of every process (gathered whatever ``distributed`` says)."""
        self._gather_always = True
        try:
            return on_gathered_states(self, self._collect)[0]
        finally:
            self._gather_always = False

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> dict[str, Tensor]:
        embeddings, labels, options = self._pair_inputs(fields)
        o = self.options
        rates: dict[str, Any] = {
            "eer": o.eer,
            "min_dcf_p_target": o.min_dcf_p_target,
            "dcf_costs": o.dcf_costs,
            "roc_auc": o.roc_auc,
        }
        with shown(o.progress):
            return fnmr_at_fmr(embeddings, labels, fmr_vals=o.fmr_vals, **rates, **options)

    def operating_points(self) -> dict[str, Tensor]:
        """``{"eer": (FMR, FNMR), "min_dcf/{p}": (FMR, FNMR)}``: the points of the DET curve where the EER and each
        minimum detection cost are reached (empty when neither was asked for); ``plot_curve`` marks them.

        Example:
            >>> import torch
            >>> metric = FNMRAtFMR(fmr_vals=(), eer=True, min_dcf_p_target=(0.5,))
            >>> metric.update(torch.tensor([[0.0], [2.0], [3.0], [7.0], [10.0]]), torch.tensor([0, 0, 1, 1, 2]))
            >>> {key: point.tolist() for key, point in metric.operating_points().items()}
            {'eer': [0.375, 0.5], 'min_dcf/0.5': [0.375, 0.0]}
        """
        request = PairRequest.of(self.options).rates
        if not (request.eer or request.p_targets):
            return {}
        fields = self._gathered_fields()
        embeddings, labels, options = self._pair_inputs(fields)
        return _operating_points(embeddings, labels, request, **options)

    def det_curve(self, fmr_grid: Iterable[float] = DEFAULT_FMR_GRID) -> tuple[Tensor, Tensor, Tensor]:
        """The DET curve of the accumulated pairs: FNMR at every FMR of ``fmr_grid``.

        Gathers the samples like ``compute`` (every process must call it under DDP) and calls
        :func:`~torchmetrics_retrieval.functional.verification.det_curve` (two more passes over the pairs).

        Returns:
            ``(fmr, fnmr, thresholds)``, three ``(len(fmr_grid),)`` float64 tensors; ``(fmr, 1 - fnmr)`` is the
            ROC curve (TAR against FAR).

        Raises:
            ValueError: no sample on any process, an FMR outside [0, 1].
        """
        grid = check_fractions("fmr_grid", fmr_grid)
        fields = self._gathered_fields()
        embeddings, labels, options = self._pair_inputs(fields)
        return det_curve(embeddings, labels, fmr_grid=grid, **options)

    def plot(self, val: dict[str, Tensor] | list[dict[str, Tensor]] | None = None, ax: Any = None) -> Any:
        """Plot the values (torchmetrics' convention): one point per key, or one line per key over steps.

        Args:
            val: a result of ``compute()`` or a list of them (one per step); None: call ``compute()``.
            ax: a matplotlib axis (None: a new figure).

        Returns:
            ``(figure, axis)``. See :meth:`plot_curve` for the DET curve.
        """
        from torchmetrics_retrieval.plotting import require_matplotlib

        require_matplotlib()
        return self._plot(val, ax)

    def plot_curve(self, ax: Any = None, *, fmr_grid: Iterable[float] = DEFAULT_FMR_GRID) -> Any:
        """Plot the DET curve (FNMR against FMR, log-scaled FMR) with the values at ``fmr_vals`` marked.

        Args:
            ax: a matplotlib axis (None: a new figure).
            fmr_grid: FMR values of the curve; the metric's ``fmr_vals`` are added to it.

        Returns:
            ``(figure or None, axis)``.

        Example:
            >>> import matplotlib; matplotlib.use("Agg")
            >>> import torch
            >>> metric = FNMRAtFMR(fmr_vals=(0.1, 0.5))
            >>> metric.update(torch.tensor([[0.0], [1.0], [3.0], [7.0]]), torch.tensor([0, 0, 1, 1]))
            >>> fig, ax = metric.plot_curve()
            >>> ax.get_xlabel()
            'FMR (false match rate)'
        """
        from torchmetrics_retrieval.plotting import plot_curve

        grid = sorted(set(check_fractions("fmr_grid", fmr_grid)) | set(self.options.fmr_vals))
        fmr, fnmr, _ = self.det_curve(grid)
        fig, ax = plot_curve(fmr, fnmr, ax=ax, label="DET curve", xlabel="FMR (false match rate)", ylabel="FNMR")
        marked = fnmr.cpu()[[grid.index(f) for f in self.options.fmr_vals]]
        if self.options.fmr_vals:
            ax.scatter(list(self.options.fmr_vals), marked.numpy(), color="tab:red", zorder=3, label="fnmr@fmr")
        for f, value in zip(self.options.fmr_vals, marked.tolist(), strict=True):
            ax.annotate(f"{value:.3g} @ {f}", (f, value), textcoords="offset points", xytext=(4, 4), fontsize=8)
        for key, (point_fmr, point_fnmr) in self.operating_points().items():  # where eer / min_dcf are reached
            ax.scatter([float(point_fmr)], [float(point_fnmr)], marker="D", zorder=3, label=key)
        if min(grid) > 0:
            ax.set_xscale("log")
        ax.legend()
        return fig, ax
