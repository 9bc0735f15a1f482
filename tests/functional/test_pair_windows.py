"""The pair metrics' second pass done inside the first (``_pair_windows``): same values as the two passes, exact
against numpy and scikit-learn, taken when foreseen, and left to the second pass when not. Every value comes from
the compiled pair kernels (forced on, and checked to be called: ``kernel_calls``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score, roc_curve

from tests.functional.conftest import KernelCalls
from torchmetrics_retrieval.functional._pairs import auc as _pair_auc
from torchmetrics_retrieval.functional._pairs import passes as _pair_passes
from torchmetrics_retrieval.functional._pairs import quantiles as _pair_quantiles
from torchmetrics_retrieval.functional._pairs import windows as _pair_windows
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional.verification import fnmr_at_fmr

RATES: dict[str, Any] = {"fmr_vals": (0.01, 0.1), "eer": True, "min_dcf_p_target": (0.05, 0.5)}


@pytest.fixture(autouse=True)
def compiled() -> Iterator[None]:
    """The sample and the windows live in the compiled passes, which small data would not take (each test checks
    that the kernels ran: ``kernel_calls``)."""
    with plan.force_compiled(True):
        yield


def data(n: int = 2000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clustered unit rows (embeddings), about 20 per class, with lone queries and exact duplicates (their
    distances to any other row tie, across labels: ties between positive and negative pairs)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n // 20, (n,), generator=g)
    labels[:2] = torch.tensor([-1, -2])  # lone queries
    x = torch.randn(n // 20, 16, generator=g)[labels.remainder(n // 20)] + 0.6 * torch.randn(n, 16, generator=g)
    x[40:50] = x[7]  # exact duplicates
    return torch.nn.functional.normalize(x, dim=1), labels


class Spy:
    """Counts the second passes and the windows read in the first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.second_passes = 0
        self.windows_read = 0
        collect, read = _pair_quantiles._collect, _pair_windows.Windows.read

        def counted_collect(*args: Any) -> Any:
            self.second_passes += 1
            return collect(*args)

        def counted_read(windows: _pair_windows.Windows, *args: Any) -> Any:
            found = read(windows, *args)
            self.windows_read += found is not None
            return found

        monkeypatch.setattr(_pair_quantiles, "_collect", counted_collect)
        monkeypatch.setattr(_pair_windows.Windows, "read", counted_read)


def two_passes(calls: KernelCalls, monkeypatch: pytest.MonkeyPatch, call: Any) -> dict[str, torch.Tensor]:
    """``call()`` without the windows: both passes, through the compiled kernels (checked)."""
    with monkeypatch.context() as mp, calls.expect(True, "pairs.histogram"), calls.expect(True, "pairs.count_wanted"):
        mp.setattr(_pair_quantiles, "_windows", lambda *args: None)
        return call()


def check(
    calls: KernelCalls, monkeypatch: pytest.MonkeyPatch, call: Any, passes: tuple[int, int] = (0, 1)
) -> dict[str, torch.Tensor]:
    """``call()`` gives the values of two passes, with ``passes`` = (second passes, windows read), every pass
    through the compiled kernels (checked); returned."""
    expected = two_passes(calls, monkeypatch, call)
    spy = Spy(monkeypatch)
    second_pass = calls.total("pairs.count_wanted")
    with calls.expect(True, "pairs.histogram"):
        found = call()
    assert (spy.second_passes, spy.windows_read) == passes
    assert (calls.total("pairs.count_wanted") > second_pass) == (passes[0] > 0)  # a second pass: compiled too
    assert found.keys() == expected.keys()
    for key in expected:
        assert torch.equal(found[key], expected[key]), key
    return found


