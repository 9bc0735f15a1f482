"""testers: a torch.nn.Linear over sklearn's digits, against pytorch-metric-learning's own testers."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
import torch
from pytorch_metric_learning import testers as pml_testers
from pytorch_metric_learning.utils import accuracy_calculator as pml_calc
from pytorch_metric_learning.utils import inference as pml_inference
from sklearn import datasets
from torch.utils.data import Dataset, TensorDataset

from torchmetrics_retrieval.compat import testers
from torchmetrics_retrieval.compat.pml import AccuracyCalculator

logging.getLogger("PML").setLevel(logging.ERROR)

CPU = torch.device("cpu")
COMMON = {"batch_size": 64, "dataloader_num_workers": 0, "data_device": CPU}


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """360 distinct digit images (duplicates would tie at distance 0, where tie orders differ) and labels."""
    data = datasets.load_digits()
    _, first = np.unique(data.data, axis=0, return_index=True)
    keep = np.sort(first)[:360]
    return torch.tensor(data.data[keep], dtype=torch.float32) / 16, torch.tensor(data.target[keep])


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(64, 16)


def hierarchical(labels: torch.Tensor) -> torch.Tensor:
    """(digit, parent) with parent = digit // 5 (two parents of five digits each)."""
    return torch.stack([labels, labels // 5], dim=1)


def split_dict(x: torch.Tensor, y: torch.Tensor) -> dict[str, Dataset]:
    return {"train": TensorDataset(x[:220], y[:220]), "val": TensorDataset(x[220:], y[220:])}


def calculators(**options: Any) -> tuple[Any, Any]:
    """Ours and pytorch-metric-learning's, with the same k-means so NMI/AMI agree."""
    kmeans = pml_inference.FaissKMeans(niter=20)
    return (
        AccuracyCalculator(device=CPU, kmeans_func=kmeans, **options),
        pml_calc.AccuracyCalculator(device=CPU, kmeans_func=kmeans, **options),
    )


def run_both(
    tester_name: str,
    dataset_dict: dict[str, Dataset],
    model: torch.nn.Module,
    splits_to_eval: Any = None,
    calculator_options: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[dict, dict]:
    ours_calc, their_calc = calculators(**(calculator_options or {}))
    ours = getattr(testers, tester_name)(accuracy_calculator=ours_calc, **COMMON, **options)
    theirs = getattr(pml_testers, tester_name)(accuracy_calculator=their_calc, **COMMON, **options)
    copy = None if splits_to_eval is None else [(q, list(r)) for q, r in splits_to_eval]
    a = ours.test(dataset_dict, 3, model, splits_to_eval=splits_to_eval)
    b = theirs.test(dataset_dict, 3, model, splits_to_eval=copy)
    return a, b


def assert_same(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]], tol: float = 1e-6) -> None:
    assert sorted(ours) == sorted(theirs)
    for split in theirs:
        assert sorted(ours[split]) == sorted(theirs[split]), split
        for key, value in theirs[split].items():
            mine = ours[split][key]
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(mine), (split, key)
            else:
                assert abs(mine - value) <= tol, (split, key, mine, value)


@pytest.mark.parametrize(
    "splits_to_eval",
    [None, [("val", ["train"])], [("val", ["val", "train"])], [("val", ["train", "val"]), ("train", ["train"])]],
)
def test_global_tester_matches_pml(digits: Any, model: torch.nn.Module, splits_to_eval: Any) -> None:
    original = None if splits_to_eval is None else [(q, list(r)) for q, r in splits_to_eval]
    ours, theirs = run_both("GlobalEmbeddingSpaceTester", split_dict(*digits), model, splits_to_eval)
    assert_same(ours, theirs)
    assert splits_to_eval == original  # the caller's list is left alone
    for split in ours:
        assert ours[split]["epoch"] == 3
        assert {"AMI_level0", "NMI_level0", "precision_at_1_level0", "r_precision_level0"} <= set(ours[split])


def test_documented_output_layout(digits: Any, model: torch.nn.Module) -> None:
    """Seed 003: {"train": {"AMI_level0": ..., ...}, "val": {"AMI_level0": ..., ...}} via an end-of-testing hook."""
    seen: list[dict[str, Any]] = []
    tester = testers.GlobalEmbeddingSpaceTester(
        end_of_testing_hook=lambda t: seen.append(dict(t.all_accuracies)), **COMMON
    )
    result = tester.test(split_dict(*digits), 0, model)
    assert seen == [dict(result)] and list(result) == ["train", "val"]
    assert all(0 <= result[split]["AMI_level0"] <= 1 for split in result)
    assert isinstance(result["val"]["precision_at_1_level0"], float)


def test_trunk_embedder_and_use_trunk_output(digits: Any, model: torch.nn.Module) -> None:
    torch.manual_seed(1)
    embedder = torch.nn.Linear(16, 8)
    tester = testers.GlobalEmbeddingSpaceTester(**COMMON)
    embeddings, labels = tester.get_all_embeddings(TensorDataset(*digits), model, embedder)
    x, y = digits
    expected = torch.nn.functional.normalize(embedder(model(x)), dim=1).detach()
    torch.testing.assert_close(embeddings, expected)
    assert torch.equal(labels, y[:, None])
    trunk_only = testers.GlobalEmbeddingSpaceTester(use_trunk_output=True, normalize_embeddings=False, **COMMON)
    embeddings, labels = trunk_only.get_all_embeddings(TensorDataset(*digits), model, embedder, return_as_numpy=True)
    assert isinstance(embeddings, np.ndarray) and isinstance(labels, np.ndarray)
    np.testing.assert_allclose(embeddings, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    ours, theirs = run_both("GlobalEmbeddingSpaceTester", split_dict(*digits), model, use_trunk_output=True)
    assert_same(ours, theirs)


def test_eval_mode_and_dtype(digits: Any) -> None:
    torch.manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Dropout(0.5))
    tester = testers.GlobalEmbeddingSpaceTester(dtype=torch.float64, **COMMON)
    net.double().train()
    first, _ = tester.get_all_embeddings(TensorDataset(*digits), net)
    second, _ = tester.get_all_embeddings(TensorDataset(*digits), net)
    assert not net.training and first.dtype == torch.float64 and torch.equal(first, second)  # eval: no dropout


def test_pca_matches_pml(digits: Any, model: torch.nn.Module) -> None:
    ours, theirs = run_both(
        "GlobalEmbeddingSpaceTester", split_dict(*digits), model, pca=8, calculator_options={"exclude": ("NMI", "AMI")}
    )
    assert_same(ours, theirs, tol=1e-5)
    tester = testers.GlobalEmbeddingSpaceTester(pca=8, normalize_embeddings=False, **COMMON)
    embeddings, _ = tester.get_all_embeddings(TensorDataset(*digits), model)
    assert embeddings.shape == (360, 8)
    # principal components: uncorrelated, decreasing variances
    variances = torch.linalg.eigvalsh(torch.cov(embeddings.T.double()))
    torch.testing.assert_close(torch.cov(embeddings.T.double()), torch.diag(variances.flip(0)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("level", [0, 1, [0, 1], [1], "all"])
def test_label_hierarchy_levels_match_pml(digits: Any, model: torch.nn.Module, level: Any) -> None:
    x, y = digits
    ours, theirs = run_both(
        "GlobalEmbeddingSpaceTester", split_dict(x, hierarchical(y)), model, label_hierarchy_level=level
    )
    assert_same(ours, theirs)
    if level in ("all", [0, 1]):
        assert {"precision_at_1_level0", "precision_at_1_level1", "AVERAGE_precision_at_1"} <= set(ours["val"])
    if level == [1]:
        assert "precision_at_1_level1" in ours["val"]


@pytest.mark.parametrize("splits_to_eval", [None, [("val", ["val", "train"])]])
def test_same_parent_label_tester_matches_pml(digits: Any, model: torch.nn.Module, splits_to_eval: Any) -> None:
    x, y = digits
    options = {"calculator_options": {"exclude": ("NMI", "AMI")}}
    ours, theirs = run_both(
        "WithSameParentLabelTester", split_dict(x, hierarchical(y)), model, splits_to_eval, **options
    )
    assert_same(ours, theirs)
    # the search is restricted to siblings: the val queries, searched among val digits of their own half only
    tester = testers.WithSameParentLabelTester(
        accuracy_calculator=AccuracyCalculator(device=CPU, include=("precision_at_1",)), **COMMON
    )
    values = tester.test({"val": TensorDataset(x[220:], hierarchical(y[220:]))}, 0, model)["val"]
    emb = torch.nn.functional.normalize(model(x[220:]), dim=1).detach()
    labels, parents = y[220:], y[220:] // 5
    per_parent = []
    for parent in (0, 1):
        members = torch.nonzero(parents == parent).flatten()
        d = torch.cdist(emb[members], emb[members]).fill_diagonal_(float("inf"))
        per_parent.append(float((labels[members][d.argmin(dim=1)] == labels[members]).double().mean()))
    assert values["precision_at_1_level0"] == pytest.approx(np.mean(per_parent))


class TwoStream(Dataset):
    """(anchor, positive, label): the positive is the next image of the same digit."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        order = torch.argsort(y, stable=True)
        self.partner = torch.empty_like(order)
        for digit in torch.unique(y):
            members = order[y[order] == digit]
            self.partner[members] = members.roll(-1)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.x[i], self.x[self.partner[i]], self.y[i]


def test_two_stream_tester_matches_pml(digits: Any, model: torch.nn.Module) -> None:
    x, y = digits
    dataset_dict = {"train": TwoStream(x[:200], y[:200]), "val": TwoStream(x[200:], y[200:])}
    ours, theirs = run_both(
        "GlobalTwoStreamEmbeddingSpaceTester", dataset_dict, model, calculator_options={"exclude": ("NMI", "AMI")}
    )
    assert_same(ours, theirs)
    tester = testers.GlobalTwoStreamEmbeddingSpaceTester(**COMMON)
    embeddings, labels = tester.get_all_embeddings(dataset_dict["val"], model)
    assert embeddings.shape == (320, 16) and torch.equal(labels[:160], labels[160:])
    with pytest.raises(ValueError, match="does not support different reference and query splits"):
        tester.test(dataset_dict, 0, model, splits_to_eval=[("val", ["train"])])


def test_visualizer_and_hook(digits: Any, model: torch.nn.Module) -> None:
    from sklearn.decomposition import PCA

    calls: list[tuple[Any, ...]] = []

    def hook(visualizer: Any, reduced: Any, labels: Any, split_name: str, keyname: str, epoch: int) -> None:
        calls.append((visualizer, reduced.shape, labels.shape, split_name, keyname, epoch))

    x, y = digits
    visualizer = PCA(n_components=2)
    tester = testers.GlobalEmbeddingSpaceTester(
        visualizer=visualizer, visualizer_hook=hook, label_hierarchy_level="all", **COMMON
    )
    tester.test(split_dict(x, hierarchical(y)), 7, model)
    assert [(c[3], c[4]) for c in calls] == [
        ("train", "PCA_level0"),
        ("train", "PCA_level1"),
        ("val", "PCA_level0"),
        ("val", "PCA_level1"),
    ]
    assert all(c[0] is visualizer and c[1] == (c[2][0], 2) and c[5] == 7 for c in calls)


def test_data_and_label_getter_and_label_ranks(digits: Any, model: torch.nn.Module) -> None:
    class Records(Dataset):
        def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
            self.x, self.y = x, y

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"image": self.x[i], "label": self.y[i]}

    x, y = digits
    shifted = y * 10 + 100  # 100, 110, ..., 190
    tester = testers.GlobalEmbeddingSpaceTester(
        data_and_label_getter=lambda batch: (batch["image"], batch["label"]),
        set_min_label_to_zero=True,
        dataset_labels=shifted.numpy(),
        **COMMON,
    )
    _, labels = tester.get_all_embeddings(Records(x, shifted), model)
    assert torch.equal(labels[:, 0], y)
    plain = testers.GlobalEmbeddingSpaceTester(**COMMON).test({"all": TensorDataset(x, y)}, 0, model)
    assert tester.test({"all": Records(x, shifted)}, 0, model)["all"] == plain["all"]


def test_string_labels_with_ranks(model: torch.nn.Module) -> None:
    class Animals(Dataset):
        names = ("dog", "cat", "monkey", "cat", "dog", "monkey")

        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
            return torch.full((64,), float(i)), self.names[i]

    tester = testers.GlobalEmbeddingSpaceTester(
        set_min_label_to_zero=True, dataset_labels=list(Animals.names), **COMMON
    )
    _, labels = tester.get_all_embeddings(Animals(), model)
    assert labels[:, 0].tolist() == [1, 0, 2, 0, 1, 2]  # seed 003: 'dog', 'cat', 'monkey' -> 1, 0, 2
    with pytest.raises(TypeError, match="labels must be numbers"):
        testers.GlobalEmbeddingSpaceTester(**COMMON).get_all_embeddings(Animals(), model)
    with pytest.raises(ValueError, match="`dataset_labels` must contain every label"):
        testers.GlobalEmbeddingSpaceTester(
            set_min_label_to_zero=True, dataset_labels=["dog"], **COMMON
        ).get_all_embeddings(Animals(), model)


def test_custom_calculator_in_tester(digits: Any, model: torch.nn.Module) -> None:
    from torchmetrics_retrieval.compat import pml

    class YourCalculator(AccuracyCalculator):
        def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):  # type: ignore[no-untyped-def]
            return pml.precision_at_k(knn_labels, query_labels[:, None], 2)

        def requires_knn(self):  # type: ignore[no-untyped-def]
            return [*super().requires_knn(), "precision_at_2"]

    tester = testers.GlobalEmbeddingSpaceTester(
        accuracy_calculator=YourCalculator(device=CPU, exclude=("NMI", "AMI")), **COMMON
    )
    result = tester.test(split_dict(*digits), 0, model)
    assert 0 < result["val"]["precision_at_2_level0"] <= 1
    # pytorch-metric-learning's calculator works in our tester too
    theirs = testers.GlobalEmbeddingSpaceTester(accuracy_calculator=calculators()[1], **COMMON).test(
        split_dict(*digits), 0, model
    )
    ours = testers.GlobalEmbeddingSpaceTester(accuracy_calculator=calculators()[0], **COMMON).test(
        split_dict(*digits), 0, model
    )
    assert_same(ours, theirs)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"pca": 0}, "`pca` must be None or an int >= 1"),
        ({"set_min_label_to_zero": True}, "`dataset_labels` must be given"),
        ({"label_hierarchy_level": -1}, "`label_hierarchy_level` must be"),
        ({"label_hierarchy_level": "some"}, "`label_hierarchy_level` must be"),
        ({"label_hierarchy_level": [0, 1.5]}, "`label_hierarchy_level` must be"),
    ],
)
def test_option_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        testers.GlobalEmbeddingSpaceTester(**options)


def test_test_errors(digits: Any, model: torch.nn.Module) -> None:
    x, y = digits
    dataset_dict = split_dict(x, y)
    tester = testers.GlobalEmbeddingSpaceTester(**COMMON)
    with pytest.raises(ValueError, match="Evaluating a query split more than once"):
        tester.test(dataset_dict, 0, model, splits_to_eval=[("val", ["train"]), ("val", ["val"])])
    with pytest.raises(ValueError, match="'test', which is not in `dataset_dict`"):
        tester.test(dataset_dict, 0, model, splits_to_eval=[("val", ["test"])])
    with pytest.raises(TypeError, match="must be a list of names"):
        tester.test(dataset_dict, 0, model, splits_to_eval=[("val", "train")])
    with pytest.raises(ValueError, match="below the number of label levels 1"):
        testers.GlobalEmbeddingSpaceTester(label_hierarchy_level=1, **COMMON).test(dataset_dict, 0, model)
    with pytest.raises(ValueError, match="at most the embedding size 16"):
        testers.GlobalEmbeddingSpaceTester(pca=20, **COMMON).test(dataset_dict, 0, model)
    with pytest.raises(ValueError, match="no valid label levels"):
        testers.WithSameParentLabelTester(label_hierarchy_level=1, **COMMON).test(
            split_dict(x, hierarchical(y)), 0, model
        )
    with pytest.raises(ValueError, match="must not be empty"):
        tester.get_all_embeddings(TensorDataset(x[:0], y[:0]), model)
    with pytest.raises(NotImplementedError):
        testers.BaseTester(**COMMON).test(dataset_dict, 0, model)


def test_description_suffixes() -> None:
    tester = testers.GlobalEmbeddingSpaceTester(
        pca=4, accuracy_calculator=AccuracyCalculator(avg_of_avgs=True), **COMMON
    )
    theirs = pml_testers.GlobalEmbeddingSpaceTester(
        pca=4, accuracy_calculator=pml_calc.AccuracyCalculator(avg_of_avgs=True), **COMMON
    )
    assert tester.description_suffixes("model") == theirs.description_suffixes("model")


def test_the_old_import_path_gives_the_same_classes() -> None:
    from torchmetrics_retrieval import testers as old_home
    from torchmetrics_retrieval.testers import GlobalEmbeddingSpaceTester

    assert GlobalEmbeddingSpaceTester is testers.GlobalEmbeddingSpaceTester
    assert all(getattr(old_home, name) is getattr(testers, name) for name in testers.__all__)
