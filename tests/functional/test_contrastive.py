"""Tests of torchmetrics_retrieval.functional.contrastive against a full-matrix reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchmetrics_retrieval.functional.contrastive import contrastive_accuracy


def reference(z1: torch.Tensor, z2: torch.Tensor, k: int, normalize: bool) -> float:
    """docs/definitions.md's rule on the full (N, N) similarity matrix (float64), one query at a time."""
    if normalize:
        z1, z2 = torch.nn.functional.normalize(z1, dim=1), torch.nn.functional.normalize(z2, dim=1)
    sim = z1.double() @ z2.double().T  # sim[i, j] = s(z1[i], z2[j]) = s(z2[j], z1[i])
    n = sim.shape[0]
    hits = 0
    for i in range(n):
        hits += int(sum(int(sim[i, j] > sim[i, i]) for j in range(n)) < k)  # z1[i] -> rows of z2
        hits += int(sum(int(sim[j, i] > sim[i, i]) for j in range(n)) < k)  # z2[i] -> rows of z1
    return hits / (2 * n)


def test_hand_computed_directions_differ() -> None:
    # Unit rows; s(z1[i], z2[j]) for j = 0, 1, 2:
    # row 0: [0.995, 1, 0.707] partner 0.995 -> 1 above; row 1: [0.0995, 0, 0.707] -> 2 above; row 2: partner 1 -> 0.
    # columns (z2 -> z1): col 0: [0.995, 0.0995, 0.774] -> 0 above; col 1: [1, 0, 0.707] -> 2; col 2: 0.
    z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    z2 = torch.tensor([[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]])
    got = contrastive_accuracy(z1, z2, top_k=(1, 2, 3, 10))
    assert isinstance(got, dict)
    expected = {1: (1 / 3 + 2 / 3) / 2, 2: (2 / 3 + 2 / 3) / 2, 3: 1.0, 10: 1.0}
    assert {key: value.item() for key, value in got.items()} == pytest.approx(
        {f"contrastive_accuracy/{k}": v for k, v in expected.items()}
    )
    swapped = contrastive_accuracy(z2, z1)
    assert isinstance(swapped, torch.Tensor) and swapped.item() == pytest.approx(expected[1])


def test_ties_count_as_hits() -> None:
    # Every candidate is equally similar: no candidate is strictly more similar than the partner.
    z = torch.ones(5, 3)
    assert contrastive_accuracy(z, z, chunk_size=2).item() == 1.0
    # Duplicated rows of z2 tie with the partner; a strictly better candidate makes a miss.
    z1 = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[2.0, 0.0], [4.0, 0.0], [1.0, 1.0]])
    # normalize=False: row 0 sims [2, 4, 1] partner 2 -> 1 above (miss); row 1 partner 4 -> hit; row 2
    # sims [0, 0, 1] -> hit. Columns: col 0 [2, 2, 0] partner 2 -> hit; col 1 [4, 4, 0] -> hit;
    # col 2 [1, 1, 1] -> hit.
    assert contrastive_accuracy(z1, z2, normalize=False).item() == pytest.approx((2 / 3 + 1) / 2)
    # normalize=True: rows 0, 1 of z2 become identical, both tie -> all hits.
    assert contrastive_accuracy(z1, z2, normalize=True).item() == 1.0


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 5, 16, 64])
@pytest.mark.parametrize("normalize", [True, False])
def test_random_matches_reference_for_every_chunk_size(chunk_size: int | None, normalize: bool) -> None:
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(17, 4, generator=g)
    z2 = z1 + 0.8 * torch.randn(17, 4, generator=g)
    got = contrastive_accuracy(z1, z2, top_k=(1, 2, 5), normalize=normalize, chunk_size=chunk_size)
    assert isinstance(got, dict)
    for k in (1, 2, 5):
        assert got[f"contrastive_accuracy/{k}"].item() == pytest.approx(reference(z1, z2, k, normalize))


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 12),
    d=st.integers(1, 3),
    k=st.integers(1, 14),
    chunk=st.integers(1, 13),
    normalize=st.booleans(),
)
def test_property_with_many_ties(data: st.DataObject, n: int, d: int, k: int, chunk: int, normalize: bool) -> None:
    # Rows are small integer vectors times powers of two: raw dot products are exact, normalisation maps
    # multiples of one vector to bit-identical rows, and float64 dot products of the normalised float32
    # rows keep mathematical ties such as <(1, 1, 1), (1, -1, 0)> = 0 (a float32 matmul may not).
    base = st.lists(st.integers(-2, 2), min_size=d, max_size=d)
    rows = data.draw(st.lists(st.tuples(base, st.integers(0, 3)), min_size=2 * n, max_size=2 * n))
    z = torch.tensor([[v * 2.0**p for v in vec] for vec, p in rows])
    if normalize:
        z[(z == 0).all(dim=1)] = 1.0  # a zero row has no direction
    z1, z2 = z[:n], z[n:]
    got = contrastive_accuracy(z1, z2, top_k=k, normalize=normalize, chunk_size=chunk)
    assert isinstance(got, torch.Tensor) and got.ndim == 0
    assert got.item() == pytest.approx(reference(z1, z2, k, normalize))


def test_output_type_and_device() -> None:
    z = torch.randn(4, 3, dtype=torch.float64)
    got = contrastive_accuracy(z, z)
    assert isinstance(got, torch.Tensor)
    assert got.shape == () and got.dtype == torch.float32 and got.device == z.device
    assert got.item() == 1.0
    half = contrastive_accuracy(z.half(), z.half(), top_k=[1])
    assert isinstance(half, dict) and list(half) == ["contrastive_accuracy/1"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"z1": [[1.0]]}, TypeError, "`z1` must be a torch.Tensor"),
        ({"z2": torch.zeros(3)}, ValueError, "`z2` must be 2-D"),
        ({"z2": torch.zeros(4, 2)}, ValueError, "`z2` must have the shape"),
        ({"z1": torch.tensor([[math.nan, 0.0]] * 3)}, ValueError, "`z1` must be finite"),
        ({"z2": torch.tensor([[math.inf, 0.0]] * 3)}, ValueError, "`z2` must be finite"),
        ({"z1": torch.zeros(3, 2, dtype=torch.long)}, TypeError, "`z1` must have a floating dtype"),
        ({"top_k": 0}, ValueError, "`top_k` must contain ints >= 1, got 0"),
        ({"top_k": ()}, ValueError, "`top_k` must not be empty"),
        ({"top_k": 1.5}, TypeError, "`top_k`"),
        ({"eps": -1.0}, ValueError, "`eps`"),
        ({"chunk_size": 0}, ValueError, "`chunk_size`"),
    ],
)
def test_errors(kwargs: dict, error: type, match: str) -> None:
    args = {"z1": torch.ones(3, 2), "z2": torch.ones(3, 2)} | kwargs
    with pytest.raises(error, match=match):
        contrastive_accuracy(**args)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7])
def test_cancellation_ties_for_every_chunk_size(chunk_size: int) -> None:
    # <(1,1,1), (1,-1,0)> = 0 = <(0,0,1), (1,-1,0)> exactly; a float32 matmul may round one of them to
    # -6e-10 depending on the kernel, the result must not move.
    z = torch.ones(14, 3)
    z[5] = torch.tensor([0.0, 0.0, 1.0])
    z[13] = torch.tensor([1.0, -1.0, 0.0])
    z1, z2 = z[:7], z[7:]
    got = contrastive_accuracy(z1, z2, chunk_size=chunk_size)
    assert isinstance(got, torch.Tensor)
    assert got.item() == pytest.approx(reference(z1, z2, 1, True))
