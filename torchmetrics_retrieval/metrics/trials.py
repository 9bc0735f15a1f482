"""``TrialMetrics``: verification values of a trial list given by dataset indexes, exact under DDP."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_choice, check_positive_int_or_none, describe
from torchmetrics_retrieval.functional._search.types import DISTANCES, Distance
from torchmetrics_retrieval.functional._trials import TrialRequest, check_trials
from torchmetrics_retrieval.functional.trials import FarRule, trial_metrics
from torchmetrics_retrieval.metrics._batch import FieldSpec
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._state import SampleAccumulator, cast_like_first, check_distributed

__all__ = ["TrialMetrics"]


def _checked_trials(trials: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The trial list as CPU ``(enrol_index, test_index, is_target)``: non-negative integer dataset indexes."""
    if isinstance(trials, (tuple, list)) and len(trials) == 3:
        for part, value in zip(("enrol_index", "test_index"), trials[:2], strict=True):
            if isinstance(value, Tensor) and value.dtype != torch.bool and not value.is_floating_point():
                if not value.is_complex() and value.numel() and int(value.min()) < 0:
                    bad = int(torch.nonzero(value < 0)[0])
                    raise ValueError(
                        f"`trials` ({part}) must hold dataset indexes >= 0, got {int(value[bad])} at position {bad}."
                    )
    parts = trials[:2] if isinstance(trials, (tuple, list)) and len(trials) == 3 else ()
    largest = max((int(p.max()) for p in parts if isinstance(p, Tensor) and p.numel() and p.ndim == 1), default=0)
    enrol, test, flags = check_trials(trials, largest + 1, torch.device("cpu"))
    return enrol.clone(), test.clone(), flags.cpu().clone()


