"""``BaseTester``: embedding the datasets, naming the results, choosing splits and label levels."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.compat.pml import AccuracyCalculator
from torchmetrics_retrieval.compat.testers._names import TesterNames
from torchmetrics_retrieval.compat.testers._preprocess import (
    LabelLevel,
    LabelRanks,
    QueryAndReference,
    SplitsToEval,
    as_numpy,
    check_level,
    default_device,
    identity,
    pca_projection,
    standardise,
)

__all__ = ["BaseTester"]

LOGGER = logging.getLogger(__name__)


class BaseTester(TesterNames):
    """Shared machinery of the testers (pytorch-metric-learning's ``BaseTester``).

    Args:
        normalize_embeddings: L2-normalise the embeddings (after PCA).
        use_trunk_output: use the trunk's output and ignore the embedder.
        batch_size: samples per batch when embedding a dataset.
        dataloader_num_workers: worker processes of the data loader.
        pca: reduce the (standardised) embeddings to this many dimensions, or None.
        data_device: where the inputs and the embeddings go (default: CUDA if available, else CPU).
        dtype: cast the inputs to this dtype, or None.
        data_and_label_getter: ``fn(batch) -> (data, labels)`` (default: the batch is that pair).
        label_hierarchy_level: which column of 2-D labels to evaluate: an int, a list of ints, or ``"all"``.
        end_of_testing_hook: ``fn(tester)`` called at the end of :meth:`test`.
        dataset_labels: every label of the data (needed with ``set_min_label_to_zero``).
        set_min_label_to_zero: replace labels by their rank among ``dataset_labels`` (per level).
        accuracy_calculator: the metrics (default: ``compat.pml.AccuracyCalculator()``).
        visualizer: an object with ``fit_transform(embeddings) -> (N, 2)``, or None.
        visualizer_hook: ``fn(visualizer, reduced, labels, split_name, keyname, epoch)`` per split and level.
    """

    def __init__(
        self,
        normalize_embeddings: bool = True,
        use_trunk_output: bool = False,
        batch_size: int = 32,
        dataloader_num_workers: int = 2,
        pca: int | None = None,
        data_device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        data_and_label_getter: Callable[[Any], Any] | None = None,
        label_hierarchy_level: LabelLevel = 0,
        end_of_testing_hook: Callable[[BaseTester], Any] | None = None,
        dataset_labels: Any = None,
        set_min_label_to_zero: bool = False,
        accuracy_calculator: Any = None,
        visualizer: Any = None,
        visualizer_hook: Callable[..., Any] | None = None,
    ) -> None:
        if pca is not None and (isinstance(pca, bool) or int(pca) < 1):
            raise ValueError(f"`pca` must be None or an int >= 1, got {pca!r}.")
        if set_min_label_to_zero and dataset_labels is None:
            raise ValueError("`dataset_labels` must be given when `set_min_label_to_zero` is True, got None.")
        check_level(label_hierarchy_level)
        self.normalize_embeddings = normalize_embeddings
        self.pca = int(pca) if pca else None
        self.use_trunk_output = use_trunk_output
        self.batch_size = int(batch_size)
        self.data_device = default_device() if data_device is None else torch.device(data_device)
        self.dtype = dtype
        self.dataloader_num_workers = dataloader_num_workers
        self.data_and_label_getter = identity if data_and_label_getter is None else data_and_label_getter
        self.label_hierarchy_level = label_hierarchy_level
        self.end_of_testing_hook = end_of_testing_hook
        self.dataset_labels = dataset_labels
        self.set_min_label_to_zero = set_min_label_to_zero
        self.accuracy_calculator = AccuracyCalculator() if accuracy_calculator is None else accuracy_calculator
        self.visualizer = visualizer
        self.original_visualizer_hook = visualizer_hook
        self.label_mapper = LabelRanks(dataset_labels) if set_min_label_to_zero else None
        self.reference_split_names: dict[str, list[str]] = {}
        self.label_levels: Sequence[int] = []
        self.all_accuracies: defaultdict[str, dict[str, Any]] = defaultdict(dict)

    # --- embeddings ---------------------------------------------------------------------------------------------------

    def visualizer_hook(self, *args: Any, **kwargs: Any) -> None:
        """Call the user's ``visualizer_hook`` if there is one."""
        if self.original_visualizer_hook is not None:
            self.original_visualizer_hook(*args, **kwargs)

    def maybe_normalize(self, embeddings: Tensor) -> Tensor:
        """PCA of the standardised embeddings (``pca``), then L2 normalisation (``normalize_embeddings``)."""
        if self.pca:
            if self.pca > embeddings.shape[1]:
                raise ValueError(f"`pca` must be at most the embedding size {embeddings.shape[1]}, got {self.pca}.")
            embeddings = pca_projection(standardise(embeddings), self.pca)
        if self.normalize_embeddings:
            embeddings = torch.nn.functional.normalize(embeddings, dim=1)
        return embeddings

    def process_labels(self, labels: Any) -> Tensor:
        """A batch of labels as a 2-D tensor (one column per hierarchy level), ranked if asked."""
        if isinstance(labels, (list, tuple)):
            if all(isinstance(x, str) for x in labels):
                array = np.asarray(labels)[:, None]
            else:
                array = np.stack([np.asarray(as_numpy(x)) for x in labels], axis=1)
        else:
            array = np.asarray(as_numpy(labels))
            array = array[:, None] if array.ndim == 1 else array
        if self.label_mapper is not None:
            array = np.stack([self.label_mapper(array[:, h], h) for h in range(array.shape[1])], axis=1)
        if array.dtype.kind in "USO":
            raise TypeError(f"labels must be numbers; use `set_min_label_to_zero=True` for {array.dtype} labels.")
        return torch.as_tensor(array)

    def get_embeddings_for_eval(
        self, trunk_model: torch.nn.Module, embedder_model: torch.nn.Module, input_imgs: Any
    ) -> Tensor:
        """The model's embeddings of one batch of inputs."""
        if isinstance(input_imgs, Tensor):
            input_imgs = input_imgs.to(self.data_device)
            if self.dtype is not None:
                input_imgs = input_imgs.to(self.dtype)
        trunk_output = trunk_model(input_imgs)
        return trunk_output if self.use_trunk_output else embedder_model(trunk_output)

    def compute_all_embeddings(
        self, dataloader: torch.utils.data.DataLoader, trunk_model: torch.nn.Module, embedder_model: torch.nn.Module
    ) -> tuple[Tensor, Tensor]:
        """Embeddings ``(N, D)`` and 2-D labels ``(N, levels)`` of every batch, in order."""
        embeddings, labels = self._embed_batches(dataloader, trunk_model, embedder_model)
        return embeddings, labels

    def _inputs_and_label(self, batch: Any) -> tuple[tuple[Any, ...], Any]:
        """The inputs to embed and the labels of one batch: here ``data_and_label_getter``'s pair (the two-stream
        tester embeds two inputs per sample)."""
        data, label = self.data_and_label_getter(batch)
        return (data,), label

    def _embed_batches(
        self, dataloader: torch.utils.data.DataLoader, trunk_model: torch.nn.Module, embedder_model: torch.nn.Module
    ) -> list[Tensor]:
        """Every input of ``_inputs_and_label`` embedded, then the 2-D labels, each concatenated over the batches
        in order: the one loop of ``compute_all_embeddings``, whatever the number of inputs per sample."""
        batches: list[list[Tensor]] = []
        with torch.no_grad():
            for batch in dataloader:
                inputs, label = self._inputs_and_label(batch)
                parts = [
                    self.get_embeddings_for_eval(trunk_model, embedder_model, x).to(self.data_device) for x in inputs
                ]
                batches.append([*parts, self.process_labels(label).to(self.data_device)])
        if not batches:
            raise ValueError("`dataset` must not be empty.")
        return [torch.cat(column) for column in zip(*batches, strict=True)]

    def _dataloader(self, dataset: Any, collate_fn: Callable[..., Any] | None) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=False,
            drop_last=False,
            num_workers=self.dataloader_num_workers,
            collate_fn=collate_fn,
            pin_memory=False,
        )

    def get_all_embeddings(
        self,
        dataset: Any,
        trunk_model: torch.nn.Module,
        embedder_model: torch.nn.Module | None = None,
        collate_fn: Callable[..., Any] | None = None,
        eval: bool = True,
        return_as_numpy: bool = False,
    ) -> tuple[Any, Any]:
        """Embeddings (after PCA / normalisation) and 2-D labels of a whole dataset."""
        embedder_model = torch.nn.Identity() if embedder_model is None else embedder_model
        if eval:
            trunk_model.eval()
            embedder_model.eval()
        computed = self.compute_all_embeddings(self._dataloader(dataset, collate_fn), trunk_model, embedder_model)
        embeddings, labels = self._finished_embeddings(computed)
        if return_as_numpy:
            return embeddings.cpu().numpy(), labels.cpu().numpy()
        return embeddings, labels

    def _finished_embeddings(self, computed: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """``(embeddings, labels)`` from ``compute_all_embeddings``' result: the embeddings after PCA /
        normalisation (the two-stream tester joins its anchors and positives here)."""
        embeddings, labels = computed
        return self.maybe_normalize(embeddings), labels

    def get_all_embeddings_for_all_splits(
        self,
        dataset_dict: dict[str, Any],
        trunk_model: torch.nn.Module,
        embedder_model: torch.nn.Module,
        splits_to_compute_embeddings: Sequence[str],
        collate_fn: Callable[..., Any] | None,
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """Embeddings and labels of every split needed."""
        return {
            name: self.get_all_embeddings(dataset_dict[name], trunk_model, embedder_model, collate_fn)
            for name in splits_to_compute_embeddings
        }

    def maybe_visualize(self, embeddings_and_labels: dict[str, tuple[Tensor, Tensor]], epoch: int) -> None:
        """Run the visualizer on every split and call the hook once per label level."""
        if not self.visualizer:
            return
        name = self.visualizer.__class__.__name__
        for split_name, (embeddings, labels) in embeddings_and_labels.items():
            reduced = self.visualizer.fit_transform(embeddings.cpu().numpy())
            for level in self.label_levels_to_evaluate(labels):
                keyname = self.accuracies_keyname(name, label_hierarchy_level=level)
                self.visualizer_hook(
                    self.visualizer, reduced, labels[:, level].cpu().numpy(), split_name, keyname, epoch
                )

    # --- splits and levels --------------------------------------------------------------------------------------------

    def get_splits_to_compute_embeddings(
        self, dataset_dict: dict[str, Any], splits_to_eval: Sequence[tuple[str, Sequence[str]]] | None
    ) -> tuple[SplitsToEval, list[str]]:
        """Normalised ``splits_to_eval`` (a query split among its references comes first) and the splits to embed."""
        if splits_to_eval is None:
            splits_to_eval = [(name, [name]) for name in dataset_dict]
        queries = [query for query, _ in splits_to_eval]
        if len(queries) != len(set(queries)):
            raise ValueError(
                f"Unsupported: Evaluating a query split more than once; got `splits_to_eval`={splits_to_eval!r}."
            )
        normalised: SplitsToEval = []
        needed: list[str] = []
        for query, references in splits_to_eval:
            if isinstance(references, str):
                raise TypeError(f"the reference splits of {query!r} must be a list of names, got {references!r}.")
            references = list(references)
            for name in [query, *references]:
                if name not in dataset_dict:
                    raise ValueError(
                        f"`splits_to_eval` names split {name!r}, which is not in `dataset_dict` {list(dataset_dict)}."
                    )
                if name not in needed:
                    needed.append(name)
            if query in references:
                references = [query, *(name for name in references if name != query)]
            normalised.append((query, references))
        return normalised, needed

    def maybe_combine_splits(
        self, embeddings_and_labels: dict[str, tuple[Tensor, Tensor]], splits: Sequence[str]
    ) -> tuple[Tensor, Tensor]:
        """Embeddings and labels of several splits, concatenated in order."""
        parts = [embeddings_and_labels[name] for name in splits]
        return torch.cat([e for e, _ in parts]), torch.cat([lab for _, lab in parts])

    def set_reference_and_query(
        self,
        embeddings_and_labels: dict[str, tuple[Tensor, Tensor]],
        query_split_name: str,
        reference_split_names: Sequence[str],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(query, query_labels, reference, reference_labels)`` of one evaluation."""
        query, query_labels = embeddings_and_labels[query_split_name]
        reference, reference_labels = self.maybe_combine_splits(embeddings_and_labels, reference_split_names)
        return query, query_labels, reference, reference_labels

    def ref_includes_query(self, query_split_name: str, reference_split_names: Sequence[str]) -> bool:
        """Whether the query split is one of the reference splits."""
        return query_split_name in reference_split_names

    def label_levels_to_evaluate(self, query_labels: Tensor) -> Sequence[int]:
        """The label columns selected by ``label_hierarchy_level``."""
        available = query_labels.shape[1]
        level = self.label_hierarchy_level
        if isinstance(level, str):  # "all" (checked at construction)
            levels = list(range(available))
        else:
            levels = [level] if isinstance(level, int) else [int(x) for x in level]
        if any(x >= available for x in levels):
            raise ValueError(
                f"`label_hierarchy_level` must be below the number of label levels {available}, got {level!r}."
            )
        return levels

    def calculate_average_accuracies(
        self, accuracies: dict[str, Any], metrics: Sequence[str], label_levels: Sequence[int]
    ) -> None:
        """``AVERAGE_{metric}``: the mean of the metric over the evaluated levels."""
        for metric in metrics:
            values = [
                accuracies[self.accuracies_keyname(metric, label_hierarchy_level=level)] for level in label_levels
            ]
            accuracies[self.accuracies_keyname(metric, average=True)] = sum(values) / len(label_levels)

    def _record(self, accuracies: dict[str, Any], values: dict[str, Any], level: int) -> None:
        for metric, value in values.items():
            accuracies[self.accuracies_keyname(metric, label_hierarchy_level=level)] = value

    # --- testing ------------------------------------------------------------------------------------------------------

    def do_knn_and_accuracies(
        self,
        accuracies: dict[str, Any],
        embeddings_and_labels: dict[str, tuple[Tensor, Tensor]],
        query_split_name: str,
        reference_split_names: Sequence[str],
    ) -> None:
        """Fill ``accuracies`` for one query split: the accuracies of every evaluated label level
        (``_level_accuracies``, implemented by the subclasses), and their averages when there are several."""
        sets = QueryAndReference(
            *self.set_reference_and_query(embeddings_and_labels, query_split_name, reference_split_names),
            self.ref_includes_query(query_split_name, reference_split_names),
        )
        self.label_levels = self._levels_of(sets.query_labels)
        for level in self.label_levels:
            self._record(accuracies, self._level_accuracies(sets, level), level)
        if len(self.label_levels) > 1:
            self.calculate_average_accuracies(
                accuracies, self.accuracy_calculator.get_curr_metrics(), self.label_levels
            )

    def _levels_of(self, query_labels: Tensor) -> Sequence[int]:
        """The label levels evaluated for these query labels."""
        return self.label_levels_to_evaluate(query_labels)

    def _level_accuracies(self, sets: QueryAndReference, level: int) -> dict[str, Any]:
        """``{metric: value}`` of one label level (implemented by the subclasses)."""
        raise NotImplementedError

    def test(
        self,
        dataset_dict: dict[str, Any],
        epoch: int,
        trunk_model: torch.nn.Module,
        embedder_model: torch.nn.Module | None = None,
        splits_to_eval: Sequence[tuple[str, Sequence[str]]] | None = None,
        collate_fn: Callable[..., Any] | None = None,
    ) -> defaultdict[str, dict[str, Any]]:
        """Embed the datasets and compute the accuracies of every query split.

        Returns:
            ``all_accuracies[query_split][f"{metric}_level{L}"]`` (also kept as ``self.all_accuracies``).
        """
        embedder_model = torch.nn.Identity() if embedder_model is None else embedder_model
        trunk_model.eval()
        embedder_model.eval()
        splits, needed = self.get_splits_to_compute_embeddings(dataset_dict, splits_to_eval)
        self.embeddings_and_labels = self.get_all_embeddings_for_all_splits(
            dataset_dict, trunk_model, embedder_model, needed, collate_fn
        )
        self.maybe_visualize(self.embeddings_and_labels, epoch)
        self.all_accuracies = defaultdict(dict)
        for query_split, reference_splits in splits:
            self.all_accuracies[query_split]["epoch"] = epoch
            self.reference_split_names[query_split] = reference_splits
            self.do_knn_and_accuracies(
                self.all_accuracies[query_split], self.embeddings_and_labels, query_split, reference_splits
            )
        if self.end_of_testing_hook:
            self.end_of_testing_hook(self)
        else:
            LOGGER.info("%s", dict(self.all_accuracies))
        del self.embeddings_and_labels
        return self.all_accuracies
