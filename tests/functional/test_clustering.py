"""Tests of torchmetrics_retrieval.functional.clustering (faiss k-means, NMI/AMI from scikit-learn)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

from torchmetrics_retrieval.functional.clustering import clustering_scores, kmeans


def blobs(n_per_class: int, n_classes: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=g) * 100
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    return centres[labels] + torch.randn(labels.numel(), dim, generator=g), labels


def test_well_separated_clusters_score_one() -> None:
    x, labels = blobs(20, 5, 8)
    scores = clustering_scores(x, labels * 7 + 3)
    assert set(scores) == {"nmi", "ami"}
    assert scores["nmi"].item() == pytest.approx(1.0)
    assert scores["ami"].item() == pytest.approx(1.0)
    assert scores["nmi"].dtype == torch.float32 and scores["nmi"].shape == ()


def test_two_dimensional_labels_are_distinct_rows() -> None:
    x, labels = blobs(10, 4, 3, seed=1)
    rows = torch.stack([labels // 2, labels % 2], dim=1)  # 4 distinct rows -> 4 clusters
    scores = clustering_scores(x, rows, kmeans_fn=lambda e, k: kmeans(e, k, n_redo=10))
    assert scores["nmi"].item() == pytest.approx(1.0)
    calls: list[int] = []

    def spy(embeddings: torch.Tensor, n_clusters: int) -> torch.Tensor:
        calls.append(n_clusters)
        return kmeans(embeddings, n_clusters)

    clustering_scores(x, rows, kmeans_fn=spy)
    clustering_scores(x, rows[:, :1], kmeans_fn=spy)
    assert calls == [4, 2]


def test_scores_match_sklearn_on_given_assignments() -> None:
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 4, (60,), generator=g)
    assignment = torch.randint(0, 4, (60,), generator=g)
    x = torch.randn(60, 2, generator=g)
    scores = clustering_scores(x, labels, kmeans_fn=lambda e, k: assignment)
    assert scores["nmi"].item() == pytest.approx(normalized_mutual_info_score(labels.numpy(), assignment.numpy()))
    assert scores["ami"].item() == pytest.approx(adjusted_mutual_info_score(labels.numpy(), assignment.numpy()))


def test_kmeans_restarts_escape_a_local_optimum() -> None:
    x, labels = blobs(10, 4, 3, seed=1)
    truth = labels.numpy()
    single = normalized_mutual_info_score(truth, kmeans(x, 4).numpy())
    best = normalized_mutual_info_score(truth, kmeans(x, 4, n_redo=10).numpy())
    assert single < 0.99  # this seed's first initialisation puts two centroids in one blob
    assert best == pytest.approx(1.0)


def test_kmeans_is_deterministic_and_seeded() -> None:
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(4))
    first = kmeans(x, 7, seed=5)
    assert torch.equal(first, kmeans(x, 7, seed=5))
    assert first.dtype == torch.int64 and first.shape == (300,)
    assert int(first.min()) >= 0 and int(first.max()) < 7


def test_kmeans_recovers_blobs() -> None:
    x, labels = blobs(15, 3, 2, seed=6)
    ids = kmeans(x.double(), 3)
    # the partition is the blobs', up to renaming
    assert normalized_mutual_info_score(labels.numpy(), ids.numpy()) == pytest.approx(1.0)


def test_large_labels_do_not_collide() -> None:
    # int64 labels above 2**24 that a float cast would merge stay distinct.
    x, labels = blobs(10, 2, 2, seed=7)
    big = torch.where(labels == 0, torch.tensor(2**40), torch.tensor(2**40 + 1))
    assert clustering_scores(x, big)["ami"].item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: kmeans(torch.randn(3, 2), 4), ValueError, "`n_clusters` must be at most the number of rows 3"),
        (lambda: kmeans(torch.randn(3, 2), 0), ValueError, "`n_clusters`"),
        (lambda: kmeans(torch.randn(3, 2), 2, seed=-1), ValueError, "`seed`"),
        (lambda: kmeans(torch.randn(3, 2), 2, seed=1.0), TypeError, "`seed`"),  # type: ignore[arg-type]
        (lambda: kmeans(torch.randn(3, 2), 2, n_iter=0), ValueError, "`n_iter`"),
        (lambda: kmeans(torch.randn(3, 2), 2, n_redo=0), ValueError, "`n_redo`"),
        (lambda: kmeans(torch.tensor([[float("nan")]]), 1), ValueError, "`embeddings` must be finite"),
        (lambda: clustering_scores(torch.randn(3, 2), torch.zeros(4)), ValueError, "`labels` must have 3 rows"),
        (lambda: clustering_scores(torch.randn(3, 2), torch.zeros(3, 1, 1)), ValueError, "`labels` must be 1-D or 2-D"),
        (
            lambda: clustering_scores(torch.randn(3, 2), torch.zeros(3), kmeans_fn=lambda e, k: torch.zeros(2)),
            ValueError,
            "`kmeans_fn` must return",
        ),
    ],
)
def test_errors(call: Callable[[], object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()
