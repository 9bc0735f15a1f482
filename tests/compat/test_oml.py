"""compat.oml against open-metric-learning's documented examples, hand-computed edge cases and a slow reference.

open-metric-learning itself is not a test dependency: the reference below restates its per-query rules
with plain Python loops, and every edge case is computed by hand.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchmetrics_retrieval.compat.oml import (
    OVERALL_CATEGORIES_KEY,
    calc_cmc,
    calc_fnmr_at_fmr,
    calc_map,
    calc_pcf,
    calc_precision,
    calc_retrieval_metrics,
    calc_topological_metrics,
    to_oml_nested,
)
from torchmetrics_retrieval.functional import knn, retrieval_metrics

B = torch.BoolTensor
L = torch.LongTensor
NAN = math.nan


def assert_values(actual: list[torch.Tensor], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), equal_nan=True)


def assert_nested_close(actual: Any, expected: Any) -> None:
    """Same keys in the same order, values equal up to float32 rounding (NaN equal to NaN)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert list(actual) == list(expected)
        for key in expected:
            assert_nested_close(actual[key], expected[key])
    else:
        torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), equal_nan=True)


# ---------------------------------------------------------------------------------------------------
# The documented examples of open-metric-learning (seed 004)
# ---------------------------------------------------------------------------------------------------


def test_documented_calc_cmc() -> None:
    gt_tops = [B([1, 0]), B([0, 1, 1]), B([0, 0]), B([])]
    assert_values(calc_cmc(gt_tops, [2, 2, 1, 0], top_k=(1, 2)), [[1, 0, 0, 1], [1, 1, 0, 1]])


def test_documented_calc_precision() -> None:
    gt_tops = [B([1, 0]), B([0, 1, 1]), B([0, 0]), B([])]
    assert_values(calc_precision(gt_tops, [2, 3, 5, 2], top_k=(1, 2)), [[1, 0, 0, 0], [0.5, 0.5, 0, 0]])


def test_documented_calc_map() -> None:
    gt_tops = [B([1, 0]), B([0, 1]), B([0, 0, 0, 0]), B([])]
    assert_values(calc_map(gt_tops, [1, 1, 2, 0], top_k=(1, 2)), [[1, 0, 0, 1], [1, 0.5, 0, 1]])


def test_documented_precision_denominator() -> None:
    """The docstring's n = 3, g = [1, 1, 1, 0, 0]: OML precision@k is 1 for every k up to 6."""
    assert_values(calc_precision([B([1, 1, 1, 0, 0])], [3], top_k=(1, 2, 3, 4, 5, 6)), [[1.0]] * 6)


def test_documented_calc_fnmr_at_fmr() -> None:
    pos_dist = np.array([0, 0, 1, 1, 2, 2, 5, 5, 9, 9])
    neg_dist = np.array([3, 3, 4, 4, 6, 6, 7, 7, 8, 8])
    result = calc_fnmr_at_fmr(pos_dist, neg_dist, fmr_vals=(0.1, 0.5))
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, torch.tensor([0.4, 0.2]))


def test_documented_calc_pcf() -> None:
    result = calc_pcf(torch.eye(4, 10, dtype=torch.float), pcf_variance=(0.5, 1))
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
    torch.testing.assert_close(result, torch.tensor([0.2, 0.5]))


# ---------------------------------------------------------------------------------------------------
# calc_cmc / calc_precision / calc_map: edge cases by hand
# ---------------------------------------------------------------------------------------------------


def test_cutoff_beyond_the_list_and_empty_lists() -> None:
    # [F, T] with k = 5: cmc 1, precision 1 / min(5, n=3, L=2) = 0.5, map P@2 = 0.5
    # [] with n = 0: all 1; [] with n = 4: all 0
    gt_tops = [B([0, 1]), B([]), B([])]
    n_gts = [3, 0, 4]
    assert_values(calc_cmc(gt_tops, n_gts, (5,)), [[1, 1, 0]])
    assert_values(calc_precision(gt_tops, n_gts, (5,)), [[0.5, 1, 0]])
    assert_values(calc_map(gt_tops, n_gts, (5,)), [[0.5, 1, 0]])


