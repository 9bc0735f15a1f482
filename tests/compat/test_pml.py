"""compat.pml.AccuracyCalculator against pytorch-metric-learning itself, its documented examples and hand values."""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils import accuracy_calculator as pml_calc
from pytorch_metric_learning.utils import inference as pml_inference

from torchmetrics_retrieval.compat import pml
from torchmetrics_retrieval.compat.pml import AccuracyCalculator
from torchmetrics_retrieval.compat.pml._inputs import locate_rows

logging.getLogger("PML").setLevel(logging.ERROR)

CPU = torch.device("cpu")
NO_CLUSTERING = ("NMI", "AMI")
KNN_METRICS = (
    "mean_average_precision",
    "mean_average_precision_at_r",
    "mean_reciprocal_rank",
    "precision_at_1",
    "r_precision",
)


def clustered(
    n: int, n_classes: int, dim: int = 8, seed: int = 0, spread: float = 0.6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters (continuous values: no exact distance ties)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n_classes, (n,), generator=g)
    centres = torch.randn(n_classes, dim, generator=g)
    x = centres[labels] + spread * torch.randn(n, dim, generator=g)
    return x, labels


def assert_same(ours: dict[str, Any], theirs: dict[str, Any], tol: float = 1e-6) -> None:
    assert list(ours) == list(theirs)
    for name in theirs:
        a, b = ours[name], theirs[name]
        if isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b), name
            assert all(isinstance(v, float) for v in a), name
            np.testing.assert_allclose(a, b, atol=tol, rtol=0, err_msg=name)
        else:
            assert isinstance(a, float), (name, type(a))
            if math.isnan(b):
                assert math.isnan(a), name
            else:
                assert abs(a - b) <= tol, (name, a, b)


