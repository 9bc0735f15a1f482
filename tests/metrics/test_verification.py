"""FNMRAtFMR in one process: class == functional == all pairs listed explicitly, any batch split; errors; state."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import reference
import torch
from torch import Tensor
from torchmetrics import MetricCollection

from tests.metrics._helpers import feed, make_data, pick
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.functional.verification import det_curve, fnmr_at_fmr
from torchmetrics_retrieval.metrics import EmbeddingMetrics
from torchmetrics_retrieval.metrics.verification import FNMRAtFMR

FMRS = (0.0, 0.1, 0.35, 1.0)
SPLITS = ("one", "single", "random")
FIELD_SETS = ((), ("is_query", "is_gallery"), ("sequence_ids", "search_groups"), ("is_query", "sequence_ids"))


def functional(data: dict[str, Tensor], **options: Any) -> dict[str, Tensor]:
    rest: dict[str, Any] = {k: v for k, v in data.items() if k not in ("embeddings", "labels", "indexes")}
    return fnmr_at_fmr(data["embeddings"], data["labels"], **rest, **options)


def all_pairs(data: dict[str, Tensor], distance: str = "euclidean") -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative distances of every (query, gallery item) pair, from the slow reference rankings."""
    n = data["embeddings"].shape[0]
    queries = [i for i in range(n) if "is_query" not in data or bool(data["is_query"][i])]
    gallery = [i for i in range(n) if "is_gallery" not in data or bool(data["is_gallery"][i])]
    q, g = torch.tensor(queries), torch.tensor(gallery)

    def paired(name: str) -> tuple[Tensor, Tensor] | None:
        return (data[name][q], data[name][g]) if name in data else None

    rankings = reference.rankings(
        data["embeddings"][q],
        data["labels"][q],
        data["embeddings"][g],
        data["labels"][g],
        self_index=[gallery.index(i) if i in gallery else -1 for i in queries],
        sequence_ids=paired("sequence_ids"),
        search_groups=paired("search_groups"),
        distance=distance,
    )
    pos = [d for r in rankings for d, rel in zip(r.distances, r.relevant, strict=True) if rel]
    neg = [d for r in rankings for d, rel in zip(r.distances, r.relevant, strict=True) if not rel]
    return np.array(pos), np.array(neg)


def direct(data: dict[str, Tensor], fmrs: tuple[float, ...], distance: str = "euclidean") -> dict[str, float]:
    pos, neg = all_pairs(data, distance)
    fnmr = [float((pos >= t).mean()) for t in np.quantile(neg, fmrs)]
    return {
        **{f"fnmr@fmr/{f}": v for f, v in zip(fmrs, fnmr, strict=True)},
        **{f"tar@far/{f}": 1 - v for f, v in zip(fmrs, fnmr, strict=True)},
    }


def assert_same(actual: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert actual[key].ndim == 0, key
        torch.testing.assert_close(actual[key], value, rtol=0, atol=0, equal_nan=True, msg=key)


def snapshot(metric: Any) -> dict[str, list[Tensor]]:
    return {name: [t.clone() for t in getattr(metric, name)] for name in metric._defaults}


def assert_same_state(metric: Any, before: dict[str, list[Tensor]]) -> None:
    after = snapshot(metric)
    assert after.keys() == before.keys()
    for name in before:
        assert len(after[name]) == len(before[name]), name
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(after[name], before[name], strict=True))


# ---- class vs functional vs all pairs ------------------------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("fields", FIELD_SETS, ids=lambda f: "+".join(f) or "leave-one-out")
def test_matches_functional_and_all_pairs(split: str, fields: tuple[str, ...]) -> None:
    data = pick(make_data(n=26, seed=len(fields)), fields)  # small-integer embeddings: exact distances, many ties
    actual = feed(FNMRAtFMR(fmr_vals=FMRS), data, split, seed=3).compute()
    assert_same(actual, functional(data, fmr_vals=FMRS))
    expected = direct(data, FMRS)
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert float(actual[key]) == pytest.approx(value, abs=1e-6), key


