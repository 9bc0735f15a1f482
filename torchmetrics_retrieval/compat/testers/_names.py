"""The names a tester gives its results and itself (pytorch-metric-learning's keys and record names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchmetrics_retrieval.compat.testers._preprocess import LabelLevel

__all__ = ["TesterNames"]


class TesterNames:
    """The naming methods of ``BaseTester``, from its settings (``label_levels``, ``label_hierarchy_level``,
    ``pca``, ``normalize_embeddings``, ``use_trunk_output``, ``accuracy_calculator``)."""

    label_levels: Sequence[int]
    label_hierarchy_level: LabelLevel
    pca: int | None
    normalize_embeddings: bool
    use_trunk_output: bool
    accuracy_calculator: Any

    def label_hierarchy_level_to_str(self, label_hierarchy_level: LabelLevel) -> str:
        """``2`` -> ``"2"``, ``[0, 1]`` -> ``"0_1"``."""
        if isinstance(label_hierarchy_level, (list, tuple)):
            return "_".join(str(x) for x in label_hierarchy_level)
        return str(label_hierarchy_level)

    def accuracies_keyname(self, metric: str, label_hierarchy_level: LabelLevel = 0, average: bool = False) -> str:
        """``f"{metric}_level{L}"``, or ``f"AVERAGE_{metric}"``."""
        if average:
            return f"AVERAGE_{metric}"
        several = label_hierarchy_level == "all" or isinstance(label_hierarchy_level, (list, tuple))
        if several and len(self.label_levels) == 1:
            label_hierarchy_level = self.label_levels[0]
        return f"{metric}_level{self.label_hierarchy_level_to_str(label_hierarchy_level)}"

    def description_suffixes(self, base_name: str) -> str:
        """A name describing this tester's settings (pytorch-metric-learning's record naming)."""
        if self.pca:
            base_name += f"_pca{self.pca}"
        if self.normalize_embeddings:
            base_name += "_normalized"
        if self.use_trunk_output:
            base_name += "_trunk"
        base_name += f"_{self.__class__.__name__}_level_{self.label_hierarchy_level_to_str(self.label_hierarchy_level)}"
        description = self.accuracy_calculator.description()
        return f"{base_name}_{description}" if description else base_name