def test_no_ground_truth_with_a_list() -> None:
    """n = 0 with a non-empty list: precision divides by min(0, k) = 0 -> NaN (inf when hits are given)."""
    gt_tops = [B([0, 0]), B([1, 0])]
    assert_values(calc_precision(gt_tops, [0, 0], (1, 2)), [[NAN, math.inf], [NAN, math.inf]])
    assert_values(calc_cmc(gt_tops, [0, 0], (1,)), [[0, 1]])
    assert_values(calc_map(gt_tops, [0, 0], (2,)), [[0, 1]])


def test_map_hand_computed() -> None:
    # hits F T F T T: P@2 = 1/2, P@4 = 2/4, P@5 = 3/5 -> map@5 = (0.5 + 0.5 + 0.6) / 3, map@3 = 0.5
    assert_values(calc_map([B([0, 1, 0, 1, 1])], [7], (3, 5, 1)), [[0.5], [1.6 / 3], [0.0]])


def test_order_and_repeats_of_cutoffs_are_kept() -> None:
    assert_values(calc_cmc([B([0, 1])], [1], (2, 1, 2)), [[1], [0], [1]])


def test_no_queries() -> None:
    assert_values(calc_cmc([], [], (1, 2)), [[], []])
    assert_values(calc_precision([], [], (3,)), [[]])


@pytest.mark.parametrize("top_k", [(), (0,), (1, -2), (1.5,), "5", 3])
def test_bad_cutoffs(top_k: Any) -> None:
    with pytest.raises(ValueError, match="top_k"):
        calc_cmc([B([1])], [1], top_k)


def test_bad_tops() -> None:
    with pytest.raises(ValueError, match="n_gts"):
        calc_map([B([1]), B([0])], [1], (1,))
    with pytest.raises(ValueError, match="gt_tops"):
        calc_precision([torch.ones(2, 2, dtype=torch.bool)], [1], (1,))


# ---------------------------------------------------------------------------------------------------
# calc_retrieval_metrics: nesting, categories, reduce, edge cases
# ---------------------------------------------------------------------------------------------------

RETRIEVED = [L([3, 1, 2]), L([0, 2]), L([]), L([5]), L([4, 4, 0])]
GT = [L([1, 2]), L([]), L([]), L([6, 7]), L([0, 4, 4])]
# by hand, per query (hits; n):
#   q0: F T T; 2    q1: F F; 0 (no ground truth)    q2: empty; 0    q3: F; 2    q4: T T T; 3
CMC_1 = [0.0, 0.0, 1.0, 0.0, 1.0]
CMC_2 = [1.0, 0.0, 1.0, 0.0, 1.0]
PRECISION_2 = [0.5, NAN, 1.0, 0.0, 1.0]  # q3: 0 / min(2, 2, L=1)
MAP_3 = [(1 / 2 + 2 / 3) / 2, 0.0, 1.0, 0.0, 1.0]


def test_retrieval_metrics_per_query() -> None:
    out = calc_retrieval_metrics(
        RETRIEVED, GT, cmc_top_k=(1, 2), precision_top_k=(2,), map_top_k=(3,), reduce=False, verbose=True
    )
    assert list(out) == ["cmc", "precision", "map"]
    assert list(out["cmc"]) == [1, 2]
    assert_nested_close(out, {"cmc": {1: CMC_1, 2: CMC_2}, "precision": {2: PRECISION_2}, "map": {3: MAP_3}})


def test_retrieval_metrics_reduced() -> None:
    out = calc_retrieval_metrics(RETRIEVED, GT, cmc_top_k=(2,), precision_top_k=(2,), map_top_k=(3,))
    assert all(value.ndim == 0 for metric in out.values() for value in metric.values())
    assert_nested_close(out, {"cmc": {2: 0.6}, "precision": {2: NAN}, "map": {3: (sum(MAP_3)) / 5}})