@pytest.mark.parametrize("distance", ["sqeuclidean", "cosine", "dot"])
def test_other_distances_and_chunk_size(distance: str) -> None:
    data = pick(make_data(n=20, seed=5), ())
    data["embeddings"] = data["embeddings"] + 1.0  # no zero row (cosine)
    metric = feed(FNMRAtFMR(fmr_vals=(0.2, 0.5), distance=distance, chunk_size=3), data, "random")  # type: ignore[arg-type]
    actual = metric.compute()
    assert_same(actual, functional(data, fmr_vals=(0.2, 0.5), distance=distance))
    for key, value in direct(data, (0.2, 0.5), distance).items():
        assert float(actual[key]) == pytest.approx(value, abs=1e-6), key


def test_oml_style_hand_example() -> None:
    # leave-one-out on 0, 1 | 3, 7: positive distances (1, 1, 4, 4), negative (2, 2, 3, 3, 6, 6, 7, 7);
    # the 0.1-quantile of the negatives is 2 -> positives >= 2: 2 of 4; the 0.5-quantile is 4.5 -> 0 of 4.
    metric = FNMRAtFMR(fmr_vals=(0.1, 0.5))
    metric.update(torch.tensor([[7.0], [1.0]]), torch.tensor([1, 0]))
    metric.update(torch.tensor([[0.0], [3.0]]), torch.tensor([0, 1]))
    values = {key: float(value) for key, value in metric.compute().items()}
    assert values == {"fnmr@fmr/0.1": 0.5, "fnmr@fmr/0.5": 0.0, "tar@far/0.1": 0.5, "tar@far/0.5": 1.0}


def test_indexes_deduplicate() -> None:
    data = pick(make_data(n=18, seed=7), ("is_query",))
    order = torch.randperm(18, generator=torch.Generator().manual_seed(0))
    metric = FNMRAtFMR(fmr_vals=FMRS)
    for rows in (order[:10], order[5:], order[:3]):  # overlapping: duplicates to drop
        metric.update(**{name: value[rows] for name, value in data.items()}, indexes=rows)
    assert_same(metric.compute(), functional(data, fmr_vals=FMRS))


def test_label_comparison_fn_two_column_labels_and_half_precision() -> None:
    data = pick(make_data(n=16, seed=9), ())
    data["labels"] = torch.stack([data["labels"], data["labels"] % 2], dim=1)

    def same_first(a: Tensor, b: Tensor) -> Tensor:
        return a[..., 0] == b[..., 0]

    metric = FNMRAtFMR(fmr_vals=(0.3,), label_comparison_fn=same_first)
    feed(metric, {**data, "embeddings": data["embeddings"].half()}, "random")
    assert metric.embeddings[0].dtype == torch.float16
    expected = functional({**data, "labels": data["labels"][:, 0]}, fmr_vals=(0.3,))
    assert_same(metric.compute(), expected)


def test_later_batches_take_the_first_dtype() -> None:
    metric = FNMRAtFMR()
    metric.update(torch.tensor([[0.0], [1.0]], dtype=torch.float64), torch.tensor([0, 0]))
    metric.update(torch.tensor([[3.0], [7.0]]), torch.tensor([1, 1]))
    assert [t.dtype for t in metric.embeddings] == [torch.float64, torch.float64]
    assert float(metric.compute()["fnmr@fmr/0.1"]) == 0.5


def test_no_negative_pair_is_nan_with_warning() -> None:
    metric = FNMRAtFMR()
    metric.update(torch.tensor([[0.0], [1.0], [2.0]]), torch.tensor([4, 4, 4]))
    with pytest.warns(UserWarning, match="no negative pair"):
        values = metric.compute()
    assert torch.isnan(values["fnmr@fmr/0.1"]) and torch.isnan(values["tar@far/0.1"])


# ---- curves and plots -------------------------------------------------------------------------------------------


