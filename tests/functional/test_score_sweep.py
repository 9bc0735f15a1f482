"""The one-sort path of ``score_metrics`` (``_trials._sweep`` and ``_score_kernels``) on what a merge of sorted runs
can get wrong: exact ties across the two kinds, -0.0 against +0.0, value ranges cut between threads, and the Cllr
sums. Expected values come from the brute-force references of ``test_trials`` (one threshold at a time),
scikit-learn and ``math.fsum``."""

from __future__ import annotations

import functools
import importlib
import itertools
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from tests.functional.test_trials import (
    ref_act_dcf,
    ref_cllr,
    ref_eer,
    ref_fnmr,
    ref_min_cllr,
    ref_min_dcf,
    ref_nearest_tar,
    ref_rates,
)
from torchmetrics_retrieval.functional import score_metrics

OPTIONS = {
    "fmr_vals": (0.0, 0.001, 0.1, 0.5, 1.0),
    "eer": True,
    "min_dcf_p_target": (0.01, 0.5),
    "roc_auc": True,
    "cllr": True,
    "act_dcf_p_target": (0.01, 0.5),
}


def references(scores: np.ndarray, target: np.ndarray) -> dict[str, float]:
    expected = {f"fnmr@fmr/{f}": ref_fnmr(scores, target, f) for f in OPTIONS["fmr_vals"]}
    expected |= {f"tar@far/{f}": 1 - expected[f"fnmr@fmr/{f}"] for f in OPTIONS["fmr_vals"]}
    rates = ref_rates(scores, target)  # one threshold at a time: computed once for the EER and both minDCFs
    expected["eer"] = ref_eer(scores, target, rates=rates)
    expected |= {f"min_dcf/{p}": ref_min_dcf(scores, target, p, rates=rates) for p in OPTIONS["min_dcf_p_target"]}
    expected["roc_auc"] = roc_auc_score(target, scores)
    expected |= {f"act_dcf/{p}": ref_act_dcf(scores, target, p) for p in OPTIONS["act_dcf_p_target"]}
    expected["cllr"] = ref_cllr(scores, target)
    expected["min_cllr"] = ref_min_cllr(scores, target)
    return expected


@pytest.fixture
def threads() -> Iterator[None]:
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    yield
    torch.set_num_threads(torch_threads)
    numba.set_num_threads(numba_threads)


def test_many_exact_ties_across_the_two_kinds() -> None:
    # three distinct scores, each held by targets and non-targets alike: every group is mixed
    rng = np.random.default_rng(20)
    target = rng.random(3000) < 0.4
    scores = rng.choice([-1.0, 0.5, 2.0], size=3000) + 0.0 * target
    scores[target] = rng.choice([0.5, 2.0, 2.0], size=int(target.sum()))
    out = score_metrics(torch.tensor(scores, dtype=torch.float32), torch.tensor(target), **OPTIONS)
    assert {k: float(v) for k, v in out.items()} == pytest.approx(references(scores, target), abs=1e-7)


def test_minus_zero_and_plus_zero_are_one_score() -> None:
    rng = np.random.default_rng(21)
    target = rng.random(400) < 0.5
    scores = np.where(rng.random(400) < 0.6, 0.0, rng.normal(size=400)).astype(np.float32)
    signed = scores.copy()
    signed[(scores == 0) & (rng.random(400) < 0.5)] = -0.0  # half the zeros negative, targets and non-targets
    assert np.signbit(signed[target & (signed == 0)]).any() and np.signbit(signed[~target & (signed == 0)]).any()
    got = score_metrics(torch.from_numpy(signed), torch.tensor(target), **OPTIONS)
    plain = score_metrics(torch.from_numpy(scores), torch.tensor(target), **OPTIONS)
    assert got == plain
    expected = references(scores.astype(np.float64), target)
    assert {k: float(v) for k, v in got.items()} == pytest.approx(expected, abs=1e-7)
    # one group: FAR and FRR jump at 0 together; a target at +0.0 ties a non-target at -0.0 (one half)
    one = score_metrics(torch.tensor([0.0, -0.0]), torch.tensor([True, False]), roc_auc=True, eer=True)
    assert float(one["roc_auc"]) == 0.5 and float(one["eer"]) == 0.5