def both(*args: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> tuple[dict, dict]:
    options = dict(options or {})
    theirs = pml_calc.AccuracyCalculator(device=CPU, **options).get_accuracy(*args, **kwargs)
    ours = AccuracyCalculator(device=CPU, **options).get_accuracy(*args, **kwargs)
    return ours, theirs


# ----------------------------------------------------------------------------------------------------------------------
# differential tests against pytorch-metric-learning
# ----------------------------------------------------------------------------------------------------------------------

SETUPS = ("self", "prefix", "separate", "lone")


def data(setup: str, seed: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional args, keyword args) of get_accuracy for each way of giving query and reference."""
    x, y = clustered(160, 9, seed=seed)
    if setup == "self":
        return (x, y), {}
    if setup == "prefix":
        return (x[:60], y[:60], x, y), {"ref_includes_query": True}
    if setup == "separate":
        return (x[:60], y[:60], x[60:], y[60:]), {"ref_includes_query": False}
    # queries with labels absent from the reference: lone queries
    ref = y >= 2
    return (x[:70], y[:70], x[70:][ref[70:]], y[70:][ref[70:]]), {}


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("k", [None, 7, "max_bin_count", 30])
@pytest.mark.parametrize("reduction", ["mean", "avg_of_avgs", "return_per_class"])
def test_matches_pml(setup: str, k: Any, reduction: str) -> None:
    args, kwargs = data(setup)
    options = {"exclude": NO_CLUSTERING, "k": k}
    if reduction != "mean":
        options[reduction] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k=7 below the bin count warns
        ours, theirs = both(*args, options=options, **kwargs)
    assert_same(ours, theirs)


@pytest.mark.parametrize(
    ("include", "exclude"),
    [
        (("precision_at_1",), ()),
        ((), ("r_precision", "NMI", "AMI")),
        (("r_precision", "precision_at_1", "NMI"), ("r_precision", "NMI")),
    ],
)
def test_include_exclude_matches_pml(include: tuple[str, ...], exclude: tuple[str, ...]) -> None:
    args, kwargs = data("prefix", seed=1)
    ours, theirs = both(*args, options={"include": include, "exclude": exclude}, **kwargs)
    assert_same(ours, theirs)
    # and the same selection made at get_accuracy time
    ours = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING).get_accuracy(
        *args, **kwargs, include=include, exclude=exclude
    )
    theirs = pml_calc.AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING).get_accuracy(
        *args, **kwargs, include=include, exclude=exclude
    )
    assert_same(ours, theirs)


def test_numpy_inputs_match_pml() -> None:
    args, kwargs = data("separate", seed=2)
    ours, theirs = both(*(a.numpy() for a in args), options={"exclude": NO_CLUSTERING, "k": "max_bin_count"}, **kwargs)
    assert_same(ours, theirs)


def test_clustering_matches_pml_with_the_same_kmeans() -> None:
    x, y = clustered(150, 6, seed=3)
    kmeans = pml_inference.FaissKMeans(niter=20)
    ours = AccuracyCalculator(device=CPU, kmeans_func=kmeans).get_accuracy(x, y)
    theirs = pml_calc.AccuracyCalculator(device=CPU, kmeans_func=kmeans).get_accuracy(x, y)
    assert_same(ours, theirs, tol=1e-9 if False else 1e-6)
    assert ours["NMI"] > 0.5


def test_default_kmeans_gives_close_clustering_scores() -> None:
    x, y = clustered(150, 6, seed=4, spread=0.2)
    ours, theirs = both(x, y, options={"include": NO_CLUSTERING})
    assert abs(ours["NMI"] - theirs["NMI"]) < 0.1 and abs(ours["AMI"] - theirs["AMI"]) < 0.1


@pytest.mark.parametrize("setup", ["self", "separate"])
def test_knn_func_given_matches_pml(setup: str) -> None:
    from pytorch_metric_learning.distances import LpDistance

    args, kwargs = data(setup, seed=5)
    knn_func = pml_inference.CustomKNN(LpDistance(normalize_embeddings=False))
    ours, theirs = both(*args, options={"exclude": NO_CLUSTERING, "knn_func": knn_func}, **kwargs)
    assert_same(ours, theirs)


def test_knn_func_is_called_like_pml() -> None:
    calls: list[tuple[Any, ...]] = []

    def knn_func(query, k, reference, ref_includes_query):  # type: ignore[no-untyped-def]
        calls.append((query.shape, k, reference.shape, ref_includes_query, query.dtype))
        return pml_inference.FaissKNN()(query, k, reference, ref_includes_query)

    x, y = clustered(40, 4, seed=6)
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, knn_func=knn_func, k=5)
    with pytest.warns(UserWarning, match=r"the value for k \(5\) is less than the max bin count") as record:
        calc.get_accuracy(x[:10], y[:10], x, y, True)
    assert record[0].filename == __file__  # reported at the caller's line
    assert calls == [((10, 8), 5, (40, 8), True, torch.float32)]


def reflexive_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x[..., 0] == y[..., 0]


def near(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.abs(x - y) < 1


@pytest.mark.parametrize("setup", ["self", "separate"])
@pytest.mark.parametrize("k", [None, "max_bin_count"])
def test_custom_comparison_matches_pml(setup: str, k: Any) -> None:
    args, kwargs = data(setup, seed=7)
    # 2-D labels: (class, a second column the comparison ignores)
    labels2d = [torch.stack([a, a * 0 + torch.arange(len(a)) % 3], dim=1) if a.ndim == 1 else a for a in args[1::2]]
    args2d = tuple(itertools.chain.from_iterable(zip(args[0::2], labels2d, strict=True)))
    options = {"exclude": NO_CLUSTERING, "k": k, "label_comparison_fn": reflexive_2d}
    ours, theirs = both(*args2d, options=options, **kwargs)
    assert_same(ours, theirs)
    # float labels: class + a small offset, "near" when within 1
    floats = tuple(a if i % 2 == 0 else a.float() * 3 + 0.1 * (torch.arange(len(a)) % 2) for i, a in enumerate(args))
    ours, theirs = both(*floats, options={**options, "label_comparison_fn": near}, **kwargs)
    assert_same(ours, theirs)


def test_non_reflexive_comparison_without_self_matches_pml() -> None:
    """PML and section 3 only part ways when the query is in the reference (its R is off by one)."""
    x, y = clustered(120, 5, seed=8)
    labels = torch.stack([y % 2, y], dim=1)

    def same_parity_other_class(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a[..., 0] == b[..., 0]) & (a[..., 1] != b[..., 1])

    options = {"exclude": NO_CLUSTERING, "label_comparison_fn": same_parity_other_class}
    ours, theirs = both(x[:50], labels[:50], x[50:], labels[50:], False, options=options)
    assert_same(ours, theirs)


def test_calculate_precision_at_2_subclass_on_both() -> None:
    class Ours(AccuracyCalculator):
        def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):  # type: ignore[no-untyped-def]
            return pml.precision_at_k(knn_labels, query_labels[:, None], 2)  # the documented call

        def requires_knn(self):  # type: ignore[no-untyped-def]
            return [*super().requires_knn(), "precision_at_2"]

    class Theirs(pml_calc.AccuracyCalculator):
        def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):  # type: ignore[no-untyped-def]
            return pml_calc.precision_at_k(knn_labels, query_labels[:, None], 2, False, False, torch.eq)

        def requires_knn(self):  # type: ignore[no-untyped-def]
            return [*super().requires_knn(), "precision_at_2"]

    args, kwargs = data("prefix", seed=9)
    ours = Ours(device=CPU, exclude=NO_CLUSTERING).get_accuracy(*args, **kwargs)
    theirs = Theirs(device=CPU, exclude=NO_CLUSTERING).get_accuracy(*args, **kwargs)
    assert "precision_at_2" in ours
    assert_same(ours, theirs)


def test_module_helpers_match_pml() -> None:
    g = torch.Generator().manual_seed(10)
    knn_labels = torch.randint(0, 4, (30, 6), generator=g)
    gt = torch.randint(0, 4, (30,), generator=g)
    reference = torch.randint(0, 4, (60,), generator=g)
    counts = pml_calc.get_label_match_counts(gt, reference, torch.eq)
    ours_counts = pml.get_label_match_counts(gt, reference)
    assert torch.equal(ours_counts[0], counts[0]) and torch.equal(ours_counts[1], counts[1])
    for avg, per_class in [(False, False), (True, False), (False, True)]:
        common = (avg, per_class, torch.eq)
        pairs = [
            (
                pml.precision_at_k(knn_labels, gt[:, None], 3, *common),
                pml_calc.precision_at_k(knn_labels, gt[:, None], 3, *common),
            ),
            (
                pml.r_precision(knn_labels, gt[:, None], True, counts, *common),
                pml_calc.r_precision(knn_labels, gt[:, None], True, counts, *common),
            ),
            (
                pml.mean_average_precision(knn_labels, gt[:, None], False, counts, *common, at_r=True),
                pml_calc.mean_average_precision(knn_labels, gt[:, None], False, counts, *common, at_r=True),
            ),
            (
                pml.mean_average_precision(knn_labels, gt[:, None], True, counts, *common),
                pml_calc.mean_average_precision(knn_labels, gt[:, None], True, counts, *common),
            ),
            (
                pml.mean_reciprocal_rank(knn_labels, gt[:, None], *common),
                pml_calc.mean_reciprocal_rank(knn_labels, gt[:, None], *common),
            ),
        ]
        for ours, theirs in pairs:
            np.testing.assert_allclose(ours, theirs, atol=1e-6, equal_nan=True)
    lone, mask = pml.get_lone_query_labels(gt, counts, True)
    their_lone, their_mask = pml_calc.get_lone_query_labels(gt, counts, True, torch.eq)
    assert torch.equal(lone, their_lone) and torch.equal(mask, their_mask)


# ----------------------------------------------------------------------------------------------------------------------
# keyword arguments seen by custom metrics
# ----------------------------------------------------------------------------------------------------------------------


class Recorder:
    """Mixin recording the keyword arguments passed to a custom kNN metric."""

    seen: dict[str, Any]

    def calculate_record(self, **kwargs: Any) -> float:
        self.seen = kwargs
        return 0.0

    def requires_knn(self) -> list[str]:
        return [*super().requires_knn(), "record"]  # type: ignore[misc]


def test_custom_metric_kwargs_have_pml_types_and_shapes() -> None:
    class Ours(Recorder, AccuracyCalculator):
        pass

    class Theirs(Recorder, pml_calc.AccuracyCalculator):
        pass

    args, kwargs = data("lone", seed=11)
    ours, theirs = (
        Ours(device=CPU, exclude=NO_CLUSTERING, k="max_bin_count"),
        Theirs(device=CPU, exclude=NO_CLUSTERING, k="max_bin_count"),
    )
    ours.get_accuracy(*args, **kwargs)
    theirs.get_accuracy(*args, **kwargs)
    assert set(ours.seen) == set(theirs.seen)
    for name in ("query", "reference", "knn_distances"):
        assert ours.seen[name].shape == theirs.seen[name].shape and ours.seen[name].dtype == torch.float32, name
        torch.testing.assert_close(ours.seen[name], theirs.seen[name], rtol=1e-4, atol=1e-4)
    assert torch.equal(ours.seen["knn_labels"].float(), theirs.seen["knn_labels"])
    assert torch.equal(ours.seen["not_lone_query_mask"], theirs.seen["not_lone_query_mask"])
    assert torch.equal(ours.seen["lone_query_labels"].float(), theirs.seen["lone_query_labels"])
    for a, b in zip(ours.seen["label_counts"], theirs.seen["label_counts"], strict=True):
        assert torch.equal(a.float(), b.float())
    assert ours.seen["ref_includes_query"] is theirs.seen["ref_includes_query"] is False
    # labels keep their dtype (section 3); pytorch-metric-learning casts them to float32
    assert ours.seen["query_labels"].dtype == torch.int64 and theirs.seen["query_labels"].dtype == torch.float32


# ----------------------------------------------------------------------------------------------------------------------
# documented examples (seeds 000 and 001)
# ----------------------------------------------------------------------------------------------------------------------


def test_lone_query_label_example() -> None:
    """query_labels [0,0,1,1] vs reference_labels [1,1,1,2,2]: 0 is a lone query label."""

    class Ours(Recorder, AccuracyCalculator):
        pass

    calc = Ours(device=CPU, exclude=NO_CLUSTERING)
    query = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    reference = torch.tensor([[2.1], [9.0], [9.5], [2.9], [3.2]])
    result = calc.get_accuracy(query, torch.tensor([0, 0, 1, 1]), reference, torch.tensor([1, 1, 1, 2, 2]))
    assert calc.seen["lone_query_labels"].tolist() == [0]
    assert calc.seen["not_lone_query_mask"].tolist() == [False, False, True, True]
    # only the two queries of label 1 count: query [2.0] -> 2.1 (label 1), query [3.0] -> 2.9 (label 2)
    assert result["precision_at_1"] == 0.5


def test_every_query_lone_gives_nan_and_warns() -> None:
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING)
    with pytest.warns(UserWarning, match="None of the query labels are in the reference set"):
        result = calc.get_accuracy(torch.zeros(2, 1), torch.tensor([0, 1]), torch.ones(3, 1), torch.tensor([2, 2, 3]))
    assert all(math.isnan(v) for v in result.values())
    per_class = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, return_per_class=True)
    with pytest.warns(UserWarning):
        result = per_class.get_accuracy(
            torch.zeros(2, 1), torch.tensor([0, 1]), torch.ones(3, 1), torch.tensor([2, 2, 3])
        )
    assert all(len(v) == 2 and all(math.isnan(x) for x in v) for v in result.values())


def doc_fn_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x[..., 0] == y[..., 0]) & (x[..., 1] != y[..., 1])


def test_2d_label_example_follows_section_3() -> None:
    """The documented 2-D labels and comparison (column 0 equal, column 1 different: not reflexive)."""
    labels = torch.tensor([(1, 3), (7, 4), (1, 4), (1, 5), (1, 6)])
    x = torch.tensor([[0.0], [0.5], [1.2], [2.4], [3.9]])
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, label_comparison_fn=doc_fn_2d)
    result = calc.get_accuracy(x, labels)
    # (7, 4) is lone; each (1, *) row has R = 3 relevant rows (the 3 others), ranked by distance:
    # row 0: 1 (7,4) x, 2 v, 3 v, 4 v   row 2: 1 x, 0 v, 3 v, 4 v
    # row 3: 2 v, 4 v, 1 x, 0 v         row 4: 3 v, 2 v, 1 x, 0 v
    hits = {0: [0, 1, 1, 1], 2: [0, 1, 1, 1], 3: [1, 1, 0, 1], 4: [1, 1, 0, 1]}
    r = 3
    p_at_1 = np.mean([h[0] for h in hits.values()])
    r_prec = np.mean([sum(h[:r]) / r for h in hits.values()])

    def ap(h: list[int], upto: int) -> float:
        found, total = 0, 0.0
        for i, rel in enumerate(h[:upto], start=1):
            found += rel
            total += rel * found / i
        return total / r

    assert result["precision_at_1"] == pytest.approx(p_at_1)
    assert result["r_precision"] == pytest.approx(r_prec)
    assert result["mean_average_precision_at_r"] == pytest.approx(np.mean([ap(h, r) for h in hits.values()]))
    assert result["mean_average_precision"] == pytest.approx(np.mean([ap(h, 4) for h in hits.values()]))
    assert result["mean_reciprocal_rank"] == pytest.approx(np.mean([1 / (h.index(1) + 1) for h in hits.values()]))
    # pytorch-metric-learning uses R = 2 here (it always subtracts the query's own row)
    theirs = pml_calc.AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, label_comparison_fn=doc_fn_2d)
    assert theirs.get_accuracy(x, labels)["r_precision"] == pytest.approx(
        np.mean([sum(h[:2]) / 2 for h in hits.values()])
    )


def test_float_label_example() -> None:
    labels = torch.tensor([10.0, 0.03, 0.04, 0.05])
    x = torch.tensor([[0.0], [1.0], [3.0], [2.5]])
    result = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, label_comparison_fn=near).get_accuracy(x, labels)
    # 10.0 is lone; the three others all match each other (R = 2), and the lone row is at 0.0:
    # row 1 (1.0): 0 x, 3 v, 2 v   row 2 (3.0): 3 v, 1 v   row 3 (2.5): 2 v, 1 v
    assert result["precision_at_1"] == pytest.approx(2 / 3)
    assert result["r_precision"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert result["mean_average_precision_at_r"] == pytest.approx((0.25 + 1 + 1) / 3)
    assert result["mean_average_precision"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + 1 + 1) / 3)
    assert result["mean_reciprocal_rank"] == pytest.approx((0.5 + 1 + 1) / 3)


def test_constructor_example_with_snr_distance_matches_pml() -> None:
    from pytorch_metric_learning.distances import SNRDistance

    x, y = clustered(80, 4, seed=12)
    labels = torch.stack([y, torch.arange(80) % 5], dim=1)
    options = {
        "exclude": NO_CLUSTERING,
        "label_comparison_fn": doc_fn_2d,
        "knn_func": pml_inference.CustomKNN(SNRDistance()),
    }
    ours, theirs = both(x[:30], labels[:30], x[30:], labels[30:], False, options=options)
    assert_same(ours, theirs)


def test_custom_calculator_example() -> None:
    """precision_at_2 with requires_knn and fancy_mutual_info with requires_clustering."""

    class YourCalculator(AccuracyCalculator):
        def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):  # type: ignore[no-untyped-def]
            return pml.precision_at_k(knn_labels, query_labels[:, None], 2)

        def calculate_fancy_mutual_info(self, query_labels, cluster_labels, **kwargs):  # type: ignore[no-untyped-def]
            return float(len(torch.unique(cluster_labels)))

        def requires_clustering(self):  # type: ignore[no-untyped-def]
            return [*super().requires_clustering(), "fancy_mutual_info"]

        def requires_knn(self):  # type: ignore[no-untyped-def]
            return [*super().requires_knn(), "precision_at_2"]

    x = torch.tensor([[0.0], [0.1], [0.3], [5.0], [5.2], [5.3]])
    y = torch.tensor([0, 0, 1, 1, 1, 1])
    calculator = YourCalculator(device=CPU)
    acc = calculator.get_accuracy(x, y, x, y, ref_includes_query=True)
    assert {"precision_at_2", "fancy_mutual_info", "NMI", "AMI", "precision_at_1"} <= set(acc)
    # first two neighbours: 0: 1 v, 2 x   1: 0 v, 2 x   2: 1 x, 0 x   3: 4 v, 5 v   4: 5 v, 3 v   5: 4 v, 3 v
    assert acc["precision_at_2"] == pytest.approx((0.5 + 0.5 + 0 + 1 + 1 + 1) / 6)
    assert acc["fancy_mutual_info"] == 2.0  # two distinct labels -> two clusters
    acc = calculator.get_accuracy(x, y, include=("precision_at_2",))
    assert list(acc) == ["precision_at_2"]


def test_v1_call_forms() -> None:
    """Seed 000: get_accuracy(query, reference, query_labels, reference_labels, embeddings_come_from_same_source)."""
    x, y = clustered(60, 4, seed=13)
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING)
    expected = calc.get_accuracy(x[:20], y[:20], x, y, True)
    with pytest.warns(DeprecationWarning):
        assert calc.get_accuracy(x[:20], x, y[:20], y, True) == expected
    with pytest.warns(DeprecationWarning):
        assert calc.get_accuracy(x[:20], x, y[:20], y, embeddings_come_from_same_source=True) == expected
    with pytest.warns(DeprecationWarning):
        got = calc.get_accuracy(
            query=x[:20], reference=x, query_labels=y[:20], reference_labels=y, embeddings_come_from_same_source=True
        )
    assert got == expected
    separate = calc.get_accuracy(x[:20], y[:20], x[20:], y[20:], False)
    with pytest.warns(DeprecationWarning):
        assert calc.get_accuracy(x[:20], x[20:], y[:20], y[20:], False) == separate


def test_v1_subset_anywhere_locates_own_rows() -> None:
    x, y = clustered(60, 4, seed=14)
    picked = torch.tensor([41, 3, 17, 58])
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING)
    with pytest.warns(DeprecationWarning):
        got = calc.get_accuracy(x[picked], x, y[picked], y, embeddings_come_from_same_source=True)
    rest = torch.ones(60, dtype=torch.bool)
    rest[picked] = False
    reordered = torch.cat([x[picked], x[rest]]), torch.cat([y[picked], y[rest]])
    expected = calc.get_accuracy(x[picked], y[picked], reordered[0], reordered[1], True)
    assert got == expected


def test_locate_rows_matches_repeats_in_order() -> None:
    reference = torch.tensor([[1.0], [0.0], [2.0], [0.0], [0.0]])
    reference_labels = torch.tensor([5, 6, 5, 6, 7])
    query, query_labels = torch.tensor([[0.0], [0.0], [2.0], [0.0]]), torch.tensor([6, 6, 5, 7])
    assert locate_rows(query, query_labels, reference, reference_labels).tolist() == [1, 3, 2, 4]


def test_duplicates_are_real_neighbours() -> None:
    """A duplicate of the query at distance 0 is a neighbour; only the query's own row is removed (section 3)."""
    reference = torch.tensor([[0.0], [0.0], [3.0]])
    labels = torch.tensor([5, 6, 6])
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING)
    with pytest.warns(DeprecationWarning):
        result = calc.get_accuracy(
            reference[1:2], reference, labels[1:2], labels, embeddings_come_from_same_source=True
        )
    # query = row 1; neighbours: row 0 (distance 0, label 5) then row 2 (label 6); R = 1
    assert result == {
        "mean_average_precision": 0.5,
        "mean_average_precision_at_r": 0.0,
        "mean_reciprocal_rank": 0.5,
        "precision_at_1": 0.0,
        "r_precision": 0.0,
    }
    # 2.x, whole set, label 5 lone: row 0 -> row 1 (distance 0, label 5) x; row 2 -> rows 0 and 1 tie at
    # distance 3, the lower position first: row 0 (label 6) v
    result = calc.get_accuracy(reference, torch.tensor([6, 5, 6]), include=("precision_at_1",))
    assert result == {"precision_at_1": 0.5}


