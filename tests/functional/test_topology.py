"""Tests of torchmetrics_retrieval.functional.topology (PCF, alignment, uniformity)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchmetrics_retrieval.functional.topology import (
    SHARE_TOLERANCE,
    alignment,
    covariance_sums,
    pcf,
    pcf_from_sums,
    uniformity,
)


def reference_pcf(x: np.ndarray, fractions: tuple[float, ...]) -> list[float]:
    """PCF as docs/definitions.md defines it, with an SVD of the centred rows, loops allowed.

    A share within ``SHARE_TOLERANCE`` of r counts as equal to it (the documented rule that keeps float
    noise from changing n; without it r = 1 - 1e-16 against a share of exactly 1 would be ill-posed).
    """
    n, d = x.shape
    centred = x.astype(np.float64) - x.astype(np.float64).mean(axis=0)
    singular = np.linalg.svd(centred, compute_uv=False)  # min(n, d) values
    eigenvalues = singular**2 / (n - 1)
    shares = np.cumsum(eigenvalues) / eigenvalues.sum()
    out = []
    for r in fractions:
        n_components = 1 + sum(1 for share in shares if share <= r + SHARE_TOLERANCE)
        out.append(min(n_components, d) / d)
    return out


def test_pcf_oml_documented_example() -> None:
    assert pcf(torch.eye(4, 10), pcf_variance=(0.5, 1)).tolist() == pytest.approx([0.2, 0.5])


@pytest.mark.parametrize(("n", "d", "expected"), [(2, 10, 0.1), (3, 10, 0.2), (5, 10, 0.3), (7, 20, 0.2)])
def test_pcf_equal_eigenvalues_on_the_boundary(n: int, d: int, expected: float) -> None:
    # eye(n, d) has n - 1 equal eigenvalues: shares j / (n - 1); r = 0.5 hits a share exactly for odd n.
    assert pcf(torch.eye(n, d), pcf_variance=(0.5,)).item() == pytest.approx(expected)


def test_pcf_hand_computed_two_axes() -> None:
    # Variances 12 and 4/3 along two axes of d = 4: shares 0.9, 1, 1, 1 (m = 4; r = 1 gives 5, capped at 4).
    x = torch.tensor([[3.0, 1.0, 0, 0], [-3.0, -1.0, 0, 0], [3.0, -1.0, 0, 0], [-3.0, 1.0, 0, 0]])
    got = pcf(x, pcf_variance=(0.0, 0.5, 0.9, 0.95, 1.0))
    assert got.tolist() == pytest.approx([0.25, 0.25, 0.5, 0.5, 1.0])


def test_pcf_full_variance_is_capped_at_one() -> None:
    x = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    assert pcf(x, pcf_variance=(1.0,)).item() == 1.0


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 30),
    d=st.integers(1, 12),
    rank=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
)
def test_pcf_matches_svd_reference(n: int, d: int, rank: int, seed: int, fractions: list[float]) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, min(rank, d), generator=g, dtype=torch.float64) @ torch.randn(
        min(rank, d), d, generator=g, dtype=torch.float64
    ) + torch.randn(d, generator=g, dtype=torch.float64)
    expected = reference_pcf(x.numpy(), tuple(fractions))
    got = pcf(x, pcf_variance=fractions)
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(expected)


def test_streaming_sums_equal_one_shot() -> None:
    x = torch.randn(101, 8, generator=torch.Generator().manual_seed(1)) * 3 + 5
    parts = [covariance_sums(chunk) for chunk in torch.split(x, [0, 40, 1, 60])]
    count = torch.stack([p[0] for p in parts]).sum(0)
    total = torch.stack([p[1] for p in parts]).sum(0)
    outer = torch.stack([p[2] for p in parts]).sum(0)
    assert count.item() == 101
    fractions = (0.1, 0.5, 0.8, 0.99)
    assert torch.equal(pcf_from_sums(count, total, outer, fractions), pcf(x, fractions))
    assert torch.allclose(outer, x.double().T @ x.double())


def test_covariance_sums_dtypes() -> None:
    count, total, outer = covariance_sums(torch.ones(3, 2, dtype=torch.float16))
    assert (count.dtype, total.dtype, outer.dtype) == (torch.int64, torch.float64, torch.float64)
    assert count.item() == 3 and total.tolist() == [3.0, 3.0]


def test_pcf_constant_rows_is_nan_with_warning() -> None:
    with pytest.warns(UserWarning, match="zero variance"):
        got = pcf(torch.full((5, 3), 0.1), pcf_variance=(0.5, 1.0))
    assert torch.isnan(got).all()


@pytest.mark.parametrize("n", [0, 1])
def test_pcf_needs_two_samples(n: int) -> None:
    with pytest.raises(ValueError, match=f"at least 2 samples, got {n}"):
        pcf(torch.zeros(n, 3))
    with pytest.raises(ValueError, match=f"at least 2 samples, got {n}"):
        pcf_from_sums(*covariance_sums(torch.zeros(n, 3)))


@pytest.mark.parametrize(("bad", "error"), [((1.5,), ValueError), ((-0.1,), ValueError), (("a",), TypeError)])
def test_pcf_bad_fractions(bad: tuple, error: type) -> None:
    with pytest.raises(error, match="pcf_variance"):
        pcf(torch.randn(4, 3), pcf_variance=bad)


def test_pcf_bad_embeddings() -> None:
    with pytest.raises(ValueError, match=r"embeddings.*finite"):
        pcf(torch.tensor([[0.0, math.nan], [1.0, 2.0]]))
    with pytest.raises(TypeError, match="embeddings"):
        pcf(torch.ones(3, 2, dtype=torch.long))


def test_pcf_from_sums_bad_shapes() -> None:
    with pytest.raises(ValueError, match="outer_sum"):
        pcf_from_sums(torch.tensor(3), torch.zeros(3), torch.zeros(2, 2))
    with pytest.raises(TypeError, match="count"):
        pcf_from_sums(3, torch.zeros(3), torch.zeros(3, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        pcf_from_sums(torch.tensor([3, 4]), torch.zeros(3), torch.zeros(3, 3))


# ------------------------------------------------------------------------------------------------ alignment


def test_alignment_hand_computed() -> None:
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    assert alignment(x, y).item() == pytest.approx(2.0)  # (4 + 0) / 2
    assert alignment(x, y, alpha=1).item() == pytest.approx(1.0)  # (2 + 0) / 2
    assert alignment(x, y, alpha=3).item() == pytest.approx(4.0)  # (8 + 0) / 2


def test_alignment_errors() -> None:
    with pytest.raises(ValueError, match="`y` must have the shape"):
        alignment(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="alpha"):
        alignment(torch.zeros(3, 2), torch.zeros(3, 2), alpha=0)
    with pytest.raises(TypeError, match="alpha"):
        alignment(torch.zeros(3, 2), torch.zeros(3, 2), alpha="2")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- uniformity


def reference_uniformity(x: torch.Tensor, t: float) -> float:
    """Wang & Isola's formula over the pairs i < j, in float64."""
    x = x.double()
    return torch.pdist(x, p=2).pow(2).mul(-t).exp().mean().log().item()


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 7, 100])
@pytest.mark.parametrize("t", [0.5, 2.0])
def test_uniformity_matches_pdist(chunk_size: int | None, t: float) -> None:
    x = torch.nn.functional.normalize(torch.randn(23, 5, generator=torch.Generator().manual_seed(2)), dim=1)
    assert uniformity(x, t=t, chunk_size=chunk_size).item() == pytest.approx(reference_uniformity(x, t), abs=1e-5)


def test_uniformity_is_stable_far_from_zero() -> None:
    # exp(-t * d^2) underflows in float32 for every pair; the log-sum-exp stays exact.
    x = torch.tensor([[0.0], [10.0], [20.0]])
    # pairs (i < j): squared distances 100, 400, 100 -> log(mean(exp(-2 * d2)))
    expected = -200.0 + math.log((2 + math.exp(-600.0)) / 3)
    assert uniformity(x, t=2.0, chunk_size=1).item() == pytest.approx(expected)


def test_uniformity_errors() -> None:
    with pytest.raises(ValueError, match="at least 2 rows"):
        uniformity(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="`t`"):
        uniformity(torch.zeros(3, 3), t=-1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        uniformity(torch.zeros(3, 3), chunk_size=0)
