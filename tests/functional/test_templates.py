"""Tests of template pooling against a numpy reference of the IJB media-then-template mean, written here with loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from torchmetrics_retrieval.functional import pool_templates


def reference_pool(x: np.ndarray, templates: np.ndarray, media: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """float64, one template and one media at a time: normalise, media mean, template mean, normalise."""
    x = x.astype(np.float64)
    ids = np.unique(templates)
    pooled = np.zeros((len(ids), x.shape[1]))
    for j, template in enumerate(ids):
        rows = [i for i in range(len(x)) if templates[i] == template]
        media_of_rows = rows if media is None else [media[i] for i in rows]
        media_means = []
        for m in sorted(set(media_of_rows)):
            frames = [x[i] / np.linalg.norm(x[i]) for i, mi in zip(rows, media_of_rows, strict=True) if mi == m]
            media_means.append(np.mean(frames, axis=0))
        mean = np.mean(media_means, axis=0)
        pooled[j] = mean / np.linalg.norm(mean)
    return pooled, ids


def random_case(seed: int, n: int = 40, d: int = 5) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64) * 5
    templates = torch.randint(-3, 6, (n,), generator=g)  # negative, unsorted, with gaps
    media = torch.randint(0, 4, (n,), generator=g)  # the same media ids in several templates
    return x, templates, media


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_media", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_reference(seed: int, with_media: bool, dtype: torch.dtype) -> None:
    x, templates, media = random_case(seed)
    x = x.to(dtype)
    pooled, ids = pool_templates(x, templates, media if with_media else None)
    expected, expected_ids = reference_pool(x.numpy(), templates.numpy(), media.numpy() if with_media else None)
    assert pooled.dtype == dtype and ids.dtype == templates.dtype
    assert ids.tolist() == expected_ids.tolist()
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(pooled.double().numpy(), expected, rtol=0, atol=tolerance)
    np.testing.assert_allclose(torch.linalg.vector_norm(pooled.double(), dim=1).numpy(), 1.0, atol=tolerance)


def test_each_media_counts_once_however_many_frames() -> None:
    # Template 0: a still image along x, and a video of 9 frames along y: the pooled vector is the diagonal.
    x = torch.tensor([[2.0, 0.0]] + [[0.0, 0.5]] * 9)
    templates = torch.zeros(10, dtype=torch.long)
    media = torch.tensor([0] + [1] * 9)
    pooled, _ = pool_templates(x, templates, media)
    torch.testing.assert_close(pooled, torch.tensor([[0.5**0.5, 0.5**0.5]]))
    # Without media ids every frame is a media: the video dominates.
    pooled, _ = pool_templates(x, templates)
    torch.testing.assert_close(pooled, torch.tensor([[1.0, 9.0]]) / 82**0.5)


def test_media_ids_are_read_within_a_template() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    pooled, ids = pool_templates(x, torch.tensor([5, 5, 6]), torch.tensor([0, 1, 0]))  # media 0 in both templates
    assert ids.tolist() == [5, 6]
    torch.testing.assert_close(pooled, torch.tensor([[0.5**0.5, 0.5**0.5], [0.0, 1.0]]))


def test_order_of_rows_does_not_matter() -> None:
    x, templates, media = random_case(3)
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    pooled, ids = pool_templates(x, templates, media)
    shuffled, shuffled_ids = pool_templates(x[order], templates[order], media[order])
    assert torch.equal(ids, shuffled_ids)
    torch.testing.assert_close(pooled, shuffled, rtol=0, atol=1e-14)


def test_bool_and_int32_ids() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    pooled, ids = pool_templates(x, torch.tensor([True, False, True]), torch.tensor([0, 0, 1], dtype=torch.int32))
    assert ids.tolist() == [False, True]
    torch.testing.assert_close(pooled[0], torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"embeddings": torch.ones(3)}, ValueError, "embeddings"),
        ({"embeddings": torch.ones(0, 2)}, ValueError, "embeddings"),
        ({"embeddings": torch.ones(3, 2, dtype=torch.long)}, TypeError, "embeddings"),
        ({"embeddings": torch.tensor([[1.0, float("nan")], [1.0, 0.0], [0.0, 1.0]])}, ValueError, "embeddings"),
        ({"embeddings": [[1.0, 0.0]] * 3}, TypeError, "embeddings"),
        ({"template_ids": torch.tensor([0, 1])}, ValueError, "template_ids"),
        ({"template_ids": torch.tensor([0.0, 1.0, 1.0])}, TypeError, "template_ids"),
        ({"template_ids": torch.tensor([[0, 1, 1]])}, ValueError, "template_ids"),
        ({"template_ids": [0, 1, 1]}, TypeError, "template_ids"),
        ({"media_ids": torch.tensor([0, 1, 2, 3])}, ValueError, "media_ids"),
        ({"media_ids": torch.tensor([0.5, 1.0, 2.0])}, TypeError, "media_ids"),
    ],
)
def test_bad_input_is_named(kwargs: dict[str, object], error: type[Exception], name: str) -> None:
    good = {"embeddings": torch.eye(3)[:, :2] + 0.5, "template_ids": torch.tensor([0, 1, 1]), "media_ids": None}
    with pytest.raises(error, match=f"`{name}`"):
        pool_templates(**{**good, **kwargs})  # type: ignore[arg-type]


def test_a_zero_row_is_refused_with_its_position() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    with pytest.raises(
        ValueError, match=r"`embeddings` must have no zero row.*1 zero row\(s\), the first at position 1"
    ):
        pool_templates(x, torch.tensor([0, 0, 1]))


def test_tiny_rows_are_not_zero() -> None:
    x = torch.tensor([[1e-30, 0.0], [0.0, 2.0]])  # squares underflow in float32, not the float64 norm
    pooled, _ = pool_templates(x, torch.tensor([0, 1]))
    torch.testing.assert_close(pooled, torch.eye(2))


def test_a_template_that_averages_to_zero_is_named() -> None:
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"template 4 .*average to the zero vector"):
        pool_templates(x, torch.tensor([4, 4, 9]))