def test_int_labels_above_2_24_do_not_collide() -> None:
    labels = torch.tensor([2**24, 2**24 + 1, 2**24, 2**24 + 1])
    x = torch.tensor([[0.0], [1.0], [3.0], [1.1]])
    result = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING).get_accuracy(x, labels, include=("precision_at_1",))
    # 0 -> 1 (other label), 1 -> 3 (same), 2 -> 3 (other), 3 -> 1 (same)
    assert result["precision_at_1"] == 0.5


def test_k_modes_and_warning() -> None:
    """Seeds 000/001: reference_labels [0,0,1,1,1,1,2] -> "max_bin_count" k = 4 (3 when it includes the query)."""
    seen: list[int] = []

    def knn_func(query, k, reference, ref_includes_query):  # type: ignore[no-untyped-def]
        seen.append(k)
        return pml.ExactKNN()(query, k, reference, ref_includes_query)

    reference = torch.arange(7.0)[:, None]
    labels = torch.tensor([0, 0, 1, 1, 1, 1, 2])
    for k in ("max_bin_count", None, 2):
        calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, k=k, knn_func=knn_func)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            calc.get_accuracy(reference + 0.5, labels, reference, labels)
            calc.get_accuracy(reference, labels)
        too_small = [w for w in caught if "less than the max bin count (4)" in str(w.message)]
        assert len(too_small) == (2 if k == 2 else 0)
    assert seen == [4, 3, 7, 6, 2, 2]
    # no warning when MAP@R and R-precision are not computed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AccuracyCalculator(device=CPU, include=("precision_at_1",), k=1).get_accuracy(reference, labels)


