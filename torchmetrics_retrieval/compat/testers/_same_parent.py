"""``WithSameParentLabelTester``: each query searches only the reference items with its parent label."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.compat.testers._base import BaseTester
from torchmetrics_retrieval.compat.testers._preprocess import QueryAndReference

__all__ = ["WithSameParentLabelTester"]


class WithSameParentLabelTester(BaseTester):
    """Each query only searches its siblings: the reference items with the same parent label.

    The parent of level L is the label at level L + 1 (so the last level cannot be evaluated). As in
    pytorch-metric-learning, the accuracies of every parent group are computed on their own (query and
    reference restricted to the group, one ``get_accuracy`` call each) and averaged over the groups
    (``nan`` when a metric is ``nan`` for some group).
    """

    def _levels_of(self, query_labels: Tensor) -> Sequence[int]:
        """The levels selected by ``label_hierarchy_level`` that have a parent level."""
        levels = [x for x in self.label_levels_to_evaluate(query_labels) if x < query_labels.shape[1] - 1]
        if not levels:
            raise ValueError(
                "There are no valid label levels to evaluate: `label_hierarchy_level` must select a level below the "
                f"last one (labels have {query_labels.shape[1]} levels), got {self.label_hierarchy_level!r}."
            )
        return levels

    def _level_accuracies(self, sets: QueryAndReference, level: int) -> dict[str, Any]:
        """The mean over the parent groups of each group's accuracies (query and reference within the group)."""
        query, query_labels, reference, reference_labels, includes = sets
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
        return {metric: float(np.mean(v)) for metric, v in per_group.items()}
