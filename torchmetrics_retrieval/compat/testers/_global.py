"""The testers that search every reference embedding: ``GlobalEmbeddingSpaceTester`` and its two-stream variant."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.testers._base import BaseTester

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

    def do_knn_and_accuracies(
        self,
        accuracies: dict[str, Any],
        embeddings_and_labels: dict[str, tuple[Tensor, Tensor]],
        query_split_name: str,
        reference_split_names: Sequence[str],
    ) -> None:
        query, query_labels, reference, reference_labels = self.set_reference_and_query(
            embeddings_and_labels, query_split_name, reference_split_names
        )
        self.label_levels = self.label_levels_to_evaluate(query_labels)
        includes = self.ref_includes_query(query_split_name, reference_split_names)
        for level in self.label_levels:
            values = self.accuracy_calculator.get_accuracy(
                query, query_labels[:, level], reference, reference_labels[:, level], includes
            )
            self._record(accuracies, values, level)
        if len(self.label_levels) > 1:
            self.calculate_average_accuracies(
                accuracies, self.accuracy_calculator.get_curr_metrics(), self.label_levels
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
        anchors, positives, labels = [], [], []
        with torch.no_grad():
            for batch in dataloader:
                anchor, positive, label = self.data_and_label_getter(batch)
                anchors.append(self.get_embeddings_for_eval(trunk_model, embedder_model, anchor).to(self.data_device))
                positives.append(
                    self.get_embeddings_for_eval(trunk_model, embedder_model, positive).to(self.data_device)
                )
                labels.append(self.process_labels(label).to(self.data_device))
        if not anchors:
            raise ValueError("`dataset` must not be empty.")
        return torch.cat(anchors), torch.cat(positives), torch.cat(labels)

    def get_all_embeddings(
        self,
        dataset: Any,
        trunk_model: torch.nn.Module,
        embedder_model: torch.nn.Module | None = None,
        collate_fn: Callable[..., Any] | None = None,
        eval: bool = True,
        return_as_numpy: bool = False,
    ) -> tuple[Any, Any]:
        """Anchors then positives (each after PCA / normalisation), and their labels twice."""
        embedder_model = torch.nn.Identity() if embedder_model is None else embedder_model
        if eval:
            trunk_model.eval()
            embedder_model.eval()
        anchors, positives, labels = self.compute_all_embeddings(
            self._dataloader(dataset, collate_fn), trunk_model, embedder_model
        )
        embeddings = torch.cat([self.maybe_normalize(anchors), self.maybe_normalize(positives)])
        labels = torch.cat([labels, labels])
        if return_as_numpy:
            return embeddings.cpu().numpy(), labels.cpu().numpy()
        return embeddings, labels

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
