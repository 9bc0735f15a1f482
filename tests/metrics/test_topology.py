"""PCF in one process: streamed sums == kept rows == functional == numpy eigenvalues, any batch split; errors."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor
from torchmetrics import MetricCollection

from tests.metrics._helpers import split_points
from torchmetrics_retrieval.functional.topology import pcf
from torchmetrics_retrieval.metrics import EmbeddingMetrics
from torchmetrics_retrieval.metrics.topology import PCF

FRACTIONS = (0.0, 0.3, 0.5, 0.9, 1.0)


def numpy_pcf(x: Tensor, fractions: tuple[float, ...]) -> dict[str, float]:
    """PCF by docs/definitions.md from numpy's eigenvalues of the covariance (largest min(N, d), cumulative shares)."""
    n, d = x.shape
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(x.double().numpy(), rowvar=False)))[::-1][: min(n, d)]
    shares = np.cumsum(np.clip(eigenvalues, 0, None)) / np.clip(eigenvalues, 0, None).sum()
    return {f"pcf/{r}": min(1 + int((shares <= r + 1e-9).sum()), d) / d for r in fractions}


def low_rank(n: int, d: int, rank: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, rank, generator=g) @ torch.randn(rank, d, generator=g) + 3.0


def feed(metric: PCF, x: Tensor, mode: str, *, indexes: Tensor | None = None, seed: int = 0) -> PCF:
    for start, end in split_points(x.shape[0], mode, seed):
        metric.update(x[start:end], indexes=None if indexes is None else indexes[start:end])
    return metric


def as_floats(values: dict[str, Tensor]) -> dict[str, float]:
    return {key: float(value) for key, value in values.items()}


# ---- values ---------------------------------------------------------------------------------------------------------


def test_oml_documented_example() -> None:
    # open-metric-learning: eye(4, 10) with r = (0.5, 1) gives (0.2, 0.5)
    for indexes in (None, torch.arange(4)):
        metric = feed(PCF(pcf_variance=(0.5, 1)), torch.eye(4, 10), "single", indexes=indexes)
        assert as_floats(metric.compute()) == pytest.approx({"pcf/0.5": 0.2, "pcf/1": 0.5})


@pytest.mark.parametrize("split", ["one", "single", "random"])
@pytest.mark.parametrize(("n", "d", "rank"), [(30, 6, 6), (25, 8, 3), (5, 9, 9)])
def test_streaming_rows_functional_and_numpy_agree(split: str, n: int, d: int, rank: int) -> None:
    x = low_rank(n, d, rank, seed=n + d)
    streamed = feed(PCF(pcf_variance=FRACTIONS), x, split, seed=1).compute()
    rows = feed(PCF(pcf_variance=FRACTIONS), x, split, indexes=torch.arange(n), seed=1).compute()
    functional = pcf(x, pcf_variance=FRACTIONS)
    assert list(streamed) == [f"pcf/{r}" for r in FRACTIONS]
    for i, key in enumerate(streamed):
        assert float(streamed[key]) == float(rows[key]) == float(functional[i]), key
    assert as_floats(streamed) == pytest.approx(numpy_pcf(x, FRACTIONS))


def test_streaming_state_does_not_grow_with_n() -> None:
    metric = PCF()
    for seed in range(20):
        metric.update(low_rank(50, 4, 4, seed))
    assert metric.embeddings == [] and metric.indexes == []
    assert int(metric.count) == 1000
    assert metric.row_sum.shape == (4,) and metric.outer_sum.shape == (4, 4)
    assert metric.row_sum.dtype == metric.outer_sum.dtype == torch.float64


def test_indexes_deduplicate() -> None:
    x = low_rank(12, 5, 2, seed=4)
    metric = PCF(pcf_variance=FRACTIONS)
    for rows in (torch.arange(8), torch.arange(4, 12), torch.tensor([0, 11])):  # overlapping: duplicates dropped
        metric.update(x[rows], indexes=rows)
    assert as_floats(metric.compute()) == as_floats(feed(PCF(pcf_variance=FRACTIONS), x, "one").compute())


def test_duplicates_matter_by_hand() -> None:
    # four points on the axes: two equal eigenvalues, shares (0.5, 1) -> n = 2 at r = 0.5 -> 2 / 2
    cross = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    padded = torch.cat([cross, cross[:2]])  # DistributedSampler-like duplicates of the first two rows
    with_indexes = PCF()
    with_indexes.update(padded, indexes=torch.tensor([0, 1, 2, 3, 0, 1]))
    assert float(with_indexes.compute()["pcf/0.5"]) == 1.0
    without = PCF()
    without.update(padded)  # the x axis now holds 2/3 of the variance: n = 1 -> 1 / 2
    assert float(without.compute()["pcf/0.5"]) == 0.5