def test_retrieval_metrics_defaults_and_empty_cutoffs() -> None:
    out = calc_retrieval_metrics(RETRIEVED, GT)
    assert {name: list(values) for name, values in out.items()} == {"cmc": [5], "precision": [5], "map": [5]}
    assert calc_retrieval_metrics(RETRIEVED, GT, cmc_top_k=(), precision_top_k=(), map_top_k=()) == {}
    only_map = calc_retrieval_metrics(RETRIEVED, GT, cmc_top_k=(), precision_top_k=(), map_top_k=(3,))
    assert list(only_map) == ["map"]


def test_retrieval_metrics_categories() -> None:
    categories = np.array(["b", "a", "b", "c", "a"])
    out = calc_retrieval_metrics(
        RETRIEVED, GT, categories, cmc_top_k=(1,), precision_top_k=(), map_top_k=(3,), reduce=False
    )
    assert list(out) == [OVERALL_CATEGORIES_KEY, "b", "a", "c"]  # order of first appearance
    assert all(isinstance(key, np.str_) for key in list(out)[1:])
    assert_nested_close(out["b"], {"cmc": {1: [0.0, 1.0]}, "map": {3: [MAP_3[0], 1.0]}})
    assert_nested_close(out["a"], {"cmc": {1: [0.0, 1.0]}, "map": {3: [0.0, 1.0]}})
    assert_nested_close(out["c"], {"cmc": {1: [0.0]}, "map": {3: [0.0]}})
    reduced = calc_retrieval_metrics(RETRIEVED, GT, categories, cmc_top_k=(1,), precision_top_k=(2,), map_top_k=())
    assert_nested_close(
        reduced,
        {
            OVERALL_CATEGORIES_KEY: {"cmc": {1: 0.4}, "precision": {2: NAN}},
            "b": {"cmc": {1: 0.5}, "precision": {2: 0.75}},
            "a": {"cmc": {1: 0.5}, "precision": {2: NAN}},
            "c": {"cmc": {1: 0.0}, "precision": {2: 0.0}},
        },
    )


def test_retrieval_metrics_tensor_categories_are_keyed_by_value() -> None:
    out = calc_retrieval_metrics(RETRIEVED, GT, torch.tensor([7, 3, 7, 7, 3]), cmc_top_k=(2,), precision_top_k=())
    assert list(out) == [OVERALL_CATEGORIES_KEY, 7, 3]
    assert_nested_close(out[3], {"cmc": {2: 0.5}, "map": {5: 0.5}})


def test_retrieval_metrics_no_queries() -> None:
    out = calc_retrieval_metrics([], [], cmc_top_k=(1,), precision_top_k=(), map_top_k=(), reduce=False)
    assert out["cmc"][1].shape == (0,)
    assert math.isnan(calc_retrieval_metrics([], [], cmc_top_k=(1,))["cmc"][1])


def test_retrieval_metrics_large_and_negative_ids() -> None:
    """Ids are matched per query, whatever their range (one key space for all queries)."""
    retrieved = [L([-5, 10**12]), L([10**12, -5])]
    relevant = [L([10**12]), L([3])]
    out = calc_retrieval_metrics(retrieved, relevant, cmc_top_k=(1, 2), precision_top_k=(), map_top_k=(), reduce=False)
    assert_nested_close(out, {"cmc": {1: [0.0, 0.0], 2: [1.0, 0.0]}})


