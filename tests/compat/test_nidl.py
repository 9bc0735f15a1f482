"""compat.nidl.contrastive_accuracy_score: nidl's documented example, hand values, both input types, every error.

nidl is not a test dependency: the reference below ranks the candidates of every query with a full sort
(nidl's "true partner among the k most similar"), on tie-free random data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchmetrics_retrieval.compat.nidl import contrastive_accuracy_score

Z1 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
Z2 = [[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]]
# cosine similarities by hand, rows of z1 against rows of z2 (partner on the diagonal):
#   z1[0]: .995 [1] .707   -> partner 2nd       z2[0] vs z1: .995 .0995 .774 -> partner 1st
#   z1[1]: .0995 [0] .707  -> partner 3rd       z2[1] vs z1: 1 [0] .707      -> partner 3rd
#   z1[2]: .774 .707 [1]   -> partner 1st       z2[2] vs z1: .707 .707 [1]   -> partner 1st
# k = 1: (1/3 + 2/3) / 2 = 0.5;  k = 2: (2/3 + 2/3) / 2 = 2/3;  k = 3: 1


def test_documented_example() -> None:
    torch.manual_seed(0)
    z1 = torch.randn(8, 128)
    z2 = z1 + 0.1 * torch.randn(8, 128)  # slightly perturbed positives
    assert torch.equal(contrastive_accuracy_score(z1, z2, topk=1), torch.tensor(1.0))


@pytest.mark.parametrize(("topk", "expected"), [(1, 0.5), (2, 2 / 3), (3, 1.0), (50, 1.0)])
def test_hand_computed_torch(topk: int, expected: float) -> None:
    score = contrastive_accuracy_score(torch.tensor(Z1), torch.tensor(Z2), topk=topk)
    assert isinstance(score, torch.Tensor) and score.ndim == 0 and score.dtype == torch.float32
    torch.testing.assert_close(score, torch.tensor(expected))


@pytest.mark.parametrize(("topk", "expected"), [(1, 0.5), (2, 2 / 3), (3, 1.0), (50, 1.0)])
def test_hand_computed_numpy(topk: int, expected: float) -> None:
    score = contrastive_accuracy_score(np.array(Z1), np.array(Z2), topk=topk)
    assert type(score) is np.float64
    assert score == pytest.approx(expected, abs=1e-15)


def test_without_normalisation() -> None:
    # raw dot products: z1[0] . z2 = (1, 1, 1): ties, counted as hits; z1[1] . z2 = (.1, 0, 1) -> partner 3rd
    # z2[0] . z1 = (1, .1, 1.1) -> 2nd; z2[1] . z1 = (1, 0, 1) -> 3rd; z2[2] . z1 = (1, 1, 2) -> 1st
    # z1[2] . z2 = (1.1, 1, 2) -> 1st.   k = 1: (2/3 + 1/3) / 2 = 0.5
    assert float(contrastive_accuracy_score(torch.tensor(Z1), torch.tensor(Z2), normalize=False)) == pytest.approx(0.5)
    assert contrastive_accuracy_score(np.array(Z1), np.array(Z2), normalize=False) == pytest.approx(0.5)
    # scaling z2[2] by 10 makes it the most similar candidate of every z1 row, unless rows are normalised:
    # raw: z1 -> z2 hits only z1[2]; z2 -> z1 hits only z2[2]: (1/3 + 1/3) / 2
    z2 = torch.tensor(Z2) * torch.tensor([[1.0], [1.0], [10.0]])
    assert float(contrastive_accuracy_score(torch.tensor(Z1), z2, normalize=False)) == pytest.approx(1 / 3)
    assert float(contrastive_accuracy_score(torch.tensor(Z1), z2)) == pytest.approx(0.5)


def test_ties_count_in_favour_of_the_partner() -> None:
    """Documented difference: with every candidate equally similar, every row is a hit at k = 1."""
    z = torch.ones(4, 3)
    assert float(contrastive_accuracy_score(z, z)) == 1.0


def test_integer_inputs_are_cast() -> None:
    z1 = [[2, 0], [0, 3], [1, 1]]
    z2 = [[3, 0], [0, 1], [2, 2]]
    assert float(contrastive_accuracy_score(torch.tensor(z1), torch.tensor(z2))) == 1.0
    assert contrastive_accuracy_score(np.array(z1), np.array(z2)) == 1.0


def test_zero_rows_stay_finite() -> None:
    z1 = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    z2 = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    assert math.isfinite(float(contrastive_accuracy_score(z1, z2)))
    assert math.isfinite(float(contrastive_accuracy_score(z1.numpy(), z2.numpy())))


def test_float64_torch_input_gives_float32() -> None:
    score = contrastive_accuracy_score(torch.tensor(Z1, dtype=torch.float64), torch.tensor(Z2, dtype=torch.float64))
    assert score.dtype == torch.float32


# ---------------------------------------------------------------------------------------------------
# Errors, in nidl's order (topk first)
# ---------------------------------------------------------------------------------------------------

ERRORS = [
    (torch.ones(2, 2), torch.ones(2, 2), {"topk": 0}, ValueError, "topk"),
    ([[1.0]], np.ones((1, 1)), {"topk": 0}, ValueError, "topk"),  # topk is checked before the types
    (torch.ones(2, 2), torch.ones(2, 2), {"topk": "2"}, TypeError, "topk"),
    (torch.ones(2, 2), np.ones((2, 2)), {}, TypeError, "both"),
    ([[1.0]], [[1.0]], {}, TypeError, "both"),
    (torch.ones(2, 2), torch.ones(3, 2), {}, ValueError, "same shape"),
    (np.ones((2, 2)), np.ones((2, 3)), {}, ValueError, "same shape"),
    (torch.ones(4), torch.ones(4), {}, ValueError, "2-D"),
    (np.ones((2, 2, 2)), np.ones((2, 2, 2)), {}, ValueError, "2-D"),
    (torch.ones(0, 3), torch.ones(0, 3), {}, ValueError, "at least one row"),
    (torch.tensor([[math.nan, 1.0]]), torch.ones(1, 2), {}, ValueError, "finite"),
    (np.ones((1, 2)), np.array([[math.inf, 1.0]]), {}, ValueError, "finite"),
]


@pytest.mark.parametrize(("z1", "z2", "kwargs", "error", "match"), ERRORS)
def test_errors(z1: Any, z2: Any, kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        contrastive_accuracy_score(z1, z2, **kwargs)


# ---------------------------------------------------------------------------------------------------
# Slow reference: full sort per query (tie-free data)
# ---------------------------------------------------------------------------------------------------


def reference(z1: np.ndarray, z2: np.ndarray, normalize: bool, k: int) -> float:
    if normalize:
        z1 = z1 / np.linalg.norm(z1, axis=1, keepdims=True)
        z2 = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
    n = len(z1)
    k = min(k, n)
    hits = 0
    for queries, candidates in ((z1, z2), (z2, z1)):
        for i in range(n):
            similarities = [float(queries[i] @ candidates[j]) for j in range(n)]
            top = sorted(range(n), key=lambda j: -similarities[j])[:k]
            hits += i in top
    return hits / (2 * n)


@given(
    n=st.integers(1, 12),
    dim=st.integers(2, 5),
    k=st.integers(1, 14),
    normalize=st.booleans(),
    noise=st.floats(0.05, 3.0),
    seed=st.integers(0, 2**16),
)
def test_against_reference(n: int, dim: int, k: int, normalize: bool, noise: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    z1 = rng.standard_normal((n, dim))
    z2 = z1 + noise * rng.standard_normal((n, dim))
    expected = reference(z1, z2, normalize, k)
    numpy_score = contrastive_accuracy_score(z1, z2, normalize=normalize, topk=k)
    assert type(numpy_score) is np.float64 and numpy_score == pytest.approx(expected, abs=1e-15)
    torch_score = contrastive_accuracy_score(torch.from_numpy(z1), torch.from_numpy(z2), normalize=normalize, topk=k)
    torch.testing.assert_close(torch_score, torch.tensor(expected, dtype=torch.float32))