def test_k_above_the_reference_size_is_capped() -> None:
    """pytorch-metric-learning reads faiss' -1 padding as the last reference's label (its MAP exceeds 1 then)."""
    x, y = clustered(40, 4, seed=15)
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, k=500)
    assert calc.get_accuracy(x, y) == AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING).get_accuracy(x, y)
    theirs = pml_calc.AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, k=500).get_accuracy(x, y)
    assert theirs["mean_average_precision"] > 1


def test_mrr_alone_works() -> None:
    x = torch.tensor([[0.0], [1.0], [1.5], [10.0]])
    result = AccuracyCalculator(device=CPU, include=("mean_reciprocal_rank",)).get_accuracy(
        x, torch.tensor([0, 1, 0, 1])
    )
    # 0: 1 x, 2 v -> 1/2   1: 2 x, 0 x, 3 v -> 1/3   2: 1 x, 0 v -> 1/2   3: 2 x, 1 v -> 1/2
    assert result["mean_reciprocal_rank"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2 + 1 / 2) / 4)


def test_return_per_class_order_and_avg_of_avgs() -> None:
    x = torch.tensor([[0.0], [0.4], [1.0], [10.0], [10.3], [12.0]])
    y = torch.tensor([3, 3, 1, 1, 1, 3])
    # nearest: 0 -> 1 v, 1 -> 0 v, 2 -> 1 x, 3 -> 4 v, 4 -> 3 v, 5 -> 4 x
    per_class = AccuracyCalculator(device=CPU, include=("precision_at_1",), return_per_class=True).get_accuracy(x, y)
    assert per_class == {"precision_at_1": [pytest.approx(2 / 3), pytest.approx(2 / 3)]}
    avg = AccuracyCalculator(device=CPU, include=("precision_at_1",), avg_of_avgs=True).get_accuracy(x, y)
    assert avg["precision_at_1"] == pytest.approx(2 / 3)
    assert AccuracyCalculator(avg_of_avgs=True).description() == "avg_of_avgs"