def test_retrieval_metrics_errors() -> None:
    with pytest.raises(ValueError, match="gt_ids"):
        calc_retrieval_metrics(RETRIEVED, GT[:2])
    with pytest.raises(ValueError, match="query_categories"):
        calc_retrieval_metrics(RETRIEVED, GT, np.array([1, 2]))
    with pytest.raises(ValueError, match="cmc_top_k"):
        calc_retrieval_metrics(RETRIEVED, GT, cmc_top_k=(0,))
    with pytest.raises(ValueError, match="precision_top_k"):
        calc_retrieval_metrics(RETRIEVED, GT, precision_top_k=(2.0,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retrieved_ids"):
        calc_retrieval_metrics([torch.tensor([1.0])], [L([1])])
    with pytest.raises(ValueError, match="gt_ids"):
        calc_retrieval_metrics([L([1])], [L([[1]])])


# ---------------------------------------------------------------------------------------------------
# Slow reference: OML's per-query rules restated with plain loops
# ---------------------------------------------------------------------------------------------------


def reference_query(tops: list[bool], n: int, k: int) -> tuple[float, float, float]:
    """(cmc@k, precision@k, map@k) of one query, by open-metric-learning's rules."""
    if not tops:
        value = 1.0 if n == 0 else 0.0
        return value, value, value
    first = tops[:k]
    hits = sum(first)
    cmc = 1.0 if hits else 0.0
    denominator = min(n, k, len(tops))
    if denominator:
        precision = hits / denominator
    else:
        precision = math.nan if hits == 0 else math.inf
    found, precision_sum = 0, 0.0
    for i, relevant in enumerate(first, start=1):
        if relevant:
            found += 1
            precision_sum += found / i
    average_precision = precision_sum / found if found else 0.0
    return cmc, precision, average_precision


def reference_metrics(retrieved: list[list[int]], relevant: list[list[int]], k: int) -> list[list[float]]:
    rows = [reference_query([r in g for r in rs], len(g), k) for rs, g in zip(retrieved, relevant, strict=True)]
    return [[row[i] for row in rows] for i in range(3)]


ids = st.lists(st.integers(0, 9), max_size=7)


@given(
    queries=st.lists(st.tuples(ids, ids), max_size=8),
    k=st.integers(1, 9),
)
def test_retrieval_metrics_against_reference(queries: list[tuple[list[int], list[int]]], k: int) -> None:
    retrieved = [torch.tensor(r, dtype=torch.long) for r, _ in queries]
    relevant = [torch.tensor(g, dtype=torch.long) for _, g in queries]
    out = calc_retrieval_metrics(
        retrieved, relevant, cmc_top_k=(k,), precision_top_k=(k,), map_top_k=(k,), reduce=False
    )
    expected = reference_metrics([r for r, _ in queries], [g for _, g in queries], k)
    got = [out["cmc"][k], out["precision"][k], out["map"][k]]
    for values, want in zip(got, expected, strict=True):
        torch.testing.assert_close(values, torch.tensor(want, dtype=torch.float32), equal_nan=True)


@given(
    rows=st.lists(st.tuples(st.lists(st.booleans(), max_size=6), st.integers(0, 4)), max_size=8),
    top_k=st.lists(st.integers(1, 8), min_size=1, max_size=3),
)
def test_calc_functions_against_reference(rows: list[tuple[list[bool], int]], top_k: list[int]) -> None:
    gt_tops = [torch.tensor(tops, dtype=torch.bool) for tops, _ in rows]
    n_gts = [n for _, n in rows]
    results = [calc(gt_tops, n_gts, tuple(top_k)) for calc in (calc_cmc, calc_precision, calc_map)]
    for metric, per_cutoff in enumerate(results):
        for k, values in zip(top_k, per_cutoff, strict=True):
            want = [reference_query(tops, n, k)[metric] for tops, n in rows]
            torch.testing.assert_close(values, torch.tensor(want, dtype=torch.float32), equal_nan=True)


# ---------------------------------------------------------------------------------------------------
# Consistency with retrieval_metrics on the same kNN
# ---------------------------------------------------------------------------------------------------


def clustered(n: int, n_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % n_classes  # every class at least twice: every query has ground truth
    x = torch.randn(n_classes, 6, generator=g)[labels] + 0.8 * torch.randn(n, 6, generator=g)
    return x, labels


@pytest.mark.parametrize("seed", [0, 1])
def test_same_numbers_as_retrieval_metrics(seed: int) -> None:
    x, labels = clustered(60, 7, seed)
    options: dict[str, Any] = {"cmc_top_k": (1, 5), "precision_top_k": (3, 10), "map_top_k": (5, 10)}
    ours = retrieval_metrics(x, labels, categories=labels % 2, **options)
    neighbours = knn(x, k=10, exclude_self=True)
    same = labels[:, None] == labels[None, :]
    same.fill_diagonal_(False)
    gt_ids = [row.nonzero().flatten() for row in same]
    oml = calc_retrieval_metrics(list(neighbours.indices), gt_ids, (labels % 2).numpy(), **options)
    nested = to_oml_nested(ours)
    assert list(nested) == [OVERALL_CATEGORIES_KEY, "0", "1"]
    for category, values in oml.items():
        assert_nested_close(nested[str(category)], values)


# ---------------------------------------------------------------------------------------------------
# calc_pcf and calc_topological_metrics
# ---------------------------------------------------------------------------------------------------


def test_pcf_values_and_dtype() -> None:
    # diag(3, 2, 1) rows plus their negatives: covariance eigenvalues 9:4:1 (shares 9/14, 13/14, 1)
    axes = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    x = torch.cat([axes, -axes])
    torch.testing.assert_close(calc_pcf(x, (0.0, 0.5, 0.9, 0.95)), torch.tensor([1 / 3, 1 / 3, 2 / 3, 1.0]))
    exact = calc_pcf(x.double(), (0.5, 0.9))
    assert isinstance(exact, torch.Tensor) and exact.dtype == torch.float64
    assert exact.tolist() == [1 / 3, 2 / 3]  # n / d in float64, as OML computes it


def test_pcf_full_variance_counts_one_past_the_eigenvalues() -> None:
    """r = 1: n = min(N, d) + 1, which exceeds d when N >= d (OML's arithmetic, no cap)."""
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [3.0, 1.0]])
    torch.testing.assert_close(calc_pcf(x, (1.0,)), torch.tensor([1.5]))


@pytest.mark.parametrize(
    ("embeddings", "expected"),
    [
        (torch.ones(1, 10), [0.2, 0.2]),  # one row: (1 + 1) / 10
        (torch.ones(5, 10), [0.6, 0.6]),  # equal rows, no variance: (min(5, 10) + 1) / 10
        (torch.ones(20, 4), [1.25, 1.25]),  # (min(20, 4) + 1) / 4
        (torch.zeros(0, 10), [0.1, 0.1]),  # no rows: 1 / 10
    ],
)
def test_pcf_without_variance(embeddings: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(calc_pcf(embeddings, (0.5, 1)), torch.tensor(expected))


@pytest.mark.parametrize(
    "embeddings",
    [
        torch.tensor([[math.nan, 1.0], [0.0, 1.0]]),
        torch.tensor([[math.inf, 1.0], [0.0, 1.0]]),
        torch.arange(6).view(3, 2),
        torch.ones(4),
        torch.ones(3, 2, dtype=torch.float16),
        np.ones((3, 2)),
    ],
)
def test_pcf_nan_list_where_oml_pca_fails(embeddings: Any) -> None:
    result = calc_pcf(embeddings, (0.5, 0.8))
    assert isinstance(result, list) and len(result) == 2
    assert all(value.ndim == 0 and math.isnan(value) for value in result)


@pytest.mark.parametrize("pcf_variance", [(), (1.5,), (-0.1, 0.5)])
def test_pcf_bad_fractions(pcf_variance: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="pcf_variance"):
        calc_pcf(torch.eye(3), pcf_variance)


def test_topological_metrics() -> None:
    x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [5.0, 5.0]])
    assert calc_topological_metrics(x, ()) == {}
    plain = calc_topological_metrics(x, (0.5, 1))
    assert list(plain) == ["pcf"] and list(plain["pcf"]) == [0.5, 1]
    out = calc_topological_metrics(x, (0.5,), categories=np.array([2, 2, 1, 1, 9]), verbose=True)
    assert list(out) == [OVERALL_CATEGORIES_KEY, 1, 2, 9]  # sorted, as np.unique
    assert all(isinstance(key, np.integer) for key in list(out)[1:])
    assert_nested_close(out[1], {"pcf": {0.5: 0.5}})  # two rows differing in one axis: 1 / 2
    assert_nested_close(out[9], {"pcf": {0.5: 1.0}})  # one row: (1 + 1) / 2
    by_tensor = calc_topological_metrics(x, (0.5,), categories=torch.tensor([2, 2, 1, 1, 9]))
    assert list(by_tensor) == list(out)
    with pytest.raises(ValueError, match="categories"):
        calc_topological_metrics(x, (0.5,), categories=np.array([1, 2]))