def test_keys_keep_the_order_of_the_floats() -> None:
    g = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, np.inf, -np.inf, 3.4e38, -3.4e38]
    scales = 10.0 ** torch.randint(-30, 30, (5000,), generator=g).numpy()
    values = np.concatenate([torch.randn(5000, generator=g).numpy() * scales, special])
    values = values.astype(np.float32)
    keys = _pair_windows.ordered_keys(values)
    back = _pair_windows.from_keys(keys)
    assert np.array_equal(back, values)  # as values: -0.0 comes back as +0.0, which equals it
    signed_zero = values.view(np.int32) == np.float32(-0.0).view(np.int32)
    assert np.array_equal(back.view(np.int32)[~signed_zero], values.view(np.int32)[~signed_zero])
    order = np.argsort(values, kind="stable")
    steps = np.diff(_pair_windows.ordered_keys(values[order]))
    distinct = np.diff(values[order]) > 0
    assert (steps[distinct] > 0).all() and (steps[~distinct] == 0).all()


@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_one_pass_gives_the_values_of_two(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls, distance: str
) -> None:
    x, labels = data()
    seq = torch.randint(0, 900, (x.shape[0],), generator=torch.Generator().manual_seed(1))

    # small tiles: the sample is 64 rows of 2000
    check(
        kernel_calls,
        monkeypatch,
        lambda: fnmr_at_fmr(x, labels, sequence_ids=seq, distance=distance, chunk_size=64, **RATES),
    )


def test_separate_gallery(monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls) -> None:
    x, labels = data(n=3000)
    is_query = torch.arange(3000) % 3 == 0

    check(
        kernel_calls,
        monkeypatch,
        lambda: fnmr_at_fmr(x, labels, is_query=is_query, is_gallery=~is_query, chunk_size=64, **RATES),
    )


def pair_distances(x: torch.Tensor, distance: str) -> torch.Tensor:
    """Every pair's distance by docs/definitions.md's formula, in float64."""
    x = x.double()
    gram = x @ x.T
    if distance == "cosine":  # 1 - <q, g> / sqrt(<q, q> <g, g>)
        return 1.0 - gram / torch.sqrt(torch.outer(gram.diagonal(), gram.diagonal()))
    if distance == "dot":
        return -gram
    squared = ((x[:, None] - x[None]) ** 2).sum(-1)
    return squared if distance == "sqeuclidean" else squared.sqrt()


@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_against_scikit_learn_and_numpy(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls, distance: str
) -> None:
    """The values of the one pass against oracles that list every pair (float64 distances: near ties may order
    differently, hence the tolerance)."""
    x, labels = data()
    spy = Spy(monkeypatch)
    with kernel_calls.expect(True, "pairs.histogram"):
        found = fnmr_at_fmr(x, labels, distance=distance, chunk_size=64, **RATES)
    assert (spy.second_passes, spy.windows_read) == (0, 1)
    d = pair_distances(x, distance)
    off = ~torch.eye(x.shape[0], dtype=torch.bool)
    dist, positive = d[off].numpy(), (labels[:, None] == labels[None, :])[off].numpy()
    fpr, tpr, _ = roc_curve(positive.astype(int), -dist, drop_intermediate=False)
    i = int(np.argmin(np.abs((1 - tpr) - fpr)))
    assert float(found["eer"]) == pytest.approx((fpr[i] + 1 - tpr[i]) / 2, abs=1e-6)
    for p in RATES["min_dcf_p_target"]:  # every threshold: t = -inf, then fpr/tpr after each distinct distance
        cost = p * np.concatenate([[1.0], 1 - tpr]) + (1 - p) * np.concatenate([[0.0], fpr])
        assert float(found[f"min_dcf/{p}"]) == pytest.approx(cost.min() / min(p, 1 - p), abs=1e-6)
    for f in RATES["fmr_vals"]:
        threshold = np.quantile(dist[~positive], f)
        assert float(found[f"fnmr@fmr/{f}"]) == pytest.approx(np.mean(dist[positive] >= threshold), abs=1e-6)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_same_on_any_number_of_threads(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls, threads: int
) -> None:
    x, labels = data()
    expected = two_passes(
        kernel_calls, monkeypatch, lambda: fnmr_at_fmr(x, labels, chunk_size=64, **RATES)
    )  # default threads

    def on_threads() -> dict[str, torch.Tensor]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fnmr_at_fmr(x, labels, chunk_size=64, **RATES)
        finally:
            torch.set_num_threads(before)

    found = check(kernel_calls, monkeypatch, on_threads)
    for key in expected:
        assert torch.equal(found[key], expected[key]), key


