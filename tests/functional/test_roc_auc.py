"""``roc_auc`` over every ordered pair against scikit-learn's ``roc_auc_score(is_positive, -distance)``.

The pairs and their distances are listed in the tests (the slow reference's per-pair formula, rounded to the
embeddings' dtype as the package reports distances); the package never lists them. Both computing paths (the
compiled kernel with its float32 brackets, the torch blocks of canonical distances) run on every float32 case, with
small blocks so that a symmetric set is cut into mirrored tiles, and each case checks that the compiled kernel was
called (``kernel_calls``). float64 embeddings always take the torch blocks: their case is torch-path-only.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from tests import reference
from tests.functional.conftest import KernelCalls
from torchmetrics_retrieval import EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.functional.verification import fnmr_at_fmr


def sklearn_auc(
    query: torch.Tensor,
    gallery: torch.Tensor,
    positive: np.ndarray,
    eligible: np.ndarray,
    distance: str,
) -> float:
    d = np.array([[reference.pair_distance(q, g, distance) for g in gallery] for q in query])
    d = d.astype(np.float32 if query.dtype == torch.float32 else np.float64).astype(np.float64)
    return float(roc_auc_score(positive[eligible], -d[eligible]))


def data(kind: str, n: int = 48, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    labels[:2] = torch.tensor([98, 99])  # lone queries: their pairs are all negative
    if kind == "integer ties":  # many exact ties between positive and negative distances
        x = torch.randint(-2, 3, (n, 3), generator=g).float()
        x[x.abs().sum(1) == 0] = 1.0  # no zero row (cosine)
        return x, labels
    if kind == "near duplicates":  # cancellation in the L2 expansion: the exact per-pair route
        base = torch.randn(n // 2, 5, generator=g)
        return torch.cat([base, base + 1e-4 * torch.randn(n // 2, 5, generator=g)]), labels
    return torch.randn(n, 5, generator=g) + labels[:, None].float().remainder(4) / 2, labels


def both_paths(calls: KernelCalls, **kwargs: object) -> float:
    """The ROC AUC from the compiled kernel (checked to be called) and from the torch blocks: the same value."""
    query = kwargs["query"]
    assert isinstance(query, torch.Tensor) and query.dtype == torch.float32  # float64 never takes the kernel
    with calls.forced(True, "auc.count_block"):
        compiled = fnmr_at_fmr(**kwargs, fmr_vals=(), roc_auc=True, chunk_size=16)["roc_auc"]  # type: ignore[arg-type]
    with calls.forced(False):
        torch_path = fnmr_at_fmr(**kwargs, fmr_vals=(), roc_auc=True, chunk_size=16)["roc_auc"]  # type: ignore[arg-type]
    assert torch.equal(compiled, torch_path)
    return float(compiled)


@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
@pytest.mark.parametrize("kind", ["integer ties", "continuous", "near duplicates"])
def test_leave_one_out_matches_scikit_learn(kind: str, distance: str, kernel_calls: KernelCalls) -> None:
    x, labels = data(kind)
    positive = (labels[:, None] == labels[None, :]).numpy()
    off = ~np.eye(len(labels), dtype=bool)
    expected = sklearn_auc(x, x, positive, off, distance)
    assert both_paths(kernel_calls, query=x, query_labels=labels, distance=distance) == pytest.approx(
        expected, abs=1e-7
    )


@pytest.mark.parametrize("buckets", [1, 3, 2**17], ids=["one bucket", "crowded buckets", "one per positive"])
def test_any_lookup_table_places_the_negatives_exactly(
    buckets: int, monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    """The compiled kernel's table over the positives: every positive in one bucket (binary search), a few
    crowded buckets, or one bucket per positive (many empty ones, read without touching a positive)."""
    from torchmetrics_retrieval.functional._pairs import plan as pairs_plan

    monkeypatch.setattr(pairs_plan, "LUT_ENTRIES", buckets)
    for kind in ("integer ties", "continuous"):
        x, labels = data(kind, n=64, seed=5)
        positive = (labels[:, None] == labels[None, :]).numpy()
        expected = sklearn_auc(x, x, positive, ~np.eye(len(labels), dtype=bool), "euclidean")
        assert both_paths(kernel_calls, query=x, query_labels=labels) == pytest.approx(expected, abs=1e-7)


def test_separate_gallery_masks_and_exclusion_rules(kernel_calls: KernelCalls) -> None:
    x, labels = data("integer ties", n=60, seed=3)
    g = torch.Generator().manual_seed(4)
    sequence, groups = torch.randint(0, 6, (60,), generator=g), torch.randint(0, 2, (60,), generator=g)
    positive = (labels[:, None] == labels[None, :]).numpy()
    # a separate gallery: every (query, gallery item) pair
    expected = sklearn_auc(x[:20], x[20:], positive[:20, 20:], np.ones((20, 40), dtype=bool), "euclidean")
    found = both_paths(kernel_calls, query=x[:20], query_labels=labels[:20], gallery=x[20:], gallery_labels=labels[20:])
    assert found == pytest.approx(expected, abs=1e-7)
    # masks and same-sequence / other-group pairs left out of the one set
    is_query, is_gallery = torch.arange(60) % 3 != 0, torch.arange(60) % 4 != 1
    eligible = (
        is_query.numpy()[:, None]
        & is_gallery.numpy()[None, :]
        & ~np.eye(60, dtype=bool)
        & (sequence[:, None] != sequence[None, :]).numpy()
        & (groups[:, None] == groups[None, :]).numpy()
    )
    expected = sklearn_auc(x, x, positive, eligible, "euclidean")
    kwargs = {"is_query": is_query, "is_gallery": is_gallery, "sequence_ids": sequence, "search_groups": groups}
    assert both_paths(kernel_calls, query=x, query_labels=labels, **kwargs) == pytest.approx(expected, abs=1e-7)


def test_camera_rule_custom_labels_and_float64(kernel_calls: KernelCalls) -> None:
    x, labels = data("continuous", n=40, seed=5)
    camera = torch.arange(40) % 3
    positive = (labels[:, None] == labels[None, :]).numpy()
    same_camera = (camera[:, None] == camera[None, :]).numpy()
    eligible = ~np.eye(40, dtype=bool) & ~(positive & same_camera)  # fast-reid's rule: same label and camera out
    found = retrieval_metrics(
        x, labels, camera_ids=camera, cmc_top_k=(), precision_top_k=(), map_top_k=(), roc_auc=True
    )
    assert float(found["roc_auc"]) == pytest.approx(sklearn_auc(x, x, positive, eligible, "euclidean"), abs=1e-7)

    def near(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # labels within 1 count as a match
        return (a - b).abs() <= 1

    near_positive = np.abs(labels.numpy()[:, None] - labels.numpy()[None, :]) <= 1
    off = ~np.eye(40, dtype=bool)
    expected = sklearn_auc(x, x, near_positive, off, "cosine")
    found_custom = fnmr_at_fmr(x, labels, fmr_vals=(), roc_auc=True, label_comparison_fn=near, distance="cosine")
    assert float(found_custom["roc_auc"]) == pytest.approx(expected, abs=1e-7)
    # both paths on float32 embeddings, then float64 ones: float64 distances, every pair on the exact route of
    # the torch blocks (torch-path-only: the compiled kernel takes float32 embeddings alone)
    x32 = x / 3
    expected = sklearn_auc(x32, x32, positive, off, "euclidean")
    assert both_paths(kernel_calls, query=x32, query_labels=labels) == pytest.approx(expected, abs=1e-7)
    x64 = x.double() / 3
    expected = sklearn_auc(x64, x64, positive, off, "euclidean")
    with kernel_calls.forced(False):
        found64 = fnmr_at_fmr(x64, labels, fmr_vals=(), roc_auc=True, chunk_size=16)["roc_auc"]
    assert float(found64) == pytest.approx(expected, abs=1e-7)


def test_metric_classes_and_nan_without_negatives() -> None:
    x, labels = data("integer ties", seed=7)
    expected = fnmr_at_fmr(x, labels, fmr_vals=(0.1,), eer=True, roc_auc=True)
    metric = FNMRAtFMR(fmr_vals=(0.1,), eer=True, roc_auc=True)
    metric.update(x[:20], labels[:20])
    metric.update(x[20:], labels[20:])
    assert metric.compute() == expected
    ranking = EmbeddingMetrics(cmc_top_k=(1,), roc_auc=True)
    ranking.update(x, labels)
    assert torch.equal(ranking.compute()["roc_auc"], expected["roc_auc"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fnmr_at_fmr(x, torch.zeros(len(x)), fmr_vals=(), roc_auc=True)["roc_auc"]
    assert torch.isnan(value) and any("no negative pair" in str(w.message) for w in caught)


def test_threads_do_not_change_the_value(kernel_calls: KernelCalls) -> None:
    x, labels = data("continuous", n=300, seed=8)
    values = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            with kernel_calls.forced(True, "auc.count_block"):
                values.append(fnmr_at_fmr(x, labels, fmr_vals=(), roc_auc=True, chunk_size=64)["roc_auc"])
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(values[0], v) for v in values[1:])


def test_roc_auc_must_be_a_bool() -> None:
    x, labels = data("continuous")
    with pytest.raises(TypeError, match="`roc_auc` must be a bool"):
        fnmr_at_fmr(x, labels, roc_auc=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`roc_auc` must be a bool"):
        FNMRAtFMR(roc_auc="yes")  # type: ignore[arg-type]
