"""compare_models and the bootstrap helper against oracles that are not ours: scipy's ttest_rel, ranx's Fisher
randomization test, the exact randomization p-value by enumerating every sign vector, the coverage that theory
predicts for the percentile bootstrap, and slow Python references replaying the helper's draws."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

import torchmetrics_retrieval.functional as F
from torchmetrics_retrieval.functional import _bootstrap
from torchmetrics_retrieval.functional._bootstrap import _resample_indices, bootstrap_interval
from torchmetrics_retrieval.functional.comparison import ComparisonTest, compare_models

KEYS = ("mean_a", "mean_b", "difference", "ci_low", "ci_high", "p_value")


def replayed_indices(n_rows: int, n_resamples: int, seed: int) -> np.ndarray:
    """The helper's row indices, all blocks, as one (R, Q) array."""
    return torch.cat(list(_resample_indices(n_rows, n_resamples, seed))).numpy()


def numpy_interval(stats_: np.ndarray, confidence_level: float) -> np.ndarray:
    return np.quantile(stats_, [(1 - confidence_level) / 2, (1 + confidence_level) / 2], axis=0)


def mc_tolerance(p: float, *n_resamples: int) -> float:
    """4 binomial standard errors of the difference of independent Monte-Carlo estimates of ``p``, plus the
    ``1/(R+1)`` by which our ``(1 + k)/(1 + R)`` may exceed a plain proportion."""
    variance = sum(p * (1 - p) / r for r in n_resamples)
    return 4 * math.sqrt(variance) + 1 / (min(n_resamples) + 1)


# ---- paired t-test: scipy ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 12, 100, 5000])
@pytest.mark.parametrize("shift", [0.0, 0.05, 0.4, -0.4, 3.0, -3.0])
def test_paired_t_equals_scipy(n: int, shift: float) -> None:
    rng = np.random.default_rng(1000 * n + int(10 * shift) % 97)
    a = rng.normal(size=n)
    b = a + shift + rng.normal(scale=0.7, size=n)
    expected = stats.ttest_rel(b, a).pvalue
    got = compare_models(torch.from_numpy(a), torch.from_numpy(b), n_resamples=10)["p_value"]  # (the interval's)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.item(), expected, rtol=1e-6, atol=1e-300)  # scipy underflows to 0 below


def test_paired_t_tiny_p_values_and_direction() -> None:
    # Effects so clear that p is far below 1e-10, in both directions (a "one-sided-looking" comparison is still
    # two-sided): swapping the models gives the same p-value.
    rng = np.random.default_rng(7)
    a = rng.uniform(size=300)
    b = a + 0.2 + rng.normal(scale=0.1, size=300)
    expected = stats.ttest_rel(b, a).pvalue
    assert expected < 1e-10
    forward = compare_models(torch.from_numpy(a), torch.from_numpy(b), n_resamples=10)["p_value"].item()
    backward = compare_models(torch.from_numpy(b), torch.from_numpy(a), n_resamples=10)["p_value"].item()
    np.testing.assert_allclose([forward, backward], [expected, expected], rtol=1e-6, atol=0)


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # scipy's, on constant differences
def test_paired_t_zero_variance() -> None:
    a = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    for test in ("paired_t", "randomization", "bootstrap"):  # identical inputs: no evidence of a difference
        assert compare_models(a, a.clone(), test=test)["p_value"].item() == 1.0
    constant = compare_models(a, a + 0.5)  # exactly representable: every difference is exactly 0.5
    assert constant["p_value"].item() == 0.0 and constant["difference"].item() == 0.5
    assert stats.ttest_rel((a + 0.5).numpy(), a.numpy()).pvalue == 0.0  # scipy agrees here (t = inf)


# ---- randomization test: exact enumeration and ranx ----------------------------------------------------------------


def exact_randomization_p(d: np.ndarray) -> float:
    """Every one of the 2**n sign vectors (the observed one included)."""
    observed = abs(d.sum())
    extreme = sum(abs(np.dot(signs, d)) >= observed for signs in itertools.product((-1.0, 1.0), repeat=d.shape[0]))
    return extreme / 2 ** d.shape[0]