class TrialMetrics(SampleAccumulator):
    r"""Verification values of a fixed trial list over the accumulated embeddings, found by their dataset indexes.

    The trial list is given once, as dataset indexes: trial ``t`` compares the samples of dataset index
    ``enrol_index[t]`` and ``test_index[t]``. ``update`` stores the embeddings of a batch with their dataset
    indexes (the duplicates ``DistributedSampler`` adds are dropped by index); ``compute`` returns
    :func:`~torchmetrics_retrieval.functional.trials.trial_metrics` of the accumulated samples with the trials mapped
    to their rows: a trial's score is ``-distance`` between its two embeddings.

    Args:
        trials: ``(enrol_index, test_index, is_target)``: two ``(T,)`` integer tensors of dataset indexes (>= 0) and a
            ``(T,)`` bool tensor; at least one target and one non-target trial.
        distance: ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"`` or ``"dot"``.
        fmr_vals: FAR (= FMR) values in [0, 1]: keys ``fnmr@fmr/{f}`` and ``tar@far/{f}`` (at least one value
            unless another value is asked for).
        eer: also return ``eer``, the equal error rate.
        min_dcf_p_target: target priors p in (0, 1): also return ``min_dcf/{p}``.
        dcf_costs: ``(C_miss, C_fa)``, positive, of ``min_dcf`` and ``act_dcf``.
        roc_auc: also return ``roc_auc``.
        cllr: also return ``cllr`` and ``min_cllr`` (bits; meaningful on calibrated scores only).
        act_dcf_p_target: target priors p in (0, 1): also return ``act_dcf/{p}`` (calibrated scores only).
        far_rule: ``"exact"`` or ``"nearest_roc_point"``, as
            :func:`~torchmetrics_retrieval.functional.trials.score_metrics`.
        chunk_size: trials whose scores are computed at once (default 65536).
        distributed: under DDP, ``"shard"`` (default): each process keeps its embeddings, only the dataset indexes
            are gathered; each trial is scored by the process that holds its enrolment sample (the test rows it
            lacks are sent by their owners), the scores gathered in trial order, and the values computed on every
            process from them: the values of one process. ``"gather"``: every process gathers every sample.
        kwargs: torchmetrics' options (``compute_on_cpu``, ``sync_on_compute``, ``process_group``, ...);
            any other keyword is an error.

    Raises:
        TypeError, ValueError: a malformed trial list or option, naming it.

    States hold every embedding and are not saved in ``state_dict`` unless ``metric.persistent(True)``.

    Example:
        >>> import torch
        >>> enrol, test = torch.tensor([10, 10, 12, 11]), torch.tensor([11, 12, 13, 13])
        >>> trials = (enrol, test, torch.tensor([True, False, True, False]))
        >>> metric = TrialMetrics(trials, fmr_vals=0.5, eer=True)
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.8, 0.6]]), torch.tensor([10, 11]))
        >>> metric.update(torch.tensor([[0.0, 1.0], [-0.6, 0.8], [1.0, 0.0]]), torch.tensor([12, 13, 10]))
        >>> metric.compute()  # index 10 given twice (a padded duplicate): counted once
        {'fnmr@fmr/0.5': tensor(0.), 'tar@far/0.5': tensor(1.), 'eer': tensor(0.)}
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    _fields = (FieldSpec("embeddings", "embeddings"), FieldSpec("indexes", "indexes"))

    embeddings: list[Tensor]
    indexes: list[Tensor]

    def __init__(
        self,
        trials: tuple[Tensor, Tensor, Tensor],
        *,
        distance: Distance = "cosine",
        fmr_vals: float | Iterable[float] = (0.1,),
        eer: bool = False,
        min_dcf_p_target: float | Iterable[float] = (),
        dcf_costs: tuple[float, float] = (1.0, 1.0),
        roc_auc: bool = False,
        cllr: bool = False,
        act_dcf_p_target: float | Iterable[float] = (),
        far_rule: FarRule = "exact",
        chunk_size: int | None = None,
        distributed: Literal["shard", "gather"] = "shard",
        **kwargs: Unpack[MetricKwargs],
    ) -> None:
        request = TrialRequest.checked(
            fmr_vals, eer, min_dcf_p_target, dcf_costs, roc_auc, cllr, act_dcf_p_target, far_rule
        )
        check_choice("distance", distance, DISTANCES)
        check_positive_int_or_none("chunk_size", chunk_size)
        check_distributed(distributed)
        if (
            not (request.fmr_vals or request.rates.eer or request.rates.p_targets or roc_auc or cllr)
            and not request.act_dcf_p_target
        ):
            raise ValueError(
                "TrialMetrics needs a value to report: give `fmr_vals`, `eer`, `min_dcf_p_target`, `roc_auc`, `cllr` "
                f"or `act_dcf_p_target` (got fmr_vals={fmr_vals!r} and nothing else)."
            )
        self.trials = _checked_trials(trials)
        super().__init__(**kwargs)
        self.request = request
        self.distance = distance
        self.chunk_size = chunk_size
        self.distributed = distributed
        self.value_options: dict[str, Any] = {
            "distance": distance,
            "fmr_vals": request.fmr_vals,
            "eer": request.rates.eer,
            "min_dcf_p_target": request.rates.p_targets,
            "dcf_costs": request.rates.costs,
            "roc_auc": request.roc_auc,
            "cllr": request.cllr,
            "act_dcf_p_target": request.act_dcf_p_target,
            "far_rule": request.far_rule,
            "chunk_size": chunk_size,
        }

    def update(self, embeddings: Tensor, indexes: Tensor) -> None:
        """Store a batch (nothing is stored if a check fails; a batch of zero rows is a no-op).

        Args:
            embeddings: ``(B, D)`` floating, finite; D the same in every batch (later batches are cast to the dtype
                of the first).
            indexes: ``(B,)`` integer dataset index of each sample (the indexes of the trial list).

        Raises:
            TypeError, ValueError: naming the argument and what was expected.
        """
        self._store(embeddings=embeddings, indexes=indexes)

    def forward(self, *args: Any, **kwargs: Any) -> None:
        """Store the batch as ``update`` does and return None: a batch rarely holds both samples of every trial, so
        it has no value of its own (torchmetrics' ``forward`` would compute one, and fail)."""
        self.update(*args, **kwargs)

    def _prepare(self, batch: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
        cast_like_first(batch, "embeddings", self.embeddings)
        return batch

    def trial_rows(self, indexes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The trials as rows of the de-duplicated set whose sorted distinct dataset indexes are ``indexes``.

        Raises:
            ValueError: a trial names a dataset index no process passed to ``update``.
        """
        rows = []
        for part, value in zip(("enrol_index", "test_index"), self.trials[:2], strict=True):
            value = value.to(indexes.device)
            position = torch.searchsorted(indexes, value).clamp_(max=max(indexes.numel() - 1, 0))
            missing = indexes[position] != value
            if bool(missing.any()):
                bad = int(torch.nonzero(missing)[0])
                raise ValueError(
                    f"`trials` ({part}) names dataset index {int(value[bad])} (trial {bad}), which no process passed "
                    f"to update(); {int(missing.sum())} trial(s) name an index never updated."
                )
            rows.append(position)
        return rows[0], rows[1], self.trials[2].to(indexes.device)

    # ---- compute --------------------------------------------------------------------------------------------------

    def _sharded_values(self) -> bool:
        return True

    def compute(self) -> dict[str, Tensor]:
        """The values over every sample of every process (sharded or gathered, identical values)."""
        if not self._sharding():
            return cast(dict[str, Tensor], super().compute())
        from torchmetrics_retrieval.metrics._sharded.faults import agreed
        from torchmetrics_retrieval.metrics._sharded.trials import sharded_trial_compute

        with agreed(self.process_group, f"{type(self).__name__}.compute()"):  # a rank's failure raised on every rank
            return sharded_trial_compute(self, self.process_group)

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> dict[str, Tensor]:
        embeddings = cast(Tensor, fields["embeddings"])
        if indexes is None:  # pragma: no cover - `indexes` is a required field
            raise ValueError(f"`indexes` must be given, got {describe(indexes)}.")
        return trial_metrics(embeddings, self.trial_rows(indexes), **self.value_options)
