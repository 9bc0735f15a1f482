"""EmbeddingMetrics in one process: class == functional == slow reference, any batch split; errors; state handling."""

from __future__ import annotations

import math
import pickle
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor
from torchmetrics import MetricCollection

from tests.metrics._helpers import ALL_RANKING, feed, make_data, pick, slow_metrics
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.metrics import EmbeddingMetrics

SPLITS = ("one", "single", "random")


def assert_same(actual: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    """Identical keys and bit-identical values (NaN == NaN)."""
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert actual[key].ndim == 0, key
        torch.testing.assert_close(actual[key], value, rtol=0, atol=0, equal_nan=True, msg=key)


def assert_close_to_reference(actual: dict[str, Tensor], expected: dict[str, float], prefix: str = "") -> None:
    assert sorted(actual) == sorted(prefix + key for key in expected)
    for key, value in expected.items():
        got = float(actual[prefix + key])
        assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value, abs=1e-6), key


def functional(data: dict[str, Tensor], **options: Any) -> dict[str, Tensor]:
    rest = {k: v for k, v in data.items() if k not in ("embeddings", "labels")}
    return retrieval_metrics(data["embeddings"], data["labels"], **rest, **options)


def snapshot(metric: EmbeddingMetrics) -> dict[str, list[Tensor]]:
    return {name: [t.clone() for t in getattr(metric, name)] for name in metric._defaults}


def assert_same_state(metric: EmbeddingMetrics, before: dict[str, list[Tensor]]) -> None:
    after = snapshot(metric)
    assert after.keys() == before.keys()
    for name in before:
        assert len(after[name]) == len(before[name]), name
        for a, b in zip(after[name], before[name], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), name


# ---- class vs functional vs reference -------------------------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(
    "fields",
    [
        (),
        ("is_query", "is_gallery"),
        ("sequence_ids",),
        ("search_groups", "is_query"),
        ("categories",),
        ("camera_ids", "is_gallery"),
        ("camera_ids", "sequence_ids", "search_groups"),
    ],
    ids=["leave-one-out", "masks", "sequences", "groups", "categories", "cameras", "cameras+sequences+groups"],
)
def test_matches_functional_and_reference(split: str, fields: tuple[str, ...]) -> None:
    data = pick(make_data(n=36, seed=len(fields)), fields)
    metric = feed(EmbeddingMetrics(**ALL_RANKING), data, split, seed=3)
    result = metric.compute()
    assert_same(result, functional(data, **ALL_RANKING))
    assert_close_to_reference(result, slow_metrics(**data, **ALL_RANKING))


@pytest.mark.parametrize("seed", range(4))
def test_random_splits_give_identical_results(seed: int) -> None:
    data = pick(make_data(n=30, seed=seed), ("is_query", "sequence_ids"))
    expected = feed(EmbeddingMetrics(**ALL_RANKING), data, "one").compute()
    assert_same(feed(EmbeddingMetrics(**ALL_RANKING), data, "random", seed=seed).compute(), expected)


def test_per_class_prefix_and_categories() -> None:
    data = pick(make_data(n=40, n_labels=4, seed=7), ("categories", "is_gallery"))
    options = {"cmc_top_k": (1, 2), "precision_top_k": (3,), "map_top_k": (3,), "mrr": True, "per_class": True}
    result = feed(EmbeddingMetrics(prefix="val/", **options), data, "random").compute()
    assert all(key.startswith("val/") for key in result)
    assert "val/cmc/1/class/0" in result and "val/0/cmc/1" in result
    assert_close_to_reference(result, slow_metrics(**data, **options), prefix="val/")
    assert_same({k[len("val/") :]: v for k, v in result.items()}, functional(data, **options))


@pytest.mark.parametrize("action", ["neg", "pos"])
def test_empty_target_action_and_avg_of_avgs(action: str) -> None:
    data = pick(make_data(n=30, n_labels=12, seed=2), ())  # many lone queries
    options = {"empty_target_action": action, "avg_of_avgs": True, "mrr": True}
    assert_same(feed(EmbeddingMetrics(**options), data, "random").compute(), functional(data, **options))
    options.pop("avg_of_avgs")
    assert_close_to_reference(
        feed(EmbeddingMetrics(**options), data, "single").compute(), slow_metrics(**data, **options)
    )