@pytest.mark.parametrize(
    "d",
    [
        np.random.default_rng(4).normal(0.6, 1.0, size=8),
        np.array([0.5, 0.25, 0.5, -0.125, 0.25, 0.0, -0.25, 0.5]),  # dyadic: exact sums, so genuine ties
    ],
    ids=["normal", "dyadic_with_ties"],
)
def test_randomization_matches_exact_enumeration(d: np.ndarray) -> None:
    exact = exact_randomization_p(d)
    assert 0.02 < exact < 0.9  # a p-value the Monte-Carlo estimate can be judged on
    n_resamples = 20000
    a = torch.zeros(8, dtype=torch.float64)
    got = compare_models(a, torch.from_numpy(d), test="randomization", n_resamples=n_resamples, seed=5)["p_value"]
    assert abs(got.item() - exact) <= mc_tolerance(exact, n_resamples)


def test_randomization_agrees_with_ranx_fisher() -> None:
    # ranx's own Fisher randomization test (what `ranx.compare(..., stat_test="fisher")` runs on the per-query
    # values), called directly: the rest of ranx would only add seconds of compilation. Per-query values in
    # eighths (precision@8 of queries with eight relevant items) over 64 queries: ranx compares |mean
    # differences| without any tolerance, so rounding would split the many exact ties of such discrete values at
    # random; eighths make every sum and mean exact in both implementations, and ties count alike.
    from ranx.statistical_tests.fisher_randomization_test import fisher_randomization_test

    rng = np.random.default_rng(11)
    n_query, n_resamples = 64, 20000
    hits = {"a": rng.integers(0, 9, n_query)}
    hits["b"] = np.clip(hits["a"] + rng.integers(-2, 3, n_query), 0, 8)  # a small effect
    hits["c"] = np.clip(hits["a"] + rng.integers(-3, 4, n_query), 0, 8)
    p_values = []
    for x, y in [("a", "b"), ("a", "c"), ("b", "c")]:
        values = {name: hits[name] / 8 for name in (x, y)}
        theirs, _ = fisher_randomization_test(values[x], values[y], n_resamples)
        ours = compare_models(
            torch.from_numpy(values[x]), torch.from_numpy(values[y]), test="randomization", n_resamples=n_resamples
        )["p_value"].item()
        p_values.append((ours, theirs))
        assert abs(ours - theirs) <= mc_tolerance((ours + theirs) / 2, n_resamples, n_resamples), (x, y)
    assert any(0.02 < theirs < 0.9 for _, theirs in p_values)  # at least one comparison away from 0 and 1


# ---- bootstrap interval: coverage and slow references --------------------------------------------------------------


def test_bootstrap_interval_covers_the_mean_at_the_predicted_rate() -> None:
    # For normal data the percentile interval of the mean is close to xbar +- z * s_ml / sqrt(n) with the plug-in
    # s_ml = s * sqrt((n - 1) / n); as (xbar - mu) / (s / sqrt(n)) is Student's t(n - 1), its coverage is
    # P(|T| <= z * sqrt((n - 1) / n)) < 0.95: the percentile bootstrap's known undercoverage (z for t, s_ml for s).
    # The endpoints, quantiles of R resamples, carry noise of variance q(1 - q) / (R phi(z)^2) (in units of the
    # standard error); it lowers the coverage by about z q (1 - q) / (R phi(z)) more. The skewness of each
    # sample's bootstrap distribution shifts both endpoints alike, a second-order effect (~1e-5 here).
    n_sets, n, n_bootstrap, level = 400, 200, 1000, 0.95
    z, q = stats.norm.ppf((1 + level) / 2), (1 - level) / 2
    predicted = 1 - 2 * stats.t.sf(z * math.sqrt((n - 1) / n), n - 1)
    predicted -= z * q * (1 - q) / (n_bootstrap * stats.norm.pdf(z))
    generator = torch.Generator().manual_seed(2024)
    data = torch.randn(n_sets, n, generator=generator, dtype=torch.float64) + 3.0  # known mean 3
    covered = 0
    for i in range(n_sets):
        low, high = bootstrap_interval(data[i], confidence_level=level, n_bootstrap=n_bootstrap, seed=i)
        covered += int(low.item() <= 3.0 <= high.item())
    coverage = covered / n_sets
    binomial = 4 * math.sqrt(predicted * (1 - predicted) / n_sets)
    assert abs(coverage - predicted) <= binomial
    assert abs(coverage - level) <= 4 * math.sqrt(level * (1 - level) / n_sets) + (level - predicted)


