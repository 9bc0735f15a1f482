"""Tests of score normalisation against a numpy reference written here from the published formulas.

The reference is slow and obvious: per trial, the cohort scores of each side from the distance definitions (float64),
sorted for AS-norm, then the mean and the population standard deviation (numpy's ``np.std``, ddof 0).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import Tensor

import torchmetrics_retrieval.functional.score_norm as score_norm_module
from torchmetrics_retrieval.functional import normalize_scores

DISTANCES = ("euclidean", "sqeuclidean", "cosine", "dot")


def reference_distance(a: np.ndarray, b: np.ndarray, distance: str) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    if distance == "euclidean":
        return float(np.sqrt(np.sum((a - b) ** 2)))
    if distance == "sqeuclidean":
        return float(np.sum((a - b) ** 2))
    if distance == "cosine":
        return float(1.0 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return float(-(a @ b))


def reference_side(x: np.ndarray, cohort: np.ndarray, distance: str, top_n: int | None) -> tuple[float, float]:
    """Mean and population standard deviation of the cohort scores of one embedding (its top_n highest)."""
    scores = [-reference_distance(x, c, distance) for c in cohort]
    if top_n is not None:
        scores = sorted(scores, reverse=True)[:top_n]
    mean = sum(scores) / len(scores)
    spread = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
    return mean, spread


def reference_normalize(
    scores: np.ndarray,
    x: np.ndarray,
    enrol: np.ndarray,
    test: np.ndarray,
    cohort: np.ndarray,
    method: str,
    top_n: int | None,
    distance: str,
) -> np.ndarray:
    out = []
    for s, e, t in zip(scores.astype(np.float64), enrol, test, strict=True):
        mu_e, sd_e = reference_side(x[e], cohort, distance, top_n)
        mu_t, sd_t = reference_side(x[t], cohort, distance, top_n)
        z, tn = (s - mu_e) / sd_e, (s - mu_t) / sd_t
        out.append({"z": z, "t": tn, "s": (z + tn) / 2, "as": (z + tn) / 2}[method])
    return np.array(out)


def trial_scores(x: Tensor, enrol: Tensor, test: Tensor, distance: str) -> Tensor:
    """Minus the distance of each trial, the scale the function expects."""
    d = [reference_distance(x[e].numpy(), x[t].numpy(), distance) for e, t in zip(enrol, test, strict=True)]
    return -torch.tensor(d, dtype=torch.float64).to(x.dtype)


def random_case(seed: int, dtype: torch.dtype, n: int = 12, n_cohort: int = 17, n_trials: int = 25, d: int = 4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    cohort = torch.randn(n_cohort, d, generator=g, dtype=torch.float64).to(dtype)
    enrol = torch.randint(0, n, (n_trials,), generator=g)
    test = torch.randint(0, n, (n_trials,), generator=g)
    return x, cohort, enrol, test


def run(x: Tensor, cohort: Tensor, enrol: Tensor, test: Tensor, method: str, top_n: int | None, distance: str, **kw):
    scores = trial_scores(x, enrol, test, distance)
    result = normalize_scores(scores, x, enrol, test, cohort, method=method, top_n=top_n, distance=distance, **kw)
    expected = reference_normalize(
        scores.numpy(), x.numpy(), enrol.numpy(), test.numpy(), cohort.numpy(), method, top_n, distance
    )
    return result, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize(("method", "top_n"), [("z", None), ("t", None), ("s", None), ("as", 5), ("as", 17)])
def test_matches_the_reference(method: str, top_n: int | None, distance: str, dtype: torch.dtype) -> None:
    x, cohort, enrol, test = random_case(0, dtype)
    result, expected = run(x, cohort, enrol, test, method, top_n, distance)
    assert result.dtype == dtype and result.shape == (25,)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12  # float32: distances from float32 matmul blocks
    np.testing.assert_allclose(result.double().numpy(), expected, rtol=tolerance, atol=tolerance)


def test_as_norm_with_the_whole_cohort_is_s_norm() -> None:
    x, cohort, enrol, test = random_case(1, torch.float64)
    scores = trial_scores(x, enrol, test, "cosine")
    s = normalize_scores(scores, x, enrol, test, cohort, method="s")
    adaptive = normalize_scores(scores, x, enrol, test, cohort, method="as", top_n=cohort.shape[0])
    torch.testing.assert_close(adaptive, s, rtol=1e-12, atol=1e-12)


def test_s_norm_is_the_mean_of_z_and_t() -> None:
    x, cohort, enrol, test = random_case(2, torch.float64)
    scores = trial_scores(x, enrol, test, "euclidean")
    z, t, s = (normalize_scores(scores, x, enrol, test, cohort, method=m, distance="euclidean") for m in "zts")
    torch.testing.assert_close(s, (z + t) / 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("method", "top_n"), [("z", None), ("t", None), ("s", None), ("as", 3), ("as", 40)])
def test_chunk_size_does_not_matter(method: str, top_n: int | None, dtype: torch.dtype) -> None:
    x, cohort, enrol, test = random_case(3, dtype, n=30, n_cohort=41, n_trials=60)
    scores = trial_scores(x, enrol, test, "cosine")
    results = [
        normalize_scores(scores, x, enrol, test, cohort, method=method, top_n=top_n, chunk_size=c)
        for c in (None, 1, 2, 7, 40, 1000)
    ]
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], rtol=tolerance, atol=tolerance)


def test_blocks_cover_only_the_trial_embeddings_and_stay_small(monkeypatch: pytest.MonkeyPatch) -> None:
    x, cohort, enrol, test = random_case(4, torch.float64, n=50, n_cohort=20, n_trials=6)
    seen: list[tuple[int, int]] = []
    original = score_norm_module.distance_blocks

    def recording(query: Tensor, gallery: Tensor, **kwargs):  # type: ignore[no-untyped-def]
        for block in original(query, gallery, **kwargs):
            seen.append(tuple(block.distances.shape))
            yield block

    monkeypatch.setattr(score_norm_module, "distance_blocks", recording)
    scores = trial_scores(x, enrol, test, "cosine")
    normalize_scores(scores, x, enrol, test, cohort, method="z", chunk_size=3)
    n_enrolled = torch.unique(enrol).numel()
    assert max(r for r, _ in seen) <= 3 and max(c for _, c in seen) <= 3
    assert sum(r * c for r, c in seen) == n_enrolled * cohort.shape[0]  # each enrolled embedding once, z: no test side


def test_ties_at_the_top_n_boundary() -> None:
    # dot distance on small integers: every score is exact. Embedding 0 = (1, 0) has cohort scores 3, 2, 2, 2, 0:
    # with top_n=3 one of the three items scoring 2 is taken; they are equal, so the statistics are of 3, 2, 2.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    cohort = torch.tensor([[3.0, 0.0], [2.0, 1.0], [2.0, 5.0], [2.0, -1.0], [0.0, 4.0]], dtype=torch.float64)
    enrol, test = torch.tensor([0]), torch.tensor([1])
    for chunk_size in (None, 1, 2):
        z = normalize_scores(
            torch.tensor([0.5], dtype=torch.float64),
            x,
            enrol,
            test,
            cohort,
            method="as",
            top_n=3,
            distance="dot",
            chunk_size=chunk_size,
        )
        # enrol side: 3, 2, 2 (mean 7/3, spread sqrt(2/9)); test side (0, 1): 5, 4, 1 (mean 10/3, spread sqrt(26/9))
        expected = ((0.5 - 7 / 3) / (2 / 9) ** 0.5 + (0.5 - 10 / 3) / (26 / 9) ** 0.5) / 2
        torch.testing.assert_close(z, torch.tensor([expected], dtype=torch.float64))


@pytest.mark.parametrize(("method", "top_n"), [("z", None), ("t", None), ("s", None)])
def test_a_cohort_of_one_item_has_no_spread(method: str, top_n: int | None) -> None:
    x, _, enrol, test = random_case(5, torch.float32)
    scores = trial_scores(x, enrol, test, "cosine")
    with pytest.warns(UserWarning, match=r"25 of 25 normalised scores are NaN"):
        result = normalize_scores(scores, x, enrol, test, x[:1] + 1, method=method, top_n=top_n)
    assert result.isnan().all()


def test_top_n_of_one_has_no_spread() -> None:
    x, cohort, enrol, test = random_case(6, torch.float64)
    with pytest.warns(UserWarning, match=r"25 of 25 normalised scores are NaN"):
        result = normalize_scores(trial_scores(x, enrol, test, "cosine"), x, enrol, test, cohort, method="as", top_n=1)
    assert result.isnan().all()


def test_equal_cohort_scores_have_exactly_no_spread() -> None:
    # 0.1 repeated: its float64 mean is not exactly 0.1, yet the spread must be 0, not a rounding residue.
    x = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    cohort = torch.full((7, 1), 0.1, dtype=torch.float64)
    enrol, test = torch.tensor([0, 1]), torch.tensor([1, 1])
    with pytest.warns(UserWarning, match=r"2 of 2 normalised scores are NaN"):
        result = normalize_scores(
            torch.tensor([2.0, 4.0], dtype=torch.float64),
            x,
            enrol,
            test,
            cohort,
            method="z",
            distance="dot",
            chunk_size=3,
        )
    assert result.isnan().all()


def test_only_the_undefined_trials_are_nan() -> None:
    # Embedding 1 = (0, 1) scores 0 against every cohort item (dot): spread 0; embedding 0 does not.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    cohort = torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    scores = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"1 of 3 normalised scores are NaN"):
        z = normalize_scores(
            scores, x, torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]), cohort, method="z", distance="dot"
        )
    torch.testing.assert_close(z[[0, 2]], torch.tensor([-2.0, -1.0], dtype=torch.float64))  # mean 2, spread 1
    assert z[1].isnan()


def test_shared_ids_warn_with_the_count() -> None:
    x, cohort, enrol, test = random_case(7, torch.float64)
    embedding_ids = torch.arange(12)
    cohort_ids = torch.arange(17) + 100
    cohort_ids[[2, 5, 9]] = embedding_ids[enrol[0]]  # one trial speaker three times in the cohort
    scores = trial_scores(x, enrol, test, "cosine")
    with pytest.warns(UserWarning, match=r"3 of 17 cohort items share an id \(1 distinct id\(s\)\)"):
        normalize_scores(scores, x, enrol, test, cohort, method="s", embedding_ids=embedding_ids, cohort_ids=cohort_ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        normalize_scores(
            scores, x, enrol, test, cohort, method="s", embedding_ids=embedding_ids, cohort_ids=torch.arange(17) + 100
        )


def test_scores_of_minus_a_distance_may_round_above_zero_and_dot_scores_have_any_sign() -> None:
    x, cohort, enrol, test = random_case(10, torch.float32, n=6, n_cohort=5, n_trials=4)
    slightly_positive = torch.full((4,), 1e-6)
    assert normalize_scores(slightly_positive, x, enrol, test, cohort, method="z").isfinite().all()
    dot_scores = trial_scores(x, enrol, test, "dot") + 10  # far above 0: fine for dot
    result, expected = run(x, cohort, enrol, test, "s", None, "dot")
    assert normalize_scores(dot_scores, x, enrol, test, cohort, method="s", distance="dot").isfinite().all()
    np.testing.assert_allclose(result.double().numpy(), expected, rtol=2e-6, atol=2e-6)


def test_empty_trial_list() -> None:
    x, cohort, _, _ = random_case(8, torch.float32)
    empty = torch.zeros(0, dtype=torch.long)
    result = normalize_scores(torch.zeros(0), x, empty, empty, cohort, method="as", top_n=2)
    assert result.shape == (0,) and result.dtype == torch.float32


X, COHORT, ENROL, TEST = random_case(9, torch.float32, n=6, n_cohort=5, n_trials=4)
GOOD = {"scores": torch.zeros(4), "embeddings": X, "enrol_index": ENROL, "test_index": TEST, "cohort": COHORT}


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"method": "zt"}, ValueError, r"`method` must be one of .*got 'zt'"),
        ({"method": "as"}, ValueError, r"`top_n` must be given with method='as'"),
        ({"method": "as", "top_n": 6}, ValueError, r"`top_n` must be at most the 5 items of `cohort`, got 6"),
        ({"method": "as", "top_n": 0}, ValueError, r"`top_n` must be an int >= 1, got 0"),
        ({"method": "as", "top_n": 2.0}, TypeError, r"`top_n` must be an int >= 1"),
        ({"top_n": 3}, ValueError, r"`top_n` is used by method='as' only, got top_n=3 with method='z'"),
        ({"distance": "l1"}, ValueError, r"`distance` must be one of"),
        ({"scores": torch.full((4,), 0.8)}, ValueError, r"`scores` must be minus the cosine distance \(cos - 1, not"),
        ({"scores": torch.ones(4), "distance": "euclidean"}, ValueError, r"`scores` must be minus the euclidean"),
        ({"chunk_size": 0}, ValueError, r"`chunk_size`"),
        ({"scores": torch.zeros(3)}, ValueError, r"`enrol_index` must have 3 rows like `scores`"),
        ({"scores": torch.zeros(4, 1)}, ValueError, r"`scores` must be 1-D"),
        ({"scores": torch.zeros(4, dtype=torch.long)}, TypeError, r"`scores` must have a floating dtype"),
        ({"scores": torch.tensor([0.0, float("nan"), 0.0, 0.0])}, ValueError, r"`scores` must be finite.*1 of 4"),
        ({"scores": [0.0] * 4}, TypeError, r"`scores` must be a 1-D floating torch.Tensor"),
        ({"enrol_index": torch.tensor([0, 1, 6, 2])}, ValueError, r"`enrol_index` must hold rows .*\[0, 6\).*\[0, 6\]"),
        (
            {"test_index": torch.tensor([0, -1, 3, 2])},
            ValueError,
            r"`test_index` must hold rows .*got values in \[-1, 3\]",
        ),
        ({"test_index": torch.tensor([0.0, 1.0, 3.0, 2.0])}, TypeError, r"`test_index` must have an integer dtype"),
        ({"test_index": TEST[:, None]}, ValueError, r"`test_index` must be 1-D"),
        ({"cohort": COHORT[:, :2]}, ValueError, r"`cohort` must have 4 columns like `embeddings`"),
        ({"cohort": COHORT[:0]}, ValueError, r"`cohort` must have at least one row"),
        ({"embeddings": X.double().long()}, TypeError, r"`embeddings` must have a floating dtype"),
        ({"embedding_ids": torch.arange(6)}, ValueError, r"`cohort_ids` must be given with `embedding_ids`"),
        ({"cohort_ids": torch.arange(5)}, ValueError, r"`embedding_ids` must be given with `cohort_ids`"),
        ({"embedding_ids": torch.arange(5), "cohort_ids": torch.arange(5)}, ValueError, r"`embedding_ids` must have 6"),
        (
            {"embedding_ids": torch.arange(6), "cohort_ids": torch.ones(5)},
            TypeError,
            r"`cohort_ids` must have an integer",
        ),
    ],
)
def test_bad_input_is_named(overrides: dict[str, object], error: type[Exception], message: str) -> None:
    kwargs = {"method": "z", **GOOD, **overrides}
    with pytest.raises(error, match=message):
        normalize_scores(**kwargs)  # type: ignore[arg-type]