def test_det_curve_and_plots() -> None:
    import matplotlib  # a declared test dependency (the `test` extra): a missing one fails, not skips

    matplotlib.use("Agg")
    data = pick(make_data(n=20, seed=11), ("is_query",))
    metric = feed(FNMRAtFMR(fmr_vals=(0.1, 0.5)), data, "random")
    grid = (0.0, 0.05, 0.1, 0.5, 1.0)
    expected = det_curve(data["embeddings"], data["labels"], is_query=data["is_query"], fmr_grid=grid)
    for got, want in zip(metric.det_curve(grid), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    fig, ax = metric.plot_curve()
    xs, ys = ax.lines[0].get_data()
    assert 0.1 in xs.tolist() and 0.5 in xs.tolist()  # the metric's values lie on the drawn curve
    values = metric.compute()
    assert ys[xs.tolist().index(0.5)] == pytest.approx(float(values["fnmr@fmr/0.5"]))
    assert ax.get_xscale() == "log"
    fig, _ = metric.plot()
    assert fig is not None
    fig, _ = metric.plot([values, values])
    assert fig is not None


# ---- bad input ---------------------------------------------------------------------------------------------------


def _good() -> dict[str, Tensor]:
    return {"embeddings": torch.zeros(3, 2), "labels": torch.tensor([0, 1, 0]), "sequence_ids": torch.tensor([0, 0, 1])}


def _bad(**changes: Any) -> dict[str, Any]:
    batch: dict[str, Any] = {**_good(), "embeddings": torch.ones(2, 2), "labels": torch.tensor([1, 2])}
    batch["sequence_ids"] = torch.tensor([1, 2])
    batch.update(changes)
    return batch


BAD_UPDATES = {
    "1-D embeddings": (_bad(embeddings=torch.ones(2)), ValueError, "`embeddings` must be 2-D"),
    "int embeddings": (_bad(embeddings=torch.ones(2, 2, dtype=torch.long)), TypeError, "`embeddings` must have a fl"),
    "NaN": (_bad(embeddings=torch.tensor([[0.0, float("nan")], [0.0, 0.0]])), ValueError, "`embeddings` must be fin"),
    "inf": (_bad(embeddings=torch.tensor([[0.0, float("inf")], [0.0, 0.0]])), ValueError, "`embeddings` must be fin"),
    "dimension changes": (_bad(embeddings=torch.ones(2, 3)), ValueError, "`embeddings` must have 2 columns like"),
    "labels length": (_bad(labels=torch.tensor([1, 2, 3])), ValueError, "`labels` must have 2 rows"),
    "labels dtype": (_bad(labels=torch.tensor([1, 2], dtype=torch.int32)), TypeError, "`labels` must have dtype"),
    "labels shape": (_bad(labels=torch.ones(2, 2, dtype=torch.long)), ValueError, "`labels` must be 1-D like"),
    "mask dtype": (_bad(is_query=torch.tensor([1, 0])), TypeError, "`is_query` must have dtype torch.bool"),
    "ids length": (_bad(sequence_ids=torch.tensor([1])), ValueError, "`sequence_ids` must have 2 rows"),
    "ids missing": (_bad(sequence_ids=None), ValueError, "`sequence_ids` must be given in every batch"),
    "new field": (_bad(indexes=torch.tensor([5, 6])), ValueError, "`indexes` must be None in every batch"),
    "float ids": (_bad(search_groups=torch.tensor([0.5, 1.0])), TypeError, "`search_groups` must have an integer"),
}


@pytest.mark.parametrize("case", list(BAD_UPDATES))
def test_bad_update_raises_and_leaves_state_untouched(case: str) -> None:
    batch, error, message = BAD_UPDATES[case]
    metric = FNMRAtFMR()
    metric.update(**_good())
    before = snapshot(metric)
    with pytest.raises(error, match=message):
        metric.update(**batch)
    assert_same_state(metric, before)


BAD_OPTIONS: dict[str, list[tuple[Any, type]]] = {
    "fmr_vals": [((1.5,), ValueError), ((-0.1,), ValueError), ((), ValueError), ("0.1", TypeError)],
    "distance": [("manhattan", ValueError)],
    "label_comparison_fn": [(3, TypeError)],
    "chunk_size": [(0, ValueError), (2.5, TypeError)],
}


@pytest.mark.parametrize(
    ("option", "value", "error"), [(o, v, e) for o, cases in BAD_OPTIONS.items() for v, e in cases]
)
def test_bad_option_names_itself(option: str, value: Any, error: type) -> None:
    with pytest.raises(error, match=f"`{option}`"):
        FNMRAtFMR(**{option: value})


def test_unknown_keyword_and_positional_options() -> None:
    with pytest.raises(ValueError, match="Unexpected keyword arguments: `fmr_val`"):
        FNMRAtFMR(fmr_val=(0.1,))
    with pytest.raises(TypeError):
        FNMRAtFMR((0.1,))  # type: ignore[call-arg]  # options are keyword-only


def test_empty() -> None:
    metric = FNMRAtFMR()
    metric.update(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))  # a zero-row batch is a no-op
    assert metric.embeddings == []
    with pytest.raises(ValueError, match="at least one sample"):
        metric.compute()
    with pytest.raises(ValueError, match="at least one sample"):
        metric.det_curve()