@functools.cache
def value_ranges_case(kind: str) -> tuple[np.ndarray, np.ndarray, dict[str, float], float]:
    """The trials of ``kind`` with their references (the brute-force ones take seconds on 70 000 distinct scores:
    computed once for both thread counts)."""
    # enough trials for several chunks of the kernels, and value ranges cut between threads
    rng = np.random.default_rng(22)
    n = 70_000
    target = rng.random(n) < 0.15
    if kind == "ties":
        scores = rng.integers(-20, 20, n).astype(np.float64) / 4 + target
    else:
        scores = rng.normal(size=n) + 2.0 * target
    scores.flags.writeable = target.flags.writeable = False  # shared by the tests
    return scores, target, references(scores, target), ref_nearest_tar(scores, target, 0.05)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_value_ranges_give_the_references_and_one_another(kind: str, n_threads: int, threads: None) -> None:
    scores, target, expected, expected_nearest = value_ranges_case(kind)
    torch.set_num_threads(n_threads)
    numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
    out = score_metrics(torch.tensor(scores), torch.tensor(target), **OPTIONS)
    assert {k: float(v) for k, v in out.items()} == pytest.approx(expected, abs=1e-6)
    nearest = score_metrics(
        torch.tensor(scores), torch.tensor(target), fmr_vals=(1e-3, 0.05), far_rule="nearest_roc_point"
    )
    assert float(nearest["tar@far/0.05"]) == pytest.approx(expected_nearest, abs=1e-7)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    assert score_metrics(torch.tensor(scores), torch.tensor(target), **OPTIONS) == out


