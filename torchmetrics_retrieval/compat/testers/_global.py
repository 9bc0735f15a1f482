"""The testers that search every reference embedding: ``GlobalEmbeddingSpaceTester`` and its two-stream variant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.testers._base import BaseTester
from torchmetrics_retrieval.compat.testers._preprocess import QueryAndReference

__all__ = ["GlobalEmbeddingSpaceTester", "GlobalTwoStreamEmbeddingSpaceTester"]


class GlobalEmbeddingSpaceTester(BaseTester):
    """Nearest neighbours searched among every reference embedding.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from torchmetrics_retrieval.compat.pml import AccuracyCalculator
        >>> x = torch.tensor([[0.0, 1.0], [0.1, 1.0], [1.0, 0.0], [1.0, 0.1], [0.2, 1.0]])
        >>> data = TensorDataset(x, torch.tensor([0, 0, 1, 1, 1]))
        >>> calculator = AccuracyCalculator(include=("precision_at_1",), device="cpu")
        >>> tester = GlobalEmbeddingSpaceTester(
        ...     dataloader_num_workers=0, data_device="cpu", accuracy_calculator=calculator
        ... )
        >>> dict(tester.test({"val": data}, 0, torch.nn.Identity()))
        {'val': {'epoch': 0, 'precision_at_1_level0': 0.6}}
    """

    def _level_accuracies(self, sets: QueryAndReference, level: int) -> dict[str, Any]:
        """The calculator's accuracies of every query against the whole reference set at this level."""
        query, query_labels, reference, reference_labels, includes = sets
        return self.accuracy_calculator.get_accuracy(
            query, query_labels[:, level], reference, reference_labels[:, level], includes
        )


class GlobalTwoStreamEmbeddingSpaceTester(GlobalEmbeddingSpaceTester):
    """Two-stream data: every sample is ``(anchor, positive, label)``; anchors query, positives are the gallery.

    Only the default ``splits_to_eval`` is supported (each split is its own query and reference). Anchors
    and positives are normalised (and reduced by PCA) separately; a query is never in the reference set.
    """

    def compute_all_embeddings(  # type: ignore[override]
        self, dataloader: torch.utils.data.DataLoader, trunk_model: torch.nn.Module, embedder_model: torch.nn.Module
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Anchor embeddings, positive embeddings and 2-D labels of every batch."""
        anchors, positives, labels = self._embed_batches(dataloader, trunk_model, embedder_model)
        return anchors, positives, labels

    def _inputs_and_label(self, batch: Any) -> tuple[tuple[Any, ...], Any]:
        """A batch is ``(anchor, positive, label)``: two inputs to embed."""
        anchor, positive, label = self.data_and_label_getter(batch)
        return (anchor, positive), label

    def _finished_embeddings(self, computed: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """Anchors then positives (each after PCA / normalisation), and their labels twice."""
        anchors, positives, labels = computed
        return torch.cat([self.maybe_normalize(anchors), self.maybe_normalize(positives)]), torch.cat([labels, labels])

    def set_reference_and_query(
        self,
        embeddings_and_labels: dict[str, tuple[Tensor, Tensor]],
        query_split_name: str,
        reference_split_names: Sequence[str],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Anchors (first half) as queries, positives (second half) as the reference set."""
        if list(reference_split_names) != [query_split_name]:
            raise ValueError(
                f"{self.__class__.__name__} does not support different reference and query splits, got "
                f"{query_split_name!r} -> {list(reference_split_names)!r}."
            )
        embeddings, labels = embeddings_and_labels[query_split_name]
        half = embeddings.shape[0] // 2
        return embeddings[:half], labels[:half], embeddings[half:], labels[:half]

    def ref_includes_query(self, query_split_name: str, reference_split_names: Sequence[str]) -> bool:
        """Never: the positives are other samples."""
        return False