# ---- state handling ---------------------------------------------------------------------------------------------


def _filled() -> FNMRAtFMR:
    return feed(FNMRAtFMR(fmr_vals=FMRS), pick(make_data(n=20, seed=13), ("is_gallery",)), "random")


def test_reset_clone_pickle_state_dict() -> None:
    metric = _filled()
    expected = metric.compute()
    assert_same(metric.clone().compute(), expected)
    restored = pickle.loads(pickle.dumps(metric))
    assert_same(restored.compute(), expected)
    assert restored.options.fmr_vals == FMRS
    assert metric.state_dict() == {}  # not persistent by default
    metric.persistent(True)
    fresh = FNMRAtFMR(fmr_vals=FMRS)
    fresh.persistent(True)
    fresh.load_state_dict(metric.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics: compute() before update() on `fresh`
        assert_same(fresh.compute(), expected)
    metric.reset()
    assert all(getattr(metric, name) == [] for name in metric._defaults)
    assert_same(feed(metric, pick(make_data(n=20, seed=13), ("is_gallery",)), "one").compute(), expected)


def test_metric_collection_with_embedding_metrics() -> None:
    data = pick(make_data(n=24, seed=15), ())
    collection = MetricCollection(
        {"ranking": EmbeddingMetrics(cmc_top_k=(1,), precision_top_k=(), map_top_k=()), "fnmr": FNMRAtFMR()},
        prefix="val/",
    )
    feed(collection, data, "random")
    expected = {
        **retrieval_metrics(data["embeddings"], data["labels"], cmc_top_k=(1,), precision_top_k=(), map_top_k=()),
        **functional(data, fmr_vals=(0.1,)),
    }
    assert_same(dict(sorted(collection.compute().items())), {f"val/{key}": expected[key] for key in sorted(expected)})
    # the same pairs inside EmbeddingMetrics give the same numbers
    inside = feed(EmbeddingMetrics(cmc_top_k=(), precision_top_k=(), map_top_k=(), fmr_vals=(0.1,)), data, "one")
    assert_same(inside.compute(), functional(data, fmr_vals=(0.1,)))


def test_class_flags() -> None:
    assert FNMRAtFMR.is_differentiable is False
    assert FNMRAtFMR.higher_is_better is False
    assert FNMRAtFMR.full_state_update is False
    assert (FNMRAtFMR.plot_lower_bound, FNMRAtFMR.plot_upper_bound) == (0.0, 1.0)


def test_forward_gives_the_batch_value_and_checks_the_batch_first() -> None:
    data = pick(make_data(n=20, seed=17), ())
    metric = FNMRAtFMR(fmr_vals=FMRS)
    first = {name: value[:10] for name, value in data.items()}
    assert_same(metric(**first), functional(first, fmr_vals=FMRS))
    before = snapshot(metric)
    with pytest.raises(ValueError, match="`embeddings` must have 3 columns like the previous"):
        metric(torch.ones(4, 5), torch.zeros(4, dtype=torch.long))  # torchmetrics alone would accept it
    with pytest.raises(ValueError, match="`indexes` must be None in every batch"):
        metric(data["embeddings"][10:], data["labels"][10:], indexes=torch.arange(10))
    assert_same_state(metric, before)
    metric(data["embeddings"][10:], data["labels"][10:])
    assert_same(metric.compute(), functional(data, fmr_vals=FMRS))
