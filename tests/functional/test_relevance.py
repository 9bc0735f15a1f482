"""Relevance: label matching of any dtype and shape, custom comparison, exact relevant counts."""

import pytest
import reference
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchmetrics_retrieval.functional.relevance import count_relevant, label_match, relevance_matrix


def test_int64_labels_above_2_pow_24_do_not_collide() -> None:
    big = 2**24
    labels = torch.tensor([big, big + 1, big], dtype=torch.int64)
    assert float(big) == float(torch.tensor(big + 1, dtype=torch.float32))  # they would collide as float32
    assert label_match(labels, labels).tolist() == [[True, False, True], [False, True, False], [True, False, True]]
    assert count_relevant(labels, labels, self_index=torch.arange(3)).tolist() == [1, 0, 1]


def test_2d_labels_match_whole_rows() -> None:
    labels = torch.tensor([[1, 3], [1, 4], [1, 3]])
    assert label_match(labels, labels)[0].tolist() == [True, False, True]
    hits = relevance_matrix(labels, labels, torch.tensor([[2, 1], [0, 2], [0, 1]]))
    assert hits.tolist() == [[True, False], [False, False], [True, False]]


def pml_2d_rule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Seed 001's example: same first column, different second column."""
    return (x[..., 0] == y[..., 0]) & (x[..., 1] != y[..., 1])


def test_custom_2d_comparison_from_the_seed() -> None:
    labels = torch.tensor([(1, 3), (7, 4), (1, 4), (1, 5), (1, 6)])
    match = label_match(labels, labels, pml_2d_rule)
    assert match[0].tolist() == [False, False, True, True, True]
    assert match[1].tolist() == [False] * 5
    counts = count_relevant(labels, labels, self_index=torch.arange(5), label_comparison_fn=pml_2d_rule)
    assert counts.tolist() == [3, 0, 3, 3, 3]


def test_custom_float_comparison_from_the_seed() -> None:
    labels = torch.tensor([10.0, 0.03, 0.04, 0.05])

    def near(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.abs(x - y) < 1

    counts = count_relevant(labels, labels, self_index=torch.arange(4), label_comparison_fn=near)
    assert counts.tolist() == [0, 2, 2, 2]
    hits = relevance_matrix(labels, labels, torch.tensor([[1], [0], [3], [2]]), label_comparison_fn=near)
    assert hits.flatten().tolist() == [False, False, True, True]


def test_invalid_slots_are_never_relevant() -> None:
    labels = torch.tensor([0, 0])
    hits = relevance_matrix(labels, labels, torch.tensor([[1, 0], [0, 0]]), torch.tensor([[True, False]] * 2))
    assert hits.tolist() == [[True, False], [True, False]]


def test_bad_comparison_result() -> None:
    labels = torch.tensor([0, 1])
    with pytest.raises(TypeError, match="label_comparison_fn"):
        label_match(labels, labels, lambda x, y: (x == y).int())
    with pytest.raises(ValueError, match="label_comparison_fn"):
        label_match(labels, labels, lambda x, y: torch.ones(3, dtype=torch.bool))


@given(
    data=st.data(),
    n=st.integers(1, 12),
    with_seq=st.booleans(),
    with_groups=st.booleans(),
    in_gallery=st.booleans(),
    custom=st.booleans(),
)
def test_counts_match_reference(data, n, with_seq, with_groups, in_gallery, custom) -> None:  # type: ignore[no-untyped-def]
    labels = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    seq = torch.tensor(data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    groups = torch.tensor(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    self_index = torch.arange(n) if in_gallery else torch.full((n,), -1)
    fn = (lambda x, y: (x % 2) == (y % 2)) if custom else None
    kwargs = {
        "sequence_ids": (seq, seq) if with_seq else None,
        "search_groups": (groups, groups) if with_groups else None,
    }
    x = torch.zeros(n, 1)
    expected = [
        r.n_relevant
        for r in reference.rankings(
            x,
            labels,
            x,
            labels,
            self_index=self_index.tolist() if in_gallery else None,
            label_comparison_fn=fn,
            **kwargs,
        )
    ]
    got = count_relevant(labels, labels, self_index=self_index, label_comparison_fn=fn, **kwargs)
    assert got.tolist() == expected