@pytest.mark.parametrize("n_cols", [None, 3])
def test_bootstrap_interval_equals_numpy_on_the_same_draws(n_cols: int | None) -> None:
    rng = np.random.default_rng(5)
    values = rng.normal(size=(37,) if n_cols is None else (37, n_cols))
    low, high = bootstrap_interval(torch.from_numpy(values), confidence_level=0.9, n_bootstrap=500, seed=3)
    indices = replayed_indices(37, 500, 3)
    expected = numpy_interval(values[indices].mean(axis=1), 0.9)
    assert low.shape == values.shape[1:] and low.dtype == torch.float64
    np.testing.assert_allclose(np.stack([low.numpy(), high.numpy()]), expected, rtol=1e-12, atol=1e-15)


def slow_grouped_statistics(values: np.ndarray, groups: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Per resample: the mean over the groups present in the resample of the mean of that group's rows."""
    out = []
    for rows in indices:
        group_means = [values[rows[groups[rows] == g]].mean(axis=0) for g in sorted(set(groups[rows].tolist()))]
        out.append(np.mean(group_means, axis=0))
    return np.array(out)


@pytest.mark.parametrize("n_cols", [None, 2])
def test_bootstrap_interval_with_groups_equals_slow_reference(n_cols: int | None) -> None:
    rng = np.random.default_rng(8)
    n_rows = 40
    values = rng.normal(size=(n_rows,) if n_cols is None else (n_rows, n_cols))
    groups = np.concatenate([np.zeros(20), np.ones(12), np.full(5, 2), [3, 4, 4]]).astype(np.int64)  # rare groups
    rng.shuffle(groups)
    low, high = bootstrap_interval(
        torch.from_numpy(values), confidence_level=0.8, n_bootstrap=300, seed=9, groups=torch.from_numpy(groups)
    )
    reference = slow_grouped_statistics(values, groups, replayed_indices(n_rows, 300, 9))
    expected = numpy_interval(reference, 0.8)
    np.testing.assert_allclose(np.stack([low.numpy(), high.numpy()]), expected, rtol=1e-12, atol=1e-15)
    ungrouped = bootstrap_interval(torch.from_numpy(values), confidence_level=0.8, n_bootstrap=300, seed=9)
    assert not torch.allclose(low, ungrouped[0])  # the groups change the statistic


def test_compare_models_interval_and_bootstrap_p_replay_the_draws() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.uniform(size=50), rng.uniform(size=50) + 0.1
    result = compare_models(torch.from_numpy(a), torch.from_numpy(b), test="bootstrap", n_resamples=2000, seed=6)
    d = b - a
    means = d[replayed_indices(50, 2000, 6)].mean(axis=1)
    low, high = numpy_interval(means, 0.95)
    np.testing.assert_allclose([result["ci_low"].item(), result["ci_high"].item()], [low, high], rtol=1e-12)
    expected_p = (1 + np.sum(np.abs(means - d.mean()) >= abs(d.mean()))) / (1 + 2000)
    np.testing.assert_allclose(result["p_value"].item(), expected_p, rtol=1e-12)
    np.testing.assert_allclose(
        [result[key].item() for key in ("mean_a", "mean_b", "difference")], [a.mean(), b.mean(), d.mean()]
    )
    helper = bootstrap_interval(torch.from_numpy(d), n_bootstrap=2000, seed=6)
    assert result["ci_low"].item() == helper[0].item() and result["ci_high"].item() == helper[1].item()


# ---- determinism, blocks, dtypes, devices --------------------------------------------------------------------------


@pytest.mark.parametrize("test", ["paired_t", "randomization", "bootstrap"])
def test_deterministic_for_a_seed_and_independent_of_the_block_size(
    test: ComparisonTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = torch.rand(30, generator=torch.Generator().manual_seed(0))
    b = a + 0.05 * torch.randn(30, generator=torch.Generator().manual_seed(1))
    first = compare_models(a, b, test=test, n_resamples=777, seed=3)
    again = compare_models(a, b, test=test, n_resamples=777, seed=3)
    monkeypatch.setattr(_bootstrap, "_DRAW_BUDGET", 30 * 7)  # blocks of 7 resamples, the last one shorter
    small_blocks = compare_models(a, b, test=test, n_resamples=777, seed=3)
    for key in KEYS:
        assert torch.equal(first[key], again[key]) and torch.equal(first[key], small_blocks[key]), key
    other = compare_models(a, b, test=test, n_resamples=777, seed=4)
    assert other["ci_low"].item() != first["ci_low"].item()


def test_dtypes_and_shapes() -> None:
    a = torch.tensor([0.1, 0.4, 0.3, 0.8])
    result = compare_models(a, a.flip(0))
    assert set(result) == set(KEYS)
    assert all(value.shape == () for value in result.values())
    assert all(value.dtype == (torch.float64 if key == "p_value" else torch.float32) for key, value in result.items())
    mixed = compare_models(a, a.double() + 0.1)
    assert all(value.dtype == torch.float64 for value in mixed.values())
    assert F.compare_models is compare_models


def test_tiny_p_values_of_float32_inputs_do_not_underflow() -> None:
    """Thousands of float32 per-query values with a clear difference: scipy's p-value is far below float32's
    smallest positive number; ours is float64 and agrees with it."""
    from scipy.stats import ttest_rel

    g = torch.Generator().manual_seed(0)
    a = torch.rand(3000, generator=g)
    b = a + 0.0031 + 0.01 * torch.randn(3000, generator=g)  # t about 17: p about 1e-62
    expected = ttest_rel(b.double().numpy(), a.double().numpy()).pvalue
    assert 0 < expected < 1e-50  # below float32's smallest positive number
    found = compare_models(a, b)["p_value"]
    assert found.dtype == torch.float64 and float(found) == pytest.approx(expected, rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_same_results_on_cuda() -> None:
    a, b = torch.rand(100, dtype=torch.float64), torch.rand(100, dtype=torch.float64)
    for test in ("paired_t", "randomization", "bootstrap"):
        cpu = compare_models(a, b, test=test)
        cuda = compare_models(a.cuda(), b.cuda(), test=test)
        for key in KEYS:
            assert cuda[key].device.type == "cuda"
            torch.testing.assert_close(cuda[key].cpu(), cpu[key], rtol=1e-9, atol=1e-12)


# ---- errors --------------------------------------------------------------------------------------------------------

A = torch.tensor([0.1, 0.5, 0.3])


@pytest.mark.parametrize(
    ("kwargs", "name", "error"),
    [
        ({"per_query_b": torch.tensor([0.1, 0.2])}, "per_query_b", ValueError),  # lengths differ
        ({"confidence_level": 0}, "confidence_level", ValueError),
        ({"confidence_level": 1.0}, "confidence_level", ValueError),
        ({"confidence_level": float("nan")}, "confidence_level", ValueError),
        ({"confidence_level": "0.9"}, "confidence_level", TypeError),
        ({"n_resamples": 0}, "n_resamples", ValueError),
        ({"n_resamples": 10.0}, "n_resamples", TypeError),
        ({"test": "wilcoxon"}, "test", ValueError),
        ({"seed": -1}, "seed", ValueError),
        ({"seed": True}, "seed", TypeError),
        ({"per_query_a": [0.1, 0.5, 0.3]}, "per_query_a", TypeError),  # not a tensor
        ({"per_query_a": np.array([0.1, 0.5, 0.3])}, "per_query_a", TypeError),
        ({"per_query_a": A[:, None]}, "per_query_a", ValueError),  # 2-D
        ({"per_query_b": torch.tensor([0.1, float("nan"), 0.3])}, "per_query_b", ValueError),
        ({"per_query_b": torch.tensor([0.1, float("inf"), 0.3])}, "per_query_b", ValueError),
        ({"per_query_a": torch.tensor([1, 0, 1])}, "per_query_a", TypeError),  # integer dtype
        ({"per_query_a": A[:1], "per_query_b": A[:1]}, "per_query_a", ValueError),  # one query
    ],
)
def test_compare_models_errors_name_the_argument(kwargs: dict[str, Any], name: str, error: type) -> None:
    call = {"per_query_a": A, "per_query_b": A + 0.1, **kwargs}
    with pytest.raises(error, match=f"`{name}`"):
        compare_models(**call)


@pytest.mark.parametrize(
    ("kwargs", "name", "error"),
    [
        ({"values": [0.1, 0.2]}, "values", TypeError),
        ({"values": torch.zeros(2, 2, 2)}, "values", ValueError),
        ({"values": torch.zeros(0)}, "values", ValueError),
        ({"values": torch.tensor([1, 2])}, "values", TypeError),
        ({"values": torch.tensor([0.1, float("nan")])}, "values", ValueError),
        ({"confidence_level": 1}, "confidence_level", ValueError),
        ({"n_bootstrap": 0}, "n_bootstrap", ValueError),
        ({"seed": 1.5}, "seed", TypeError),
        ({"groups": torch.tensor([0.0, 1.0, 0.0])}, "groups", TypeError),
        ({"groups": torch.tensor([0, 1])}, "groups", ValueError),
        ({"groups": torch.tensor([[0, 1, 0]])}, "groups", ValueError),
        ({"groups": torch.tensor([0, -1, 0])}, "groups", ValueError),
        ({"groups": torch.tensor([0, 3, 0])}, "groups", ValueError),  # not dense
    ],
)
def test_bootstrap_interval_errors_name_the_argument(kwargs: dict[str, Any], name: str, error: type) -> None:
    call = {"values": torch.tensor([0.1, 0.5, 0.3]), **kwargs}
    with pytest.raises(error, match=f"`{name}`"):
        bootstrap_interval(**call)


def test_id_value_pairs_are_aligned_by_id() -> None:
    """Two models' ``(ids, values)`` in different query orders compare as the aligned vectors do."""
    from torchmetrics_retrieval import EmbeddingMetrics

    g = torch.Generator().manual_seed(5)
    labels = torch.randint(0, 6, (60,), generator=g)
    x_a = torch.randn(60, 4, generator=g) + labels[:, None].float()
    x_b = x_a + 0.8 * torch.randn(60, 4, generator=g)
    pairs = []
    for x, order in ((x_a, torch.arange(60)), (x_b, torch.randperm(60, generator=g))):
        metric = EmbeddingMetrics(cmc_top_k=(1,), precision_top_k=(), map_top_k=(), map_at_r=True)
        for rows in order.split(13):
            metric.update(x[rows], labels[rows], indexes=rows + 1000)
        pairs.append(metric.per_query_values("map_at_r"))
    ids_a, values_a = pairs[0]
    ids_b, values_b = pairs[1]
    assert sorted(ids_a.tolist()) == sorted(ids_b.tolist()) == list(range(1000, 1060))
    aligned_b = values_b[torch.argsort(ids_b)][torch.argsort(torch.argsort(ids_a))]
    assert compare_models(pairs[0], pairs[1]) == compare_models(values_a, aligned_b)
    shuffled = torch.randperm(60, generator=g)
    assert compare_models(pairs[0], (ids_b[shuffled], values_b[shuffled])) == compare_models(values_a, aligned_b)