# ---------------------------------------------------------------------------------------------------
# calc_fnmr_at_fmr
# ---------------------------------------------------------------------------------------------------


def test_fnmr_accepts_tensors_and_ints() -> None:
    pos, neg = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 10])
    # thresholds: quantile 0 -> 0 (all positives >= 0), quantile 1 -> 10 (none)
    torch.testing.assert_close(calc_fnmr_at_fmr(pos, neg, (0.0, 1.0)), torch.tensor([1.0, 0.0]))


def test_fnmr_threshold_on_an_order_statistic() -> None:
    """numpy's virtual index (n - 1) * f = 4.0 exactly; n * f + (1 - f) - 1 would be 4.000000000000001."""
    neg = np.array([0.5, 0.6, 0.6, 0.7, 0.9] + [1.5] * 36)  # 41 values: 0.1-quantile = neg[4] = 0.9 exactly
    pos = np.array([0.8, 0.9, 1.5, 1.5])
    assert np.quantile(neg, 0.1) == 0.9
    torch.testing.assert_close(calc_fnmr_at_fmr(pos, neg, (0.1,)), torch.tensor([0.75]))


@pytest.mark.parametrize("fmr_vals", [(), (1.1,), (-0.5,)])
def test_fnmr_bad_rates(fmr_vals: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="fmr_vals"):
        calc_fnmr_at_fmr(np.array([1.0]), np.array([2.0]), fmr_vals)


