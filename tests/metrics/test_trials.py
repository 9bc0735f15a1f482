"""TrialMetrics in one process: class == trial_metrics of the rows the indexes name, any batch split and order,
duplicates dropped; every error names its argument and leaves the state as it was."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch import Tensor

from torchmetrics_retrieval import TrialMetrics
from torchmetrics_retrieval.functional.trials import trial_metrics

N, D = 23, 5
OPTIONS: dict[str, Any] = {
    "fmr_vals": (0.1, 0.5),
    "eer": True,
    "min_dcf_p_target": (0.05,),
    "roc_auc": True,
    "cllr": True,
    "act_dcf_p_target": (0.5,),
}


def data(seed: int = 0) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
    """Embeddings of dataset indexes ``100 + 3 i`` (not rows), and a trial list over them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g)
    ids = 100 + 3 * torch.arange(N)
    enrol, test = torch.randint(0, N, (40,), generator=g), torch.randint(0, N, (40,), generator=g)
    flags = torch.arange(40) % 3 == 0
    return x, ids, (ids[enrol], ids[test], flags)


def expected(x: Tensor, ids: Tensor, trials: tuple[Tensor, Tensor, Tensor], **options: Any) -> dict[str, Tensor]:
    row = {int(i): r for r, i in enumerate(ids.tolist())}
    enrol = torch.tensor([row[int(i)] for i in trials[0]])
    test = torch.tensor([row[int(i)] for i in trials[1]])
    return trial_metrics(x, (enrol, test, trials[2]), **options)


def assert_identical(actual: dict[str, Tensor], wanted: dict[str, Tensor]) -> None:
    assert list(actual) == list(wanted)
    for key in wanted:
        assert torch.equal(actual[key], wanted[key]), key


@pytest.mark.parametrize("distance", ["cosine", "euclidean", "dot"])
def test_equals_functional_any_split_order_and_duplicates(distance: str) -> None:
    x, ids, trials = data()
    wanted = expected(x, ids, trials, distance=distance, **OPTIONS)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    order = torch.cat([order, order[:4]])  # padded duplicates, as DistributedSampler adds them
    metric = TrialMetrics(trials, distance=distance, **OPTIONS)
    for rows in order.split(6):
        metric.update(x[rows], ids[rows])
    assert_identical(metric.compute(), wanted)
    gathered = TrialMetrics(trials, distance=distance, distributed="gather", chunk_size=7, **OPTIONS)
    gathered.update(x, ids)
    assert_identical(gathered.compute(), wanted)


def test_defaults_half_precision_and_pickle() -> None:
    x, ids, trials = data(2)
    metric = TrialMetrics(trials)
    metric.update(x.half(), ids)
    assert_identical(metric.compute(), expected(x.half().float(), ids, trials, fmr_vals=(0.1,)))
    clone = pickle.loads(pickle.dumps(metric))
    assert_identical(clone.compute(), metric.compute())


def _state(metric: TrialMetrics) -> list[Tensor]:
    return [t.clone() for t in [*metric.embeddings, *metric.indexes]]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((torch.zeros(2, 3), torch.tensor([1, 2])), ValueError, "embeddings"),  # another dimension
        ((torch.zeros(2), torch.tensor([1, 2])), ValueError, "embeddings"),
        ((torch.zeros(2, 5, dtype=torch.long), torch.tensor([1, 2])), TypeError, "embeddings"),
        ((torch.full((2, 5), float("nan")), torch.tensor([1, 2])), ValueError, "embeddings"),
        ((torch.zeros(2, 5), torch.tensor([1.0, 2.0])), TypeError, "indexes"),
        ((torch.zeros(2, 5), torch.tensor([1, 2, 3])), ValueError, "indexes"),
        ((torch.zeros(2, 5), None), (TypeError, ValueError), "indexes"),
    ],
)
def test_update_errors_name_the_argument_and_leave_the_state(args: Any, error: Any, match: str) -> None:
    x, ids, trials = data()
    metric = TrialMetrics(trials)
    metric.update(x[:4], ids[:4])
    before = _state(metric)
    with pytest.raises(error, match=match):
        metric.update(*args)
    after = _state(metric)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_trial_naming_an_index_never_updated_is_named_and_the_state_kept() -> None:
    x, ids, trials = data()
    metric = TrialMetrics(trials)
    keep = ids != trials[1][5]
    metric.update(x[keep], ids[keep])
    before = _state(metric)
    with pytest.raises(
        ValueError,
        match=rf"\((enrol|test)_index\) names dataset index {int(trials[1][5])} \(trial \d+\), which no process",
    ):
        metric.compute()
    after = _state(metric)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    metric.update(x[~keep], ids[~keep])  # still usable: now complete
    assert_identical(metric.compute(), expected(x, ids, trials, fmr_vals=(0.1,)))
    with pytest.raises(ValueError, match="at least one sample"):
        TrialMetrics(trials).compute()


