"""Confidence intervals of the ranking keys (``confidence_level``, ``n_bootstrap``, ``seed``) against a slow reference.

The reference computes each query's value with ``tests/reference.py`` (no package code), draws the resamples as
the documented rule says (one ``torch.randint(Q, (R, Q))`` from a CPU generator seeded with ``seed``, over the
counted queries in order), recomputes the key's reduction on each resample in Python and takes numpy's linear
quantiles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchmetrics_retrieval.functional as F
from tests import reference


def data(n: int = 120, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 9, (n,), generator=g)
    labels[0] = 99  # a lone query: not counted
    return torch.randn(n, 5, generator=g) + labels[:, None].float() / 4, labels


def reference_interval(values: list[float], level: float, n_bootstrap: int, seed: int, groups: list[int] | None = None):
    draws = torch.randint(len(values), (n_bootstrap, len(values)), generator=torch.Generator().manual_seed(seed))
    stats = []
    for row in draws.tolist():
        if groups is None:
            stats.append(sum(values[i] for i in row) / len(row))
            continue
        by_group: dict[int, list[float]] = {}
        for i in row:
            by_group.setdefault(groups[i], []).append(values[i])
        stats.append(sum(sum(v) / len(v) for v in by_group.values()) / len(by_group))
    return np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])


def counted_values(x: torch.Tensor, labels: torch.Tensor, metric) -> tuple[list[float], list[int]]:
    refs = reference.leave_one_out(x, labels)
    kept = [(metric(r), int(labels[i])) for i, r in enumerate(refs) if r.n_relevant > 0]
    return [v for v, _ in kept], [g for _, g in kept]


@pytest.mark.parametrize("level", [0.9, 0.5])
def test_mean_keys_match_the_reference(level: float) -> None:
    x, labels = data()
    got = F.retrieval_metrics(
        x, labels, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), map_at_r=True,
        confidence_level=level, n_bootstrap=300, seed=7,
    )  # fmt: skip
    for key, metric in (("cmc/1", lambda r: reference.cmc(r, 1)), ("map_at_r", reference.map_at_r)):
        values, _ = counted_values(x, labels, metric)
        low, high = reference_interval(values, level, 300, 7)
        assert got[f"{key}/ci_low"].item() == pytest.approx(low, abs=1e-6), key
        assert got[f"{key}/ci_high"].item() == pytest.approx(high, abs=1e-6), key
        assert got[f"{key}/ci_low"] <= got[key] <= got[f"{key}/ci_high"]


def test_average_of_averages_resamples_the_average_of_label_means() -> None:
    x, labels = data(seed=1)
    got = F.retrieval_metrics(
        x, labels, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), avg_of_avgs=True,
        confidence_level=0.8, n_bootstrap=200, seed=3,
    )  # fmt: skip
    values, label_of = counted_values(x, labels, lambda r: reference.cmc(r, 1))
    dense = {label: i for i, label in enumerate(sorted(set(label_of)))}
    low, high = reference_interval(values, 0.8, 200, 3, [dense[label] for label in label_of])
    assert got["cmc/1/ci_low"].item() == pytest.approx(low, abs=1e-6)
    assert got["cmc/1/ci_high"].item() == pytest.approx(high, abs=1e-6)


def test_each_category_is_resampled_within_itself() -> None:
    x, labels = data(seed=2)
    categories = torch.arange(120) % 3
    got = F.retrieval_metrics(
        x, labels, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), categories=categories,
        confidence_level=0.9, n_bootstrap=100, seed=5,
    )  # fmt: skip
    refs = reference.leave_one_out(x, labels)
    for category in range(3):
        values = [reference.cmc(r, 1) for i, r in enumerate(refs) if r.n_relevant > 0 and i % 3 == category]
        low, high = reference_interval(values, 0.9, 100, 5)
        assert got[f"{category}/cmc/1/ci_low"].item() == pytest.approx(low, abs=1e-6)
        assert got[f"{category}/cmc/1/ci_high"].item() == pytest.approx(high, abs=1e-6)


def test_deterministic_for_a_seed_and_off_by_default() -> None:
    x, labels = data(seed=3)
    first = F.retrieval_metrics(x, labels, confidence_level=0.95, seed=11)
    again = F.retrieval_metrics(x, labels, confidence_level=0.95, seed=11)
    other = F.retrieval_metrics(x, labels, confidence_level=0.95, seed=12)
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert any(not torch.equal(first[key], other[key]) for key in first if key.endswith("/ci_low"))
    assert not any(key.endswith(("/ci_low", "/ci_high")) for key in F.retrieval_metrics(x, labels))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"confidence_level": 1.0}, ValueError, "`confidence_level` must be a number in \\(0, 1\\), got 1.0"),
        ({"confidence_level": 0}, ValueError, "`confidence_level` must be a number in \\(0, 1\\), got 0"),
        ({"confidence_level": "95%"}, TypeError, "`confidence_level` must be a number in \\(0, 1\\), got '95%'"),
        ({"confidence_level": 0.9, "n_bootstrap": 0}, ValueError, "`n_bootstrap` must be an int >= 1, got 0"),
        ({"confidence_level": 0.9, "n_bootstrap": 2.5}, TypeError, "`n_bootstrap` must be an int"),
        ({"confidence_level": 0.9, "seed": -1}, ValueError, "`seed` must be an int in \\[0, 2\\*\\*63\\), got -1"),
        ({"confidence_level": 0.9, "seed": True}, TypeError, "`seed` must be an int >= 0, got True"),
    ],
)
def test_bad_options_name_the_argument(options: dict, error: type, match: str) -> None:
    x, labels = data(20)
    with pytest.raises(error, match=match):
        F.retrieval_metrics(x, labels, **options)
