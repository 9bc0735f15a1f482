"""Every metric class inside a torchmetrics ``MetricCollection``: positional calls, forward, compute groups."""

from __future__ import annotations

import warnings

import pytest
import torch
from torchmetrics import MetricCollection

from torchmetrics_retrieval.metrics import PCF, EmbeddingMetrics, FNMRAtFMR


def _data(n: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 5, (n,), generator=generator)


def test_positional_update_reaches_every_member() -> None:
    """``collection.update(x, y)``: PCF takes the labels and ignores them; each member equals the metric alone."""
    x, y = _data()
    members = {
        "ranking": lambda: EmbeddingMetrics(cmc_top_k=(1, 3), mrr=True),
        "pairs": lambda: FNMRAtFMR(fmr_vals=(0.1,), eer=True),
        "spread": lambda: PCF(pcf_variance=(0.5, 0.9)),
    }
    collection = MetricCollection({name: make() for name, make in members.items()})
    alone = {name: make() for name, make in members.items()}
    for rows in torch.arange(len(y)).split(25):
        collection.update(x[rows], y[rows])
        for metric in alone.values():
            metric.update(x[rows], y[rows])
    expected = {key: value for metric in alone.values() for key, value in metric.compute().items()}
    values = collection.compute()
    assert sorted(values) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(values[key], value), key


def test_forward_returns_the_batch_values_of_every_member() -> None:
    x, y = _data(seed=1)
    collection = MetricCollection({"ranking": EmbeddingMetrics(cmc_top_k=(1,)), "spread": PCF()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics' advice on full_state_update
        batch = collection(x[:30], y[:30])
    alone = {**EmbeddingMetrics(cmc_top_k=(1,))(x[:30], y[:30]), **PCF()(x[:30])}
    assert sorted(batch) == sorted(alone)
    for key, value in alone.items():
        assert torch.equal(batch[key], value), key


def test_metrics_with_the_same_states_share_one_compute_group() -> None:
    """Two EmbeddingMetrics asking for different metrics hold the same samples: torchmetrics updates one."""
    x, y = _data(seed=2)
    cmc = {"cmc_top_k": (1,), "precision_top_k": (), "map_top_k": ()}
    map_at_r = {"cmc_top_k": (), "precision_top_k": (), "map_top_k": (), "map_at_r": True}
    collection = MetricCollection({"cmc": EmbeddingMetrics(**cmc), "map": EmbeddingMetrics(**map_at_r)})
    collection.update(x[:30], y[:30])
    collection.update(x[30:], y[30:])
    assert list(collection.compute_groups.values()) == [["cmc", "map"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        separate = {**EmbeddingMetrics(**cmc)(x, y), **EmbeddingMetrics(**map_at_r)(x, y)}
    values = collection.compute()
    assert sorted(values) == sorted(separate)
    for key, value in separate.items():
        assert torch.equal(values[key], value), key


def test_pcf_labels_are_checked_and_a_bad_batch_changes_nothing() -> None:
    metric = PCF()
    x, y = _data(seed=3)
    metric.update(x[:10], y[:10])
    with pytest.raises(ValueError, match="`labels` must have one row per embedding, got 9 rows for 10"):
        metric.update(x[10:20], y[10:19])
    with pytest.raises(TypeError, match="`labels` must be None or a"):
        metric.update(x[10:20], [1, 2])  # type: ignore[arg-type]
    assert int(metric.count) == 10