def test_two_column_labels_cosine_and_float64() -> None:
    g = torch.Generator().manual_seed(5)
    data = {
        "embeddings": torch.randn(25, 4, generator=g, dtype=torch.float64),
        "labels": torch.randint(0, 2, (25, 2), generator=g),
    }
    options = {"distance": "cosine", "per_class": True, "recall_top_k": (3,)}
    result = feed(EmbeddingMetrics(**options), data, "random").compute()
    assert_same(result, functional(data, **options))
    assert "cmc/1/class/0_1" in result


def test_storage_dtype_halves_memory_and_reports_float32() -> None:
    data = make_data(n=30, seed=4)  # small integers: exact in float16
    data = pick(data, ("is_query",))
    metric = feed(EmbeddingMetrics(storage_dtype=torch.float16, **ALL_RANKING), data, "random")
    assert all(t.dtype == torch.float16 for t in metric.embeddings)
    assert_same(metric.compute(), functional(data, **ALL_RANKING))
    assert metric.per_query is not None and metric.per_query.distances.dtype == torch.float32


def test_later_batches_are_cast_to_the_first_dtype() -> None:
    data = make_data(n=20, seed=1)
    metric = EmbeddingMetrics()
    metric.update(data["embeddings"][:10], data["labels"][:10])
    metric.update(data["embeddings"][10:].double(), data["labels"][10:])
    assert [t.dtype for t in metric.embeddings] == [torch.float32, torch.float32]
    assert_same(metric.compute(), functional(pick(data, ())))


def test_indexes_deduplicate_and_order() -> None:
    data = pick(make_data(n=30, seed=9), ("is_query", "categories"))
    expected = functional(data, **ALL_RANKING)
    order = torch.randperm(30, generator=torch.Generator().manual_seed(0))
    duplicated = torch.cat([order, order[:7]])  # as DistributedSampler pads, a few samples twice
    shuffled = {name: value[duplicated] for name, value in data.items()}
    shuffled["indexes"] = duplicated + 100  # any integers: only their order matters
    metric = feed(EmbeddingMetrics(**ALL_RANKING), shuffled, "random")
    assert_same(metric.compute(), expected)
    assert metric.sample_indexes is not None and metric.sample_indexes.tolist() == list(range(100, 130))


def test_without_indexes_the_order_is_the_update_order() -> None:
    data = make_data(n=30, seed=11)
    reordered = {name: torch.cat([value[15:], value[:15]]) for name, value in pick(data, ()).items()}
    metric = EmbeddingMetrics(**ALL_RANKING)
    metric.update(data["embeddings"][15:], data["labels"][15:])
    metric.update(data["embeddings"][:15], data["labels"][:15])
    assert_same(metric.compute(), functional(reordered, **ALL_RANKING))
    assert metric.sample_indexes is None


def test_fmr_pcf_and_clustering_go_through_the_functional_core() -> None:
    g = torch.Generator().manual_seed(0)
    data = {"embeddings": torch.randn(40, 6, generator=g), "labels": torch.randint(0, 4, (40,), generator=g)}
    options = {"fmr_vals": (0.1, 0.5), "pcf_variance": (0.5, 0.9), "clustering": True}
    result = feed(EmbeddingMetrics(**options), data, "random").compute()
    assert {"fnmr@fmr/0.1", "tar@far/0.5", "pcf/0.9", "nmi", "ami"} <= set(result)
    assert_same(result, functional(data, **options))


# ---- per-query results ---------------------------------------------------------------------------------------------