def _trials(**parts: Any) -> Any:
    base = {
        "enrol": torch.tensor([0, 1, 2]),
        "test": torch.tensor([1, 2, 0]),
        "flags": torch.tensor([True, False, True]),
    }
    base.update(parts)
    return (base["enrol"], base["test"], base["flags"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"trials": torch.zeros(3, 3)}, TypeError, "`trials` must be a tuple of three tensors"),
        ({"trials": _trials(enrol=torch.tensor([0.0, 1.0, 2.0]))}, TypeError, r"\(enrol_index\) must be an integer"),
        ({"trials": _trials(test=torch.tensor([[1, 2, 0]]))}, ValueError, r"\(test_index\) must be 1-D"),
        ({"trials": _trials(test=torch.tensor([1, -2, 0]))}, ValueError, r"\(test_index\) must hold dataset indexes"),
        ({"trials": _trials(test=torch.tensor([1, 2]))}, ValueError, "one test index per enrol index"),
        ({"trials": _trials(flags=torch.tensor([1, 0, 1]))}, TypeError, r"is_target.*torch.bool"),
        ({"trials": _trials(flags=torch.tensor([True, True, True]))}, ValueError, "at least one target"),
        ({"distance": "manhattan"}, ValueError, "distance"),
        ({"fmr_vals": (1.5,)}, ValueError, "fmr_vals"),
        ({"fmr_vals": ()}, ValueError, "needs a value to report"),
        ({"min_dcf_p_target": (1.0,)}, ValueError, "min_dcf_p_target"),
        ({"far_rule": "closest"}, ValueError, "far_rule"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"distributed": "scatter"}, ValueError, "distributed"),
        ({"cmc_top_k": (1,)}, ValueError, "cmc_top_k"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs: dict[str, Any], error: Any, match: str) -> None:
    kwargs = {"trials": _trials(), **kwargs}
    with pytest.raises(error, match=match):
        TrialMetrics(**kwargs)


def test_the_trial_list_is_copied() -> None:
    trials = _trials()
    metric = TrialMetrics(trials, eer=True)
    trials[0][0] = 7
    assert int(metric.trials[0][0]) == 0


def test_forward_stores_the_batch_and_returns_none() -> None:
    x, ids, trials = data()
    metric = TrialMetrics(trials)
    assert metric(x[:10], ids[:10]) is None
    assert metric(embeddings=x[10:], indexes=ids[10:]) is None
    assert_identical(metric.compute(), expected(x, ids, trials, fmr_vals=(0.1,)))
    with pytest.raises(ValueError, match="embeddings"):
        metric(x[:2, :3], ids[:2])
    assert sum(t.shape[0] for t in metric.embeddings) == N


def test_docstring_documents_every_parameter() -> None:
    import inspect
    import re

    doc = inspect.getdoc(TrialMetrics) or ""
    section = doc.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^ {4}(\w+): ", section, flags=re.M)
    assert documented == [name for name in inspect.signature(TrialMetrics).parameters if name != "self"]
