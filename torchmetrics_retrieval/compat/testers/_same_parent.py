"""``WithSameParentLabelTester``: each query searches only the reference items with its parent label."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.compat.testers._base import BaseTester

__all__ = ["WithSameParentLabelTester"]


class WithSameParentLabelTester(BaseTester):
    """Each query only searches its siblings: the reference items with the same parent label.

    The parent of level L is the label at level L + 1 (so the last level cannot be evaluated). As in
    pytorch-metric-learning, the accuracies of every parent group are computed on their own (query and
    reference restricted to the group, one ``get_accuracy`` call each) and averaged over the groups
    (``nan`` when a metric is ``nan`` for some group).
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
        self.label_levels = [x for x in self.label_levels_to_evaluate(query_labels) if x < query_labels.shape[1] - 1]
        if not self.label_levels:
            raise ValueError(
                "There are no valid label levels to evaluate: `label_hierarchy_level` must select a level below the "
                f"last one (labels have {query_labels.shape[1]} levels), got {self.label_hierarchy_level!r}."
            )
        includes = self.ref_includes_query(query_split_name, reference_split_names)
        for level in self.label_levels:
            parents, reference_parents = query_labels[:, level + 1], reference_labels[:, level + 1]
            per_group: defaultdict[str, list[Any]] = defaultdict(list)
            for parent in torch.unique(parents):
                in_query, in_reference = parents == parent, reference_parents == parent
                values = self.accuracy_calculator.get_accuracy(
                    query[in_query],
                    query_labels[in_query, level],
                    reference[in_reference],
                    reference_labels[in_reference, level],
                    includes,
                )
                for metric, value in values.items():
                    per_group[metric].append(value)
            self._record(accuracies, {metric: float(np.mean(v)) for metric, v in per_group.items()}, level)
        if len(self.label_levels) > 1:
            self.calculate_average_accuracies(
                accuracies, self.accuracy_calculator.get_curr_metrics(), self.label_levels
            )