def test_per_query_and_worst_queries() -> None:
    x = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]])
    labels = torch.tensor([0, 0, 1, 1, 1])
    metric = EmbeddingMetrics(cmc_top_k=(1,), precision_top_k=(), map_top_k=(2,), prefix="val/")
    metric.update(x[:2], labels[:2], indexes=torch.tensor([10, 11]))
    metric.update(x[2:], labels[2:], indexes=torch.tensor([12, 13, 14]))
    with pytest.raises(RuntimeError, match="call compute"):
        metric.worst_queries("cmc/1")
    metric.compute()
    result = metric.per_query
    assert result is not None
    # by hand: nearest of each point is 0.2, 0.2, 5.1, 5.0, 0.3
    assert result.indices[:, 0].tolist() == [4, 4, 3, 2, 1]
    assert result.values["cmc/1"].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert metric.worst_queries("cmc/1", 2).tolist() == [0, 1]
    assert metric.worst_queries("val/map/2", 1).tolist() == [4]  # 0.2: nothing relevant in its top 2
    with pytest.raises(ValueError, match="`key`"):
        metric.worst_queries("cmc/7")
    with pytest.raises(ValueError, match="`n`"):
        metric.worst_queries("cmc/1", 0)
    metric.reset()
    assert metric.per_query is None and metric.sample_indexes is None


# ---- bad input -------------------------------------------------------------------------------------------------


def _first_batch() -> dict[str, Tensor]:
    return {
        "embeddings": torch.zeros(4, 3),
        "labels": torch.tensor([0, 1, 0, 1]),
        "is_query": torch.tensor([True, True, False, True]),
        "indexes": torch.arange(4),
    }


def _bad(**changes: Any) -> dict[str, Any]:
    batch: dict[str, Any] = {
        "embeddings": torch.ones(2, 3),
        "labels": torch.tensor([1, 2]),
        "is_query": torch.tensor([True, False]),
        "indexes": torch.tensor([4, 5]),
    }
    batch.update(changes)
    return {k: v for k, v in batch.items() if v is not ...}