# ---------------------------------------------------------------------------------------------------
# to_oml_nested
# ---------------------------------------------------------------------------------------------------


def test_to_oml_nested_layout() -> None:
    v = torch.tensor
    flat = {
        "val/cmc/1": v(0.5),
        "val/map/5": v(0.25),
        "val/fnmr@fmr/0.1": v(0.3),
        "val/pcf/0.5": v(0.1),
        "val/map_at_r": v(0.2),
        "val/shoes/cmc/1": v(1.0),
        "val/a/b/pcf/1": v(0.7),
    }
    nested = to_oml_nested(flat, prefix="val/")
    assert nested == {
        OVERALL_CATEGORIES_KEY: {
            "cmc": {1: v(0.5)},
            "map": {5: v(0.25)},
            "fnmr@fmr": {0.1: v(0.3)},
            "pcf": {0.5: v(0.1)},
            "map_at_r": v(0.2),
        },
        "shoes": {"cmc": {1: v(1.0)}},
        "a/b": {"pcf": {1: v(0.7)}},
    }
    assert isinstance(next(iter(nested[OVERALL_CATEGORIES_KEY]["cmc"])), int)
    assert to_oml_nested({}) == {OVERALL_CATEGORIES_KEY: {}}


@pytest.mark.parametrize(
    ("flat", "prefix", "match"),
    [
        ({"cmc/1": 1.0}, "val/", "prefix"),
        ({"cmc/1/class/3": 1.0}, "", "per-class"),
        ({"map": 1.0, "map/5": 1.0}, "", "scalar metric"),
        ({"map/5": 1.0, "map": 1.0}, "", "collides"),
    ],
)
def test_to_oml_nested_errors(flat: dict[str, Any], prefix: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        to_oml_nested(flat, prefix=prefix)
