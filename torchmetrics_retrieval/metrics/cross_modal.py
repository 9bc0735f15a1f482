"""``CrossModalRetrieval``: ranking metrics between two modalities (images and captions, audio and text), both ways."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Literal, cast

import torch
from torch import Tensor
from torchmetrics import Metric

from torchmetrics_retrieval.functional._checks import check_str
from torchmetrics_retrieval.functional._cross_modal import stacked_cross_modal_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional.ranking import PrecisionMode
from torchmetrics_retrieval.functional.reduction import EmptyTargetAction
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.search import Distance, KNNBackend, SearchPrecision
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._sharded.cross_modal import check_same_dimension, missing_side
from torchmetrics_retrieval.metrics._state import FieldSpec, SampleAccumulator, check_distributed, validate_batch

__all__ = ["CrossModalRetrieval"]


class _Side(SampleAccumulator):
    """The samples of one modality (``side`` "a" or "b": the fields are named as ``update``'s arguments, so that
    errors name them): embeddings, group ids, optional dataset indexes (gathered, de-duplicated)."""

    def __init__(self, side: str, **kwargs: Any) -> None:
        self.side = side
        self._fields = (
            FieldSpec(f"embeddings_{side}", "embeddings"),
            FieldSpec(f"ids_{side}", "ids"),
            FieldSpec(f"indexes_{side}", "indexes", optional=True),
        )
        super().__init__(**kwargs)

    def update(self, batch: dict[str, Tensor | None]) -> None:
        self._store(**batch)

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> tuple[Tensor, Tensor]:
        return cast(Tensor, fields[f"embeddings_{self.side}"]), cast(Tensor, fields[f"ids_{self.side}"])


class CrossModalRetrieval(Metric):
    r"""Every ranking metric of ``EmbeddingMetrics`` between two sets A and B, in both directions.

    Each item carries the integer id of its group (an image and its five captions share one id). ``a_to_b``
    ranks all of B for every A item, relevant = same id; ``b_to_a`` the reverse. Keys: ``a_to_b/{key}`` and
    ``b_to_a/{key}`` (definitions: docs/definitions.md). With A = images and B = captions, CLIP-style
    "text retrieval recall@k" is ``a_to_b/cmc/{k}`` and "image retrieval recall@k" is ``b_to_a/cmc/{k}``.

    A batch may hold either side or both (``update(embeddings_a=..., ids_a=...)``, ``update(embeddings_b=...,
    ids_b=...)``). Under DDP, with ``indexes_a`` / ``indexes_b``, both sides are de-duplicated and ordered by
    index as in ``EmbeddingMetrics`` (ties then never depend on the number of processes).

    On one process, both directions come from one search: each A-B distance is computed once and serves both.

    Args:
        cmc_top_k: cutoffs k of cmc@k.
        precision_top_k: cutoffs k of precision@k.
        map_top_k: cutoffs k of map@k.
        recall_top_k: cutoffs k of recall@k.
        ndcg_top_k: cutoffs k of ndcg@k.
        map_at_r: MAP@R.
        r_precision: R-precision.
        mrr: mean reciprocal rank over the full ranking.
        map_full: full-ranking mean average precision (key `map`).
        minp: mean inverse negative penalty: n(q) / rank of the last relevant item.
        clustering: NMI and AMI of a k-means clustering.
        fmr_vals: FMR values in [0, 1] of fnmr@fmr and tar@far.
        eer: equal error rate over every pair.
        roc_auc: area under the ROC curve over every pair (exact).
        min_dcf_p_target: target priors p in (0, 1) of min_dcf/{p} over every pair.
        dcf_costs: costs (C_miss, C_fa) of the detection cost of min_dcf.
        fpir_vals: FPIR values in [0, 1] of open-set dir@fpir and fnir@fpir.
        pcf_variance: explained-variance fractions in [0, 1] of pcf.
        distance: distance between embeddings.
        normalize: L2-normalise the embeddings first.
        precision_mode: precision@k divides by min(k, n(q)) or by k.
        empty_target_action: what a query without a relevant item counts as.
        avg_of_avgs: average per query label first, then over labels.
        per_class: also report every ranking key per query label.
        label_comparison_fn: custom relevance fn(query_labels[:, None], gallery_labels[None]).
        confidence_level: percentile-bootstrap interval of every ranking key ({key}/ci_low, /ci_high).
        n_bootstrap: bootstrap resamples of the intervals.
        seed: seed of the bootstrap resamples.
        knn_backend: kNN backend.
        search_precision: products of the kNN search's candidate pass (values never depend on it).
        chunk_size: rows per distance block (None: from a memory budget).
        progress: progress bars (tqdm, on stderr) on the passes that take more than a second.
        approximate_index: faiss index_factory string of an approximate index (None: exact search): every
            query is then searched on that index (keys ``approx/{key}``) and ``audit_queries`` of them, drawn
            with ``seed``, exactly (keys ``audit/...``; docs/definitions.md).
        approximate_params: faiss search parameters of that index, e.g. nprobe=32 (faiss's ``ParameterSpace``
            syntax, comma-separated).
        audit_queries: queries of the exact audit of an approximate index (all of them when there are fewer).
            (``approximate_index`` is refused here for now: each direction would need its own index.)
        prefix: string put before every key.
        distributed: under DDP, ``"shard"`` (default): each process keeps its own samples of both sides; only
            ids and indexes are gathered, and blocks of queries visit every process's shard of the other side.
            ``"gather"``: every process gathers both sides and computes everything. Identical values. With a
            metric beyond the ranking (pair metrics, PCF, clustering), the sides are gathered.
        kwargs: torchmetrics' options (``process_group``, ``dist_sync_fn``, ...).

    The options (``cmc_top_k`` to ``progress``) are the fields of ``RetrievalOptions``, which checks them. Four
    defaults differ from ``retrieval_metrics``'s: image-text evaluation reports recall@1/5/10 (``cmc/{k}``: is one
    of the query's group in the top k) on cosine similarity, without ``precision_top_k`` and ``map_top_k``.

    Example:
        >>> images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> captions = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.1, 0.9]])
        >>> metric = CrossModalRetrieval(cmc_top_k=(1,))
        >>> metric.update(embeddings_a=images, ids_a=torch.tensor([0, 1]))
        >>> metric.update(embeddings_b=captions, ids_b=torch.tensor([0, 1, 1, 1]))
        >>> {key: round(float(value), 4) for key, value in metric.compute().items()}
        {'a_to_b/cmc/1': 1.0, 'b_to_a/cmc/1': 0.75}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        *,
        cmc_top_k: int | Iterable[int] = (1, 5, 10),
        precision_top_k: int | Iterable[int] = (),
        map_top_k: int | Iterable[int] = (),
        recall_top_k: int | Iterable[int] = (),
        ndcg_top_k: int | Iterable[int] = (),
        map_at_r: bool = False,
        r_precision: bool = False,
        mrr: bool = False,
        map_full: bool = False,
        minp: bool = False,
        clustering: bool = False,
        fmr_vals: float | Iterable[float] = (),
        eer: bool = False,
        roc_auc: bool = False,
        min_dcf_p_target: float | Iterable[float] = (),
        dcf_costs: tuple[float, float] = (1.0, 1.0),
        fpir_vals: float | Iterable[float] = (),
        pcf_variance: float | Iterable[float] = (),
        distance: Distance = "cosine",
        normalize: bool = False,
        precision_mode: PrecisionMode = "min_k_n",
        empty_target_action: EmptyTargetAction = "skip",
        avg_of_avgs: bool = False,
        per_class: bool = False,
        label_comparison_fn: LabelComparisonFn | None = None,
        confidence_level: float | None = None,
        n_bootstrap: int = 1000,
        seed: int = 0,
        knn_backend: KNNBackend = "auto",
        search_precision: SearchPrecision = "auto",
        chunk_size: int | None = None,
        progress: bool = False,
        approximate_index: str | None = None,
        approximate_params: str = "",
        audit_queries: int = 2000,
        prefix: str = "",
        distributed: Literal["shard", "gather"] = "shard",
        **kwargs: Unpack[MetricKwargs],
    ) -> None:
        options = RetrievalOptions.from_arguments(locals())  # first: locals() holds the parameters only
        check_str("prefix", prefix)
        check_distributed(distributed)
        if options.approximate_index is not None:  # one index per direction: not built yet
            raise ValueError(
                "`approximate_index` is not supported by CrossModalRetrieval yet, got "
                f"{options.approximate_index!r}; use retrieval_metrics with a separate gallery for each direction."
            )
        super().__init__(**kwargs)
        self.options, self.prefix, self.distributed = options, prefix, distributed
        self.side_a, self.side_b = _Side("a", **kwargs), _Side("b", **kwargs)

    def update(
        self,
        embeddings_a: Tensor | None = None,
        ids_a: Tensor | None = None,
        embeddings_b: Tensor | None = None,
        ids_b: Tensor | None = None,
        *,
        indexes_a: Tensor | None = None,
        indexes_b: Tensor | None = None,
    ) -> None:
        """Store the given side(s) of a batch; nothing is stored when a check fails.

        Args:
            embeddings_a: ``(B, D)`` embeddings of side A (given with ``ids_a``, or neither is given).
            ids_a: ``(B,)`` integer group id of each A item.
            embeddings_b: ``(B, D)`` embeddings of side B (``D`` as A's; given with ``ids_b``, or neither).
            ids_b: ``(B,)`` integer group id of each B item.
            indexes_a: optional ``(B,)`` dataset index of each A item (de-duplication under DDP).
            indexes_b: the same for the B items.
        """
        sides = []
        for side, name, embeddings, ids, indexes in (
            (self.side_a, "a", embeddings_a, ids_a, indexes_a),
            (self.side_b, "b", embeddings_b, ids_b, indexes_b),
        ):
            if (embeddings is None) != (ids is None) or (embeddings is None and indexes is not None):
                given = [f"{arg}_{name}" for arg, v in (("embeddings", embeddings), ("ids", ids)) if v is not None]
                raise ValueError(
                    f"`embeddings_{name}` and `ids_{name}` must be given together (and `indexes_{name}` only with "
                    f"them), got {given or 'neither'}" + (f" and `indexes_{name}`" if indexes is not None else "")
                    + "."
                )  # fmt: skip
            if embeddings is not None:
                batch = {f"embeddings_{name}": embeddings, f"ids_{name}": ids, f"indexes_{name}": indexes}
                validate_batch(side._fields, batch, side._previous_batch())  # both sides checked before storing
                sides.append((side, batch))
        if not sides:
            raise ValueError("`update` needs `embeddings_a`/`ids_a` or `embeddings_b`/`ids_b`, got neither.")
        for side, batch in sides:
            side.update(batch)

    def compute(self) -> dict[str, Tensor]:
        """Both directions' metrics over every accumulated sample of every process (sharded or gathered).

        If that raises, torchmetrics' sync of this (stateless) outer metric is undone first, as the sample
        accumulators do: torchmetrics would leave it synced, and every later ``compute()`` would fail.
        """
        from torchmetrics_retrieval.metrics._sharded.embedding import shardable
        from torchmetrics_retrieval.metrics._state import runs_sharded

        try:
            # the pair metrics of each direction are not sharded here: they gather
            if runs_sharded(self, self.distributed, shardable(self.options) and not self.options.needs_pairs):
                from torchmetrics_retrieval.metrics._sharded.cross_modal import sharded_cross_modal
                from torchmetrics_retrieval.metrics._sharded.faults import agreed

                with agreed(self.process_group, f"{type(self).__name__}.compute()"):  # raised on every rank
                    return self._keyed(sharded_cross_modal(self, self.process_group))
            embeddings_a, ids_a = self._side_samples(self.side_a, "A")
            embeddings_b, ids_b = self._side_samples(self.side_b, "B")
            check_same_dimension(embeddings_a, embeddings_b)
            stacked = torch.cat([embeddings_a, embeddings_b])  # the one copy of both sides the evaluation holds
            del embeddings_a, embeddings_b
            return self._keyed(stacked_cross_modal_metrics(stacked, ids_a, ids_b, self.options))
        except Exception:
            if self._is_synced and self._cache is not None:
                self.unsync()
            raise

    def _keyed(self, both: dict[str, dict[str, Tensor]]) -> dict[str, Tensor]:
        return {
            f"{self.prefix}{direction}/{key}": value
            for direction, values in both.items()
            for key, value in values.items()
        }

    @staticmethod
    def _side_samples(side: _Side, name: str) -> tuple[Tensor, Tensor]:
        try:
            with warnings.catch_warnings():  # a side another process fed is fine; one nobody fed raises below
                warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
                samples = cast(tuple[Tensor, Tensor], side.compute())
            side._computed = None  # torchmetrics keeps a computed value: here, a copy of the side's embeddings
            return samples
        except ValueError as error:
            raise missing_side(error, name) from None

    @property
    def metric_state(self) -> dict[str, Any]:
        """The states of both sides (``embeddings_a``, ``ids_a``, ..., ``indexes_b``)."""
        return {**self.side_a.metric_state, **self.side_b.metric_state}

    def reset(self) -> None:
        """Forget both sides' samples."""
        super().reset()
        self.side_a.reset()
        self.side_b.reset()

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Store the batch and return the metrics of this batch alone ({} when it holds only one side)."""
        self.update(*args, **kwargs)
        alone = CrossModalRetrieval(prefix=self.prefix, sync_on_compute=False, **self.options.as_dict())
        alone.update(*args, **kwargs)
        if not (alone.side_a._previous_batch() and alone.side_b._previous_batch()):
            return {}
        return alone.compute()