def test_explained_variance_matches_numpy() -> None:
    x = low_rank(20, 6, 4, seed=2)
    metric = feed(PCF(), x, "random")
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(x.double().numpy(), rowvar=False)))[::-1]
    expected = np.cumsum(np.clip(eigenvalues, 0, None)) / np.clip(eigenvalues, 0, None).sum()
    shares = metric.explained_variance()
    assert shares.shape == (6,) and float(shares[-1]) == 1.0
    np.testing.assert_allclose(shares.numpy(), expected, atol=1e-9)


def test_constant_rows_give_nan_with_warning() -> None:
    metric = PCF()
    metric.update(torch.ones(5, 3))
    with pytest.warns(UserWarning, match="zero variance"):
        assert torch.isnan(metric.compute()["pcf/0.5"])


# ---- forward ------------------------------------------------------------------------------------------------------


def test_forward_gives_the_batch_value_and_accumulates() -> None:
    x = low_rank(30, 6, 3, seed=8)
    for indexes in (None, torch.arange(30)):
        metric = PCF(pcf_variance=FRACTIONS)
        for rows in (slice(0, 12), slice(12, 30)):
            batch_value = metric(x[rows], indexes=None if indexes is None else indexes[rows])
            assert as_floats(batch_value) == as_floats(PCF(pcf_variance=FRACTIONS)(x[rows]))
            assert as_floats(batch_value) == pytest.approx(numpy_pcf(x[rows], FRACTIONS))
        assert as_floats(metric.compute()) == pytest.approx(numpy_pcf(x, FRACTIONS))


def test_forward_checks_the_batch_first() -> None:
    metric = PCF()
    metric(low_rank(5, 4, 4, seed=0))
    before = snapshot(metric)
    with pytest.raises(ValueError, match="`embeddings` must have 4 columns like the previous"):
        metric(torch.ones(3, 5))
    with pytest.raises(ValueError, match="`indexes` must be None in every batch"):
        metric(torch.ones(3, 4), indexes=torch.arange(3))
    with pytest.raises(ValueError, match="at least 2 distinct samples in forward"):
        metric(torch.ones(1, 4))
    assert_same_state(metric, before)
    rows = PCF()
    rows(low_rank(5, 4, 4, seed=0), indexes=torch.arange(5))
    with pytest.raises(ValueError, match="at least 2 distinct samples in forward"):
        rows(torch.ones(2, 4), indexes=torch.tensor([7, 7]))


# ---- bad input ---------------------------------------------------------------------------------------------------


def snapshot(metric: PCF) -> dict[str, Any]:
    return {
        name: [t.clone() for t in value] if isinstance(value, list) else value.clone()
        for name, value in ((name, getattr(metric, name)) for name in metric._defaults)
    }


def assert_same_state(metric: PCF, before: dict[str, Any]) -> None:
    after = snapshot(metric)
    for name, value in before.items():
        if isinstance(value, list):
            assert len(after[name]) == len(value) and all(
                torch.equal(a, b) for a, b in zip(after[name], value, strict=True)
            ), name
        else:
            assert after[name].shape == value.shape and torch.equal(after[name], value), name


BAD_UPDATES: dict[str, tuple[dict[str, Any], type, str]] = {
    "1-D": ({"embeddings": torch.ones(3)}, ValueError, "`embeddings` must be 2-D"),
    "3-D": ({"embeddings": torch.ones(3, 4, 1)}, ValueError, "`embeddings` must be 2-D"),
    "ints": ({"embeddings": torch.ones(3, 4, dtype=torch.long)}, TypeError, "`embeddings` must have a floating"),
    "NaN": ({"embeddings": torch.full((2, 4), float("nan"))}, ValueError, "`embeddings` must be finite"),
    "inf": ({"embeddings": torch.full((2, 4), float("inf"))}, ValueError, "`embeddings` must be finite"),
    "dimension changes": ({"embeddings": torch.ones(3, 5)}, ValueError, "`embeddings` must have 4 columns like"),
    "not a tensor": ({"embeddings": [[1.0] * 4]}, TypeError, "`embeddings` must be a torch.Tensor"),
}


@pytest.mark.parametrize("mode", ["streamed", "rows"])
@pytest.mark.parametrize("case", [*BAD_UPDATES, "indexes switch"])
def test_bad_update_raises_and_leaves_state_untouched(case: str, mode: str) -> None:
    metric = PCF()
    first_indexes = torch.arange(4) if mode == "rows" else None
    metric.update(low_rank(4, 4, 4, seed=0), indexes=first_indexes)
    before = snapshot(metric)
    if case == "indexes switch":  # streamed -> rows or rows -> streamed: a mix is an error
        batch: dict[str, Any] = {"embeddings": torch.ones(2, 4)}
        error: type = ValueError
        batch["indexes"] = None if mode == "rows" else torch.arange(2)
        message = "`indexes` must be given in every batch" if mode == "rows" else "`indexes` must be None in every"
    else:
        batch, error, message = BAD_UPDATES[case]
        batch = {**batch, "indexes": None if first_indexes is None else torch.arange(batch_rows(batch))}
    with pytest.raises(error, match=message):
        metric.update(**batch)
    assert_same_state(metric, before)


