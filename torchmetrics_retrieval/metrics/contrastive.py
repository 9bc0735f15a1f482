"""``ContrastiveAccuracy``: top-k accuracy of paired views over the whole accumulated set, exact under DDP."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal, cast

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_positive_int_or_none, check_top_k, describe
from torchmetrics_retrieval.functional.contrastive import contrastive_accuracy
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._state import FieldSpec, SampleAccumulator, cast_like_first, check_distributed

__all__ = ["ContrastiveAccuracy"]


def _check_eps(eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"`eps` must be a number >= 0, got {describe(eps)}.")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"`eps` must be a finite number >= 0, got {eps}.")
    return float(eps)


class ContrastiveAccuracy(SampleAccumulator):
    r"""Top-k contrastive accuracy of paired views ``(z1[i], z2[i])``, in both directions, over every sample.

    ``update`` stores the two views of a batch; ``compute`` scores every accumulated pair of every process, as
    :func:`~torchmetrics_retrieval.functional.contrastive.contrastive_accuracy` does on all of them at once
    (``DistributedSampler``'s duplicates dropped when ``indexes`` are given): the candidates of a sample are
    the other view of *every* accumulated sample, not only of its batch.

    .. math::
        \mathrm{acc}_k = \frac{1}{2N} \sum_i \Big( [\#\{j : s(z_1^i, z_2^j) > s(z_1^i, z_2^i)\} < k]
        + [\#\{j : s(z_2^i, z_1^j) > s(z_2^i, z_1^i)\} < k] \Big)

    with :math:`s` the dot product (of L2-normalised rows when ``normalize=True``); ties with the partner
    count as hits. Computed in tiles: never an N x N matrix.

    Args:
        top_k: an int ``k >= 1`` (``compute`` returns a 0-dim tensor, so the metric can be logged with
            ``self.log("name", metric)`` in Lightning), or a tuple of them (``compute`` returns
            ``{"contrastive_accuracy/{k}": tensor}``).
        normalize: L2-normalise the rows first (cosine similarity).
        eps: lower bound of the norm in the normalisation (>= 0).
        chunk_size: side of a tile of the similarity matrix (None: the functional's default).
        distributed: under DDP, ``"shard"`` (default): each process keeps its own pairs. Only the dataset
            indexes are gathered (to drop duplicates and know which process owns each pair); then, in rounds,
            every process's next block of ``z1`` rows (with each row's similarity to its partner) is
            all-gathered, every process counts the candidates more similar than the partner among its own pairs,
            in both directions (each similarity is computed once, on one process), and the counts are summed
            across processes. Memory per process: its own pairs, one visiting block (at most 4096 rows of each
            process) and a ``chunk_size`` tile. ``"gather"``: every process gathers both views of every pair
            and computes everything (torchmetrics' usual way). Both give the value of one process, exactly; one
            process: no difference.
        kwargs: torchmetrics' options (``compute_on_cpu``, ``sync_on_compute``, ``process_group``, ...);
            any other keyword is an error.

    Example:
        >>> metric = ContrastiveAccuracy()
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
        >>> metric.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0]]))
        >>> metric.compute()
        tensor(0.5000)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    _fields = (
        FieldSpec("z1", "embeddings"),
        FieldSpec("z2", "embeddings"),
        FieldSpec("indexes", "indexes", optional=True),
    )

    z1: list[Tensor]
    z2: list[Tensor]

    def __init__(
        self,
        *,
        top_k: int | Iterable[int] = 1,
        normalize: bool = True,
        eps: float = 1e-12,
        chunk_size: int | None = None,
        distributed: Literal["shard", "gather"] = "shard",
        **kwargs: Unpack[MetricKwargs],
    ) -> None:
        single = isinstance(top_k, int) and not isinstance(top_k, bool)
        ks = check_top_k("top_k", top_k, allow_empty=False)
        if not isinstance(normalize, bool):
            raise TypeError(f"`normalize` must be a bool, got {describe(normalize)}.")
        eps = _check_eps(eps)
        check_positive_int_or_none("chunk_size", chunk_size)
        check_distributed(distributed)
        super().__init__(**kwargs)
        self.top_k: int | tuple[int, ...] = ks[0] if single else ks
        self.normalize = normalize
        self.eps = eps
        self.chunk_size = chunk_size
        self.distributed = distributed

    def update(self, z1: Tensor, z2: Tensor, indexes: Tensor | None = None) -> None:
        """Store a batch of pairs (nothing is stored if a check fails; a batch of zero rows is a no-op).

        Args:
            z1: ``(B, D)`` floating, finite: the first view; D the same in every batch (later batches are
                cast to the dtype of the first).
            z2: ``(B, D)``: the second view, row ``i`` paired with ``z1[i]``.
            indexes: ``(B,)`` integer dataset index of each pair, to drop DDP duplicates; given in every batch
                or in none.

        Raises:
            TypeError, ValueError: naming the argument and what was expected.
        """
        self._store(z1=z1, z2=z2, indexes=indexes)

    def _prepare(self, batch: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
        """Check that the views have the same shape; cast both to the dtype of the first stored batch."""
        z1, z2 = cast(Tensor, batch["z1"]), cast(Tensor, batch["z2"])
        if z2.shape != z1.shape:
            raise ValueError(f"`z2` must have the shape {tuple(z1.shape)} of `z1`, got {describe(z2)}.")
        if not len(self.z1):
            batch["z2"] = z2.to(torch.promote_types(z1.dtype, z2.dtype))
            batch["z1"] = z1.to(torch.promote_types(z1.dtype, z2.dtype))
        cast_like_first(batch, "z1", self.z1)
        cast_like_first(batch, "z2", self.z2)
        return batch

    # ---- sharded mode -------------------------------------------------------------------------------------------

    def _sharded_values(self) -> bool:
        return True

    def compute(self) -> Tensor | dict[str, Tensor]:
        """The accuracy over every pair of every process (sharded or gathered, identical values)."""
        if not self._sharding():
            return cast(Tensor | dict[str, Tensor], super().compute())
        from torchmetrics_retrieval.metrics._sharded.contrastive import sharded_contrastive
        from torchmetrics_retrieval.metrics._sharded.faults import agreed

        with agreed(self.process_group, f"{type(self).__name__}.compute()"):  # a rank's failure raised on every rank
            return sharded_contrastive(self, self.process_group)

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> Tensor | dict[str, Tensor]:
        z1, z2 = cast(Tensor, fields["z1"]), cast(Tensor, fields["z2"])
        return contrastive_accuracy(
            z1, z2, self.top_k, normalize=self.normalize, eps=self.eps, chunk_size=self.chunk_size
        )

    def plot(self, val: Tensor | dict[str, Tensor] | list[Any] | None = None, ax: Any = None) -> Any:
        """Plot the value(s) (torchmetrics' convention): a point, or a line over steps for a list of results.

        Args:
            val: a result of ``compute()`` or a list of them (one per step); None: call ``compute()``.
            ax: a matplotlib axis (None: a new figure).

        Returns:
            ``(figure, axis)``.

        Example:
            >>> import matplotlib; matplotlib.use("Agg")
            >>> metric = ContrastiveAccuracy(top_k=(1, 2))
            >>> metric.update(torch.eye(3), torch.eye(3))
            >>> fig, ax = metric.plot()
        """
        from torchmetrics_retrieval.plotting import require_matplotlib

        require_matplotlib()
        return self._plot(val, ax)
