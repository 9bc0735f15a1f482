"""The shared accumulation machinery: batch validation, de-duplication, the layout exchange before a gather."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.metrics._state import (
    FieldSpec,
    SampleAccumulator,
    _layout,
    _templates,
    deduplicate,
    validate_batch,
)

SPECS = (
    FieldSpec("embeddings", "embeddings"),
    FieldSpec("labels", "labels"),
    FieldSpec("groups", "ids", optional=True),
    FieldSpec("indexes", "indexes", optional=True),
)


def test_deduplicate_keeps_the_first_occurrence_in_index_order() -> None:
    rows, kept = deduplicate(
        {"x": torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]]), "none": None}, torch.tensor([7, 2, 7, 2, 5])
    )
    assert kept.tolist() == [2, 5, 7]
    assert rows["x"] is not None and rows["x"].flatten().tolist() == [2.0, 5.0, 1.0]
    assert rows["none"] is None


def test_validate_batch_returns_detached_tensors_on_the_embeddings_device() -> None:
    x = torch.ones(2, 3, requires_grad=True)
    batch = validate_batch(SPECS, {"embeddings": x, "labels": torch.tensor([1, 2]), "groups": None}, None)
    assert batch["embeddings"] is not None and not batch["embeddings"].requires_grad
    assert batch["groups"] is None and batch["indexes"] is None


def test_validate_batch_against_previous() -> None:
    first = validate_batch(
        SPECS, {"embeddings": torch.ones(2, 3), "labels": torch.ones(2, 2), "groups": torch.tensor([0, 1])}, None
    )
    with pytest.raises(ValueError, match=r"`labels` must have the shape \(N, 2\) of the previous"):
        validate_batch(
            SPECS, {"embeddings": torch.ones(1, 3), "labels": torch.ones(1, 3), "groups": torch.tensor([0])}, first
        )
    with pytest.raises(TypeError, match=r"`groups` must have dtype torch\.int64"):
        validate_batch(
            SPECS,
            {
                "embeddings": torch.ones(1, 3),
                "labels": torch.ones(1, 2),
                "groups": torch.tensor([0], dtype=torch.int32),
            },
            first,
        )
    with pytest.raises(TypeError, match=r"`embeddings` must be a torch\.Tensor"):
        validate_batch(SPECS, {"embeddings": None, "labels": torch.ones(1, 2)}, first)


def test_layout_exchange_builds_empty_templates_and_detects_disagreement() -> None:
    full = {
        "embeddings": torch.ones(3, 4, dtype=torch.float16),
        "labels": torch.ones(3, dtype=torch.int32),
        "groups": None,
        "indexes": torch.arange(3),
    }
    empty = dict.fromkeys(full)
    layouts = torch.stack([_layout(empty, SPECS, torch.device("cpu")), _layout(full, SPECS, torch.device("cpu"))])
    templates = _templates(layouts, SPECS)
    assert templates == {
        "embeddings": (torch.float16, 4),
        "labels": (torch.int32,),
        "groups": None,
        "indexes": (torch.int64,),
    }
    missing = {**full, "indexes": None}
    with pytest.raises(ValueError, match=r"`indexes` must be given on every process .* processes \[1\] of \[0, 1\]"):
        _templates(torch.stack([_layout(missing, SPECS, torch.device("cpu")), layouts[1]]), SPECS)
    wider = {**full, "embeddings": torch.ones(2, 5, dtype=torch.float16)}
    with pytest.raises(ValueError, match="`embeddings` must have the same trailing shape and dtype"):
        _templates(torch.stack([_layout(wider, SPECS, torch.device("cpu")), layouts[1]]), SPECS)


class _Rows(SampleAccumulator):
    """A minimal accumulating metric: the number of distinct samples."""

    _fields = (FieldSpec("values", "embeddings"), FieldSpec("indexes", "indexes", optional=True))

    def update(self, values: torch.Tensor, indexes: torch.Tensor | None = None) -> None:
        self._store(values=values, indexes=indexes)

    def _compute_samples(self, fields: dict, indexes: torch.Tensor | None) -> torch.Tensor:
        return torch.tensor(fields["values"].shape[0])


def test_a_subclass_gets_storage_deduplication_and_sync_through_a_fake_gather() -> None:
    metric = _Rows()
    metric.update(torch.ones(3, 2), torch.tensor([0, 1, 2]))
    metric.update(torch.ones(2, 2), torch.tensor([2, 3]))
    assert int(metric.compute()) == 4

    other_rank = {"values": torch.ones(2, 2), "indexes": torch.tensor([3, 4])}

    def fake_gather(tensor: torch.Tensor, group: object = None) -> list[torch.Tensor]:
        """Two processes: this one, and one holding `other_rank` (layouts answered accordingly)."""
        if tensor.dtype == torch.long and tensor.ndim == 2 and tensor.shape[1] == 4:  # the layout exchange
            return [tensor, _layout(other_rank, _Rows._fields, tensor.device)]
        name = "values" if tensor.is_floating_point() else "indexes"
        return [tensor, other_rank[name]]

    empty = _Rows(dist_sync_fn=fake_gather, distributed_available_fn=lambda: True)
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert int(empty.compute()) == 2  # the local empty states become zero-row tensors of the right kind
    assert empty.values == [] and empty.indexes == []  # local state restored after the gather