def batch_rows(batch: dict[str, Any]) -> int:
    value = batch["embeddings"]
    return value.shape[0] if isinstance(value, Tensor) else len(value)


def test_bad_indexes() -> None:
    metric = PCF()
    with pytest.raises(TypeError, match="`indexes` must have an integer dtype"):
        metric.update(torch.ones(2, 3), indexes=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="`indexes` must have 2 rows like `embeddings`"):
        metric.update(torch.ones(2, 3), indexes=torch.arange(3))
    assert int(metric.count) == 0 and metric.embeddings == []
    metric.update(torch.ones(2, 3), torch.arange(2))  # a positional second argument is labels (ignored), never indexes
    assert int(metric.count) == 2 and metric.embeddings == []


@pytest.mark.parametrize("n", [0, 1])
@pytest.mark.parametrize("with_indexes", [False, True])
def test_fewer_than_two_samples(n: int, with_indexes: bool) -> None:
    metric = PCF()
    metric.update(torch.ones(n, 3), indexes=torch.zeros(n, dtype=torch.long) if with_indexes else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics: compute() before update()
        with pytest.raises(ValueError, match=f"PCF needs at least 2 samples, got {n}"):
            metric.compute()
    if with_indexes:  # rows with the same index are one sample
        metric.update(torch.zeros(2, 3), indexes=torch.tensor([0, 0]))
        with pytest.raises(ValueError, match="PCF needs at least 2 samples, got 1"):
            metric.compute()


@pytest.mark.parametrize(
    ("value", "error"), [((1.5,), ValueError), ((-0.5,), ValueError), ((), ValueError), ("0.5", TypeError)]
)
def test_bad_pcf_variance(value: Any, error: type) -> None:
    with pytest.raises(error, match="`pcf_variance`"):
        PCF(pcf_variance=value)


def test_unknown_keyword() -> None:
    with pytest.raises(ValueError, match="Unexpected keyword arguments: `variance`"):
        PCF(variance=(0.5,))


# ---- state handling ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_indexes", [False, True])
def test_reset_clone_pickle_state_dict(with_indexes: bool) -> None:
    x = low_rank(20, 5, 3, seed=6)
    indexes = torch.arange(20) if with_indexes else None
    metric = feed(PCF(pcf_variance=FRACTIONS), x, "random", indexes=indexes)
    expected = as_floats(metric.compute())
    assert as_floats(metric.clone().compute()) == expected
    assert as_floats(pickle.loads(pickle.dumps(metric)).compute()) == expected
    metric.persistent(True)
    fresh = PCF(pcf_variance=FRACTIONS)
    fresh.persistent(True)
    fresh.load_state_dict(metric.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert as_floats(fresh.compute()) == expected
    metric.reset()
    assert int(metric.count) == 0 and metric.row_sum.shape == (0,) and metric.embeddings == []
    assert as_floats(feed(metric, x, "one", indexes=None).compute()) == expected  # the other mode after reset


def test_metric_collection_with_embedding_metrics() -> None:
    x = low_rank(24, 6, 3, seed=9)
    labels = torch.arange(24) % 4
    collection = MetricCollection(
        {"pcf": PCF(pcf_variance=(0.5, 0.9)), "ranking": EmbeddingMetrics(cmc_top_k=(1,), pcf_variance=(0.5, 0.9))}
    )
    for rows in torch.arange(24).split(7):
        collection.update(embeddings=x[rows], labels=labels[rows])  # keywords: each member takes its arguments
    values = collection.compute()
    expected = numpy_pcf(x, (0.5, 0.9))
    for r in ("0.5", "0.9"):  # the standalone PCF and the one inside EmbeddingMetrics agree
        assert float(values[f"pcf_pcf/{r}"]) == float(values[f"ranking_pcf/{r}"])
        assert float(values[f"pcf_pcf/{r}"]) == pytest.approx(expected[f"pcf/{r}"])


def test_plots() -> None:
    import matplotlib  # a declared test dependency (the `test` extra): a missing one fails, not skips

    matplotlib.use("Agg")
    metric = PCF(pcf_variance=(0.5, 1.0))
    metric.update(torch.eye(4, 10))
    fig, ax = metric.plot_curve()
    xs, ys = ax.lines[0].get_data()
    assert xs.tolist() == [0, 1, 2, 3, 4] and ys.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1, 1])
    marks = [tuple(c.get_offsets()[0]) for c in ax.collections]
    assert marks == [(2.0, 0.5), (5.0, 1.0)]  # n = pcf * d components: 0.2 * 10 and 0.5 * 10
    fig, _ = metric.plot()
    assert fig is not None
    constant = PCF()
    constant.update(torch.ones(3, 2))
    with pytest.warns(UserWarning, match="zero variance"):
        constant.plot_curve()  # nothing to mark, no crash


def test_class_flags() -> None:
    assert PCF.is_differentiable is False and PCF.full_state_update is False
    assert PCF.higher_is_better is True
    assert (PCF.plot_lower_bound, PCF.plot_upper_bound) == (0.0, 1.0)