BAD_UPDATES = {
    "1-D embeddings": (_bad(embeddings=torch.ones(2)), ValueError, "`embeddings` must be 2-D"),
    "3-D embeddings": (_bad(embeddings=torch.ones(2, 3, 1)), ValueError, "`embeddings` must be 2-D"),
    "int embeddings": (
        _bad(embeddings=torch.ones(2, 3, dtype=torch.long)),
        TypeError,
        "`embeddings` must have a floating",
    ),
    "list embeddings": (_bad(embeddings=[[1.0, 2.0, 3.0]] * 2), TypeError, "`embeddings` must be a torch.Tensor"),
    "NaN": (_bad(embeddings=torch.tensor([[1.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])), ValueError, "finite"),
    "inf": (_bad(embeddings=torch.tensor([[1.0, 0.0, 0.0], [float("inf"), 0.0, 0.0]])), ValueError, "finite"),
    "other dim": (_bad(embeddings=torch.ones(2, 4)), ValueError, "`embeddings` must have 3 columns like the previous"),
    "labels length": (_bad(labels=torch.tensor([1, 2, 3])), ValueError, "`labels` must have 2 rows"),
    "labels 3-D": (_bad(labels=torch.ones(2, 1, 1)), ValueError, "`labels` must be 1-D or 2-D"),
    "labels other shape": (_bad(labels=torch.ones(2, 2, dtype=torch.long)), ValueError, "`labels` must be 1-D like"),
    "labels other dtype": (_bad(labels=torch.tensor([1, 2], dtype=torch.int32)), TypeError, "`labels` must have dtype"),
    "labels None": (_bad(labels=None), TypeError, "`labels` must be a torch.Tensor"),
    "labels NaN": (_bad(labels=torch.tensor([1.0, float("nan")])), ValueError, "`labels` must be finite"),
    "complex labels": (_bad(labels=torch.ones(2, dtype=torch.complex64)), TypeError, "`labels` must have a real"),
    "mask dtype": (_bad(is_query=torch.tensor([1, 0])), TypeError, "`is_query` must have dtype torch.bool"),
    "mask length": (_bad(is_query=torch.tensor([True])), ValueError, "`is_query` must have 2 rows"),
    "missing field": (_bad(is_query=None), ValueError, "`is_query` must be given in every batch"),
    "missing indexes": (_bad(indexes=None), ValueError, "`indexes` must be given in every batch"),
    "new field": (_bad(categories=torch.tensor([0, 1])), ValueError, "`categories` must be None in every batch"),
    "float indexes": (_bad(indexes=torch.tensor([4.0, 5.0])), TypeError, "`indexes` must have an integer dtype"),
    "indexes 2-D": (_bad(indexes=torch.ones(2, 1, dtype=torch.long)), ValueError, "`indexes` must be 1-D"),
    "float categories": (_bad(categories=torch.tensor([0.0, 1.0])), TypeError, "`categories` must have an integer"),
    "bool indexes": (_bad(indexes=torch.tensor([True, False])), TypeError, "`indexes` must have an integer dtype"),
    "indexes dtype": (_bad(indexes=torch.tensor([4, 5], dtype=torch.int32)), TypeError, "`indexes` must have dtype"),
}


@pytest.mark.parametrize("case", list(BAD_UPDATES))
def test_bad_update_raises_and_leaves_state_untouched(case: str) -> None:
    batch, error, message = BAD_UPDATES[case]
    metric = EmbeddingMetrics()
    metric.update(**_first_batch())
    before = snapshot(metric)
    with pytest.raises(error, match=message):
        metric.update(**batch)
    assert_same_state(metric, before)


def test_bad_sequence_ids_in_first_batch() -> None:
    metric = EmbeddingMetrics()
    with pytest.raises(ValueError, match="`sequence_ids` must be 1-D"):
        metric.update(torch.zeros(2, 3), torch.tensor([0, 1]), sequence_ids=torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="`sequence_ids` must have an integer dtype"):
        metric.update(torch.zeros(2, 3), torch.tensor([0, 1]), sequence_ids=torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="`search_groups` must have 2 rows like `embeddings`"):
        metric.update(torch.zeros(2, 3), torch.tensor([0, 1]), search_groups=torch.zeros(3, dtype=torch.long))
    assert_same_state(metric, snapshot(EmbeddingMetrics()))


BAD_OPTIONS = {
    "cmc_top_k": (0, ValueError),
    "precision_top_k": ((1.5,), TypeError),
    "map_top_k": ("5", TypeError),
    "ndcg_top_k": ((-1,), ValueError),
    "map_at_r": ("yes", TypeError),
    "fmr_vals": ((1.5,), ValueError),
    "pcf_variance": ((-0.1,), ValueError),
    "distance": ("manhattan", ValueError),
    "precision_mode": ("oml", ValueError),
    "empty_target_action": ("drop", ValueError),
    "knn_backend": ("annoy", ValueError),
    "chunk_size": (0, ValueError),
    "label_comparison_fn": (3, TypeError),
    "storage_dtype": (torch.int8, TypeError),
    "prefix": (1, TypeError),
    "compute_on_cpu": ("no", ValueError),
}


@pytest.mark.parametrize("option", list(BAD_OPTIONS))
def test_bad_option_names_itself(option: str) -> None:
    value, error = BAD_OPTIONS[option]
    with pytest.raises(error, match=f"`?{option}`?"):
        EmbeddingMetrics(**{option: value})


def test_unknown_keyword_and_conflicting_options() -> None:
    with pytest.raises(ValueError, match="Unexpected keyword arguments: `cmc_topk`"):
        EmbeddingMetrics(cmc_topk=(1,))
    with pytest.raises(ValueError, match="`avg_of_avgs` and `per_class`"):
        EmbeddingMetrics(avg_of_avgs=True, per_class=True)
    with pytest.raises(TypeError):
        EmbeddingMetrics((1, 5))  # type: ignore[call-arg]  # options are keyword-only


def test_empty() -> None:
    metric = EmbeddingMetrics()
    with pytest.raises(ValueError, match="at least one sample"), pytest.warns(UserWarning, match="before the ``update"):
        metric.compute()
    metric.update(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))  # a zero-row batch is a no-op
    assert metric.embeddings == [] and metric.labels == []
    with pytest.raises(ValueError, match="at least one sample"):
        metric.compute()
    metric.update(torch.tensor([[0.0], [1.0]]), torch.tensor([0, 0]))
    assert float(metric.compute()["cmc/1"]) == 1.0