def test_device_and_defaults() -> None:
    calc = AccuracyCalculator(device="cpu")
    assert calc.device == CPU and calc.k is None and calc.label_comparison_fn is torch.eq
    assert calc.get_curr_metrics() == ["AMI", "NMI", *KNN_METRICS]
    assert isinstance(calc.knn_func, pml.ExactKNN) and isinstance(calc.kmeans_func, pml.KMeans)


# ----------------------------------------------------------------------------------------------------------------------
# validation errors
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"include": "NMI"}, TypeError, "Arguments must be of type tuple"),
        ({"exclude": {"NMI"}}, TypeError, "Arguments must be of type tuple"),
        ({"include": ("nmi",)}, ValueError, "Primary metrics must be one or more of"),
        ({"exclude": ("precision_at_5",)}, ValueError, "Primary metrics must be one or more of"),
        ({"avg_of_avgs": True, "return_per_class": True}, ValueError, "mutually exclusive"),
        ({"k": 0}, ValueError, "k must be an integer greater than 0"),
        ({"k": -3}, ValueError, "k must be an integer greater than 0"),
        ({"k": 2.5}, ValueError, "k must be an integer greater than 0"),
        ({"k": "max"}, ValueError, "k must be an integer greater than 0"),
        ({"k": True}, ValueError, "k must be an integer greater than 0"),
        ({"label_comparison_fn": near}, NotImplementedError, "clustering \\+ custom label comparison"),
        ({"label_comparison_fn": 3, "exclude": NO_CLUSTERING}, TypeError, "label_comparison_fn"),
    ],
)
def test_constructor_errors_like_pml(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        AccuracyCalculator(**options)
    if options.get("label_comparison_fn") != 3 and options.get("k") is not True:
        with pytest.raises(error, match=match):
            pml_calc.AccuracyCalculator(**options)


X, Y = torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((X, Y[:5]), {}, ValueError, "embeddings and labels must have the same length"),
        ((X, Y, X, Y[:5]), {}, ValueError, "embeddings and labels must have the same length"),
        ((X, Y, X[:4], Y[:4]), {"ref_includes_query": True}, ValueError, "first len\\(query\\) elements of reference"),
        ((X[2:], Y[2:], X, Y), {"ref_includes_query": True}, ValueError, "first len\\(query\\) elements of reference"),
        ((X, Y, X), {}, ValueError, "`reference_labels` must be given"),
        ((X, Y, None, Y), {}, ValueError, "`reference_labels` must be None"),
        ((X, Y, X[:, :1], Y), {}, ValueError, "`reference` must have 2 columns"),
        ((X, Y, X, Y[:, None].repeat(1, 2)), {}, ValueError, "label shape"),
        ((X.tolist(), Y), {}, TypeError, "`query` must be a torch.Tensor or a numpy array"),
        ((X, Y.tolist()), {}, TypeError, "`query_labels` must be a torch.Tensor"),
        ((X[:, :, None], Y), {}, ValueError, "`query` must be 2-D"),
        ((X, Y[:, None, None]), {}, ValueError, "`query_labels` must be 1-D or 2-D"),
        ((X.masked_fill(X > 0, float("nan")), Y), {}, ValueError, "`query` must be finite"),
        ((X, Y), {"include": ("precision_at_5",)}, ValueError, "Primary metrics must be one or more of"),
        ((X, Y), {"exclude": "NMI"}, TypeError, "Arguments must be of type tuple"),
        ((X[:2] + 9, Y[:2], X, Y), {"embeddings_come_from_same_source": True}, ValueError, "query row 0 is not"),
    ],
)
def test_get_accuracy_errors(args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING)
    before = calc.get_curr_metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match=match):
            calc.get_accuracy(*args, **kwargs)
    assert calc.get_curr_metrics() == before