@pytest.mark.parametrize("scale", [0.1, 3.0, 40.0, 1e4])
def test_cllr_sums_to_float64(scale: float) -> None:
    # the sums of the kernel against math.fsum of numpy's softplus, to 1e-13 relative: far below float32
    kernels = importlib.import_module("torchmetrics_retrieval.functional._score_kernels")
    rng = np.random.default_rng(23)
    x = rng.normal(size=50_000) * scale
    flags = rng.random(x.size) < 0.3
    sums = np.zeros((-(-x.size // kernels.CHUNK), 2))
    kernels.cllr_sums(x, flags, kernels.CHUNK, kernels.EXP_TABLE, sums, 0, sums.shape[0])
    tar = math.fsum(np.logaddexp(0, -x[flags]).tolist())
    non = math.fsum(np.logaddexp(0, x[~flags]).tolist())
    assert math.fsum(sums[:, 0].tolist()) == pytest.approx(tar, rel=1e-13)
    assert math.fsum(sums[:, 1].tolist()) == pytest.approx(non, rel=1e-13)


def test_cllr_of_well_separated_scores_keeps_its_small_terms() -> None:
    # targets at 30, non-targets at -30: each term is log(1 + e^-30) = 9.36e-14, which a factor 1 + u would lose
    scores = torch.tensor([30.0] * 5 + [-30.0] * 7, dtype=torch.float64)
    target = torch.tensor([True] * 5 + [False] * 7)
    out = score_metrics(scores, target, cllr=True)
    assert float(out["cllr"]) == pytest.approx(math.log1p(math.exp(-30)) / math.log(2), rel=1e-6)
    assert float(out["min_cllr"]) == 0.0


@pytest.mark.parametrize("n_threads", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("kind", ["continuous", "ties", "tiny"])
def test_value_ranges_sort_each_kind(kind: str, n_threads: int) -> None:
    # each kind sorted (against numpy's sort), and cut into one value range per thread: the scores of each range lie
    # between the pivots around it (so equal scores share a range), on many ties and on fewer scores than threads
    values = importlib.import_module("torchmetrics_retrieval.functional._score_values")
    kernels = importlib.import_module("torchmetrics_retrieval.functional._score_kernels")
    rng = np.random.default_rng(n_threads)
    n = {"continuous": 50_001, "ties": 40_000, "tiny": 3}[kind]
    flags = rng.random(n) < 0.3
    scores = rng.normal(size=n).astype(np.float32) if kind != "ties" else rng.integers(-3, 3, n) / 2.0
    with ThreadPoolExecutor(n_threads) as pool:
        use = pool if n_threads > 1 else None
        both, n_pos = values._sorted_kinds(scores, flags, n_threads, use, kernels)
        split = np.concatenate([scores[flags], scores[~flags]])
        pivots = values._pivots(scores, n_threads)
        cut, bounds = values._partitioned(split, np.array([0, n_pos, n]), pivots, n_threads, use, kernels)
    assert np.array_equal(both[:n_pos], np.sort(scores[flags]))
    assert np.array_equal(both[n_pos:], np.sort(scores[~flags]))
    assert bounds.size == 2 * n_threads + 1 and bounds[[0, n_threads, -1]].tolist() == [0, n_pos, n]
    for kind, (lo, hi) in enumerate(((0, n_pos), (n_pos, n))):
        assert np.array_equal(np.sort(cut[lo:hi]), np.sort(split[lo:hi]))  # the kind's scores, moved only
        ranges = itertools.pairwise(bounds[kind * n_threads : (kind + 1) * n_threads + 1])
        for r, (a, b) in enumerate(ranges):  # between the pivots around it (every score of a range)
            assert r == 0 or cut[a:b].min(initial=np.inf) >= pivots[r - 1]
            assert r == n_threads - 1 or cut[a:b].max(initial=-np.inf) < pivots[r]


@pytest.mark.parametrize("n_threads", [3, 5, 8])
@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_more_ranges_than_threads_give_the_same_values(
    kind: str, n_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the value ranges of several threads (the pool runs them on the threads there are): every value equal to one
    # thread's
    values = importlib.import_module("torchmetrics_retrieval.functional._score_values")
    rng = np.random.default_rng(24)
    target = rng.random(9_000) < 0.2
    if kind == "ties":
        scores = rng.integers(-6, 6, target.size).astype(np.float64) / 4 + target
    else:
        scores = rng.normal(size=target.size) + target
    args = (torch.tensor(scores), torch.tensor(target))
    monkeypatch.setattr(values, "kernel_threads", lambda: 1)
    one = score_metrics(*args, **OPTIONS)
    monkeypatch.setattr(values, "kernel_threads", lambda: n_threads)
    assert score_metrics(*args, **OPTIONS) == one
    nearest = {"fmr_vals": (1e-3, 0.05), "far_rule": "nearest_roc_point"}
    monkeypatch.setattr(values, "kernel_threads", lambda: 1)
    expected = score_metrics(*args, **nearest)
    monkeypatch.setattr(values, "kernel_threads", lambda: n_threads)
    assert score_metrics(*args, **nearest) == expected


def test_exp_of_the_cllr_terms_to_a_few_ulps() -> None:
    # e^-a of the kernel (table of 2^(-k/16) and a 7-term polynomial) against math.exp, over the whole range it
    # serves, including the ends of the table and the points where the reduction changes step
    kernels = importlib.import_module("torchmetrics_retrieval.functional._score_kernels")
    steps = np.arange(0, 708 * kernels.STEPS / math.log(2)) * math.log(2) / kernels.STEPS
    a = np.concatenate([np.random.default_rng(5).random(20_000) * 708, [0.0, 708.0], steps, steps + 0.0108])
    a = a[a <= 708.0]
    got = _exp_minus_all(a, kernels.EXP_TABLE, kernels._exp_minus)
    want = np.array([math.exp(-float(x)) for x in a])
    assert np.max(np.abs(got / want - 1)) < 1e-14  # math.exp is within an ulp (2.2e-16)


def _exp_minus_all(a: np.ndarray, table: np.ndarray, exp_minus: object) -> np.ndarray:
    @numba.njit
    def each(a: np.ndarray, table: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = exp_minus(a[i], table)  # type: ignore[operator]
        return out

    return each(a, table)