def test_a_wrong_foresight_leaves_the_work_to_the_second_pass(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    x, labels = data()

    def far_away(sample: _pair_windows.Sample, *args: Any) -> torch.Tensor:
        likely = torch.zeros(sample.groups.shape[1] // 2, dtype=torch.bool)
        likely[1:3] = True  # distances near 0: no answer there
        return likely

    monkeypatch.setattr(_pair_quantiles, "likely_buckets", far_away)
    check(kernel_calls, monkeypatch, lambda: fnmr_at_fmr(x, labels, chunk_size=64, **RATES), passes=(1, 0))


def test_counts_that_miss_a_pair_are_not_used(monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls) -> None:
    """A value the windows did not hold (beyond its window) leaves its bucket short of the histogram's count:
    the windows are not read, the second pass runs."""
    x, labels = data()
    read = _pair_windows.Windows.read

    def short(windows: _pair_windows.Windows, *args: Any) -> Any:
        windows.fine[0, int(np.flatnonzero(windows.fine.sum(axis=0))[0])] -= 1
        return read(windows, *args)

    monkeypatch.setattr(_pair_windows.Windows, "read", short)
    check(kernel_calls, monkeypatch, lambda: fnmr_at_fmr(x, labels, chunk_size=64, **RATES), passes=(1, 0))


def test_values_crowded_near_zero_are_left_to_the_second_pass(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    """Half the negative pairs lie below a dot distance near 0, where a bucket spans too many float32 values to
    count each: that bucket is not tracked, and the second pass reads it."""
    x, labels = data()
    rates = {**RATES, "fmr_vals": (0.5,)}
    check(
        kernel_calls, monkeypatch, lambda: fnmr_at_fmr(x, labels, distance="dot", chunk_size=64, **rates), passes=(1, 0)
    )


def test_no_sample_when_the_tile_is_most_of_the_pairs(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    x, labels = data(n=500)
    spy = Spy(monkeypatch)
    with kernel_calls.expect(True, "pairs.histogram"), kernel_calls.expect(True, "pairs.count_wanted"):
        fnmr_at_fmr(x, labels, chunk_size=64, **RATES)  # 500 rows: fewer than 8 tiles of 64
    assert (spy.second_passes, spy.windows_read) == (1, 0)


def test_roc_auc_reads_the_positives_the_sample_listed(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    x, labels = data()
    with kernel_calls.expect(True, "auc.count_block"):
        alone = fnmr_at_fmr(x, labels, fmr_vals=(), roc_auc=True, chunk_size=64)
    listed = []
    positive_distances = _pair_auc.positive_distances

    def counted(*args: Any) -> torch.Tensor:
        listed.append(positive_distances(*args))
        return listed[-1]

    monkeypatch.setattr(_pair_passes, "positive_distances", counted)
    monkeypatch.setattr(_pair_auc, "positive_distances", counted)
    with kernel_calls.expect(True, "pairs.histogram"), kernel_calls.expect(True, "auc.count_block"):
        both = fnmr_at_fmr(x, labels, roc_auc=True, chunk_size=64, **RATES)
    assert len(listed) == 1  # by the sample, read again by the ROC AUC pass
    assert torch.equal(both["roc_auc"], alone["roc_auc"])
    d = torch.cdist(x.double(), x.double())
    off = ~torch.eye(x.shape[0], dtype=torch.bool)
    positive = (labels[:, None] == labels[None, :])[off].numpy()
    assert float(both["roc_auc"]) == pytest.approx(roc_auc_score(positive, -d[off].numpy()), abs=1e-6)
