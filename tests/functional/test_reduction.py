"""Reductions: empty-target actions, means, per-group means."""

import pytest
import torch

from torchmetrics_retrieval.functional.reduction import (
    apply_empty_target_action,
    grouped_mean,
    label_names,
    masked_mean,
)

VALUES = torch.tensor([0.5, 0.0, 1.0, 0.0])
N = torch.tensor([2, 0, 1, 0])


@pytest.mark.parametrize(
    ("action", "expected_values", "expected_counted"),
    [
        ("skip", [0.5, 0.0, 1.0, 0.0], [True, False, True, False]),
        ("neg", [0.5, 0.0, 1.0, 0.0], [True, True, True, True]),
        ("pos", [0.5, 1.0, 1.0, 1.0], [True, True, True, True]),
    ],
)
def test_empty_target_actions(action, expected_values, expected_counted) -> None:  # type: ignore[no-untyped-def]
    values, counted = apply_empty_target_action(VALUES, N, action)
    assert values.tolist() == expected_values
    assert counted.tolist() == expected_counted


def test_error_action_names_the_count() -> None:
    with pytest.raises(ValueError, match="2 of 4 queries"):
        apply_empty_target_action(VALUES, N, "error")
    _values, counted = apply_empty_target_action(VALUES[[0, 2]], N[[0, 2]], "error")
    assert counted.all()


def test_unknown_action() -> None:
    with pytest.raises(ValueError, match="empty_target_action"):
        apply_empty_target_action(VALUES, N, "drop")  # type: ignore[arg-type]


def test_masked_mean_and_all_skipped_is_nan_with_warning() -> None:
    assert masked_mean(VALUES, N > 0).item() == 0.75
    with pytest.warns(UserWarning, match="skipped"):
        assert torch.isnan(masked_mean(VALUES, torch.zeros(4, dtype=torch.bool)))


def test_grouped_mean_by_label_any_dtype() -> None:
    big = 2**40
    groups = torch.tensor([big, big + 1, big, 7])  # distinct int64 labels that collide as float32
    distinct, means, ok = grouped_mean(torch.tensor([1.0, 0.5, 0.0, 0.25]), torch.ones(4, dtype=torch.bool), groups)
    assert distinct.tolist() == [7, big, big + 1]
    assert means.tolist() == [0.25, 0.5, 0.5]
    assert ok.all()


def test_grouped_mean_2d_and_uncounted_group() -> None:
    groups = torch.tensor([[1, 2], [1, 3], [1, 2]])
    counted = torch.tensor([True, False, True])
    table = torch.tensor([[1.0, 0.0], [5.0, 5.0], [0.0, 0.0]])
    distinct, means, ok = grouped_mean(table, counted, groups)
    assert label_names(distinct) == ["1_2", "1_3"]
    assert means[0].tolist() == [0.5, 0.0]
    assert ok.tolist() == [True, False]
    assert torch.isnan(means[1]).all()