def test_bad_label_comparison_output() -> None:
    calc = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, label_comparison_fn=lambda a, b: (a == b).float())
    with pytest.raises(TypeError, match="`label_comparison_fn` must return a bool tensor"):
        calc.get_accuracy(X, Y)


def test_int_embeddings_are_cast_like_pml() -> None:
    x = torch.tensor([[0], [1], [5], [7]])
    y = torch.tensor([0, 0, 1, 1])
    ours, theirs = both(x, y, options={"exclude": NO_CLUSTERING})
    assert_same(ours, theirs)


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_knn_backends_agree(backend: str) -> None:
    args, kwargs = data("prefix", seed=16)
    default = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING).get_accuracy(*args, **kwargs)
    chosen = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING, knn_func=pml.ExactKNN(backend)).get_accuracy(
        *args, **kwargs
    )
    assert chosen == default


def test_2d_labels_default_comparison_is_whole_row_equality() -> None:
    x = torch.tensor([[0.0], [1.0], [0.4], [5.0]])
    labels = torch.tensor([(1, 0), (1, 0), (1, 1), (2, 0)])
    result = AccuracyCalculator(device=CPU, exclude=NO_CLUSTERING).get_accuracy(x, labels)
    # rows 0 and 1 match each other only (rows 2 and 3 are lone); both have row 2 nearer than each other
    assert result["precision_at_1"] == 0.0
    assert result["mean_reciprocal_rank"] == 0.5
    assert result["mean_average_precision"] == 0.5


def test_helpers_accept_labels_without_the_extra_axis() -> None:
    knn_labels = torch.tensor([[1, 2, 1], [3, 3, 0]])
    gt = torch.tensor([1, 3])
    assert pml.precision_at_k(knn_labels, gt, 2) == pml.precision_at_k(knn_labels, gt[:, None], 2) == 0.75
    assert pml.mean_reciprocal_rank(knn_labels, gt, return_per_class=True) == [1.0, 1.0]
    assert pml.maybe_get_avg_of_avgs(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([5, 5, 6]), False, True) == [0.5, 0.0]
    assert pml.try_getting_not_lone_labels(knn_labels, gt, torch.tensor([False, False])) == (None, None)
    assert math.isnan(pml.nan_accuracy(torch.tensor([1, 2]), False))
    assert torch.equal(pml.get_unique_labels(torch.tensor([[2, 1], [0, 1], [2, 1]])), torch.tensor([[0, 1], [2, 1]]))