def test_failed_compute_keeps_the_metric_usable() -> None:
    metric = EmbeddingMetrics(empty_target_action="error")
    metric.update(torch.tensor([[0.0], [1.0], [2.0]]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="empty_target_action"):
        metric.compute()
    metric.update(torch.tensor([[3.0]]), torch.tensor([1]))
    # by hand: 0.0 -> 1.0 hit; 1.0 -> 0.0 (tie with 2.0, lower position first) hit; 2.0 -> 1.0 (tie with 3.0) miss;
    # 3.0 -> 2.0 hit
    assert float(metric.compute()["cmc/1"]) == 0.75


# ---- state handling -----------------------------------------------------------------------------------------------


def _filled(**options: Any) -> EmbeddingMetrics:
    return feed(EmbeddingMetrics(**ALL_RANKING, **options), pick(make_data(n=24, seed=3), ("is_query",)), "random")


def test_reset_and_reuse() -> None:
    metric = _filled()
    first = metric.compute()
    metric.reset()
    assert all(getattr(metric, name) == [] for name in metric._defaults)
    assert_same(feed(metric, pick(make_data(n=24, seed=3), ("is_query",)), "single").compute(), first)


def test_clone_and_pickle() -> None:
    metric = _filled(prefix="p/")
    expected = metric.clone().compute()
    restored = pickle.loads(pickle.dumps(metric))
    assert_same(restored.compute(), expected)
    assert_same(metric.compute(), expected)
    assert restored.options == metric.options and restored.prefix == "p/"


def test_state_dict_round_trip() -> None:
    metric = _filled()
    assert metric.state_dict() == {}  # not persistent by default: a checkpoint does not hold every embedding
    metric.persistent(True)
    state = metric.state_dict()
    assert set(state) == {
        "embeddings",
        "labels",
        "is_query",
        "is_gallery",
        "sequence_ids",
        "search_groups",
        "categories",
        "camera_ids",
        "indexes",
    }
    fresh = EmbeddingMetrics(**ALL_RANKING)
    fresh.persistent(True)
    fresh.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns that update() was not called on `fresh`
        assert_same(fresh.compute(), metric.compute())


def test_metric_collection() -> None:
    data = pick(make_data(n=30, seed=6), ())
    cmc = {"cmc_top_k": (1,), "precision_top_k": (), "map_top_k": ()}
    mrr = {"cmc_top_k": (), "precision_top_k": (3,), "map_top_k": (), "mrr": True}
    collection = MetricCollection({"a": EmbeddingMetrics(**cmc), "b": EmbeddingMetrics(**mrr)}, prefix="val/")
    feed(collection, data, "random")
    expected = {**functional(data, **cmc), **functional(data, **mrr)}
    assert_same(collection.compute(), {f"val/{key}": value for key, value in expected.items()})
    # the same key from two members: torchmetrics puts the member's name in front
    twins = feed(MetricCollection({"a": EmbeddingMetrics(**cmc), "b": EmbeddingMetrics(**cmc)}), data, "one")
    assert sorted(twins.compute()) == ["a_cmc/1", "b_cmc/1"]


def test_compute_on_cpu_and_forward() -> None:
    data = pick(make_data(n=20, seed=8), ())
    metric = EmbeddingMetrics(compute_on_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch_value = metric(data["embeddings"][:10], data["labels"][:10])  # forward: the batch's own value
    assert_same(batch_value, functional({k: v[:10] for k, v in data.items()}))
    metric.update(data["embeddings"][10:], data["labels"][10:])
    assert_same(metric.compute(), functional(data))


def test_class_flags() -> None:
    assert EmbeddingMetrics.is_differentiable is False
    assert EmbeddingMetrics.higher_is_better is True
    assert EmbeddingMetrics.full_state_update is False
    assert (EmbeddingMetrics.plot_lower_bound, EmbeddingMetrics.plot_upper_bound) == (0.0, 1.0)
