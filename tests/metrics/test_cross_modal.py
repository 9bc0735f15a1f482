"""``CrossModalRetrieval`` against a dense CLIP-style reference written here: the full image x caption score matrix,
several captions per image, recall@k both ways; batches in shuffled order; 1, 2 and 3 gloo processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.metrics._distributed import run_distributed
from torchmetrics_retrieval import CrossModalRetrieval

N_IMAGES, CAPTIONS_PER_IMAGE, DIM = 23, 5, 8
KS = (1, 5, 10)


def image_caption_data(seed: int = 0) -> dict[str, Tensor]:
    """Images and 5 captions each, captions noisy copies of their image (continuous: no score ties)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(N_IMAGES, DIM, generator=g)
    caption_ids = torch.arange(N_IMAGES).repeat_interleave(CAPTIONS_PER_IMAGE)
    captions = images[caption_ids] + 1.2 * torch.randn(caption_ids.numel(), DIM, generator=g)
    return {"images": images, "image_ids": torch.arange(N_IMAGES), "captions": captions, "caption_ids": caption_ids}


def clip_style_recall(data: dict[str, Tensor]) -> dict[str, float]:
    """Dense recall@k: text retrieval (each image finds one of its captions in its top k captions) and image
    retrieval (each caption finds its image in its top k images), from the full cosine score matrix."""
    images = torch.nn.functional.normalize(data["images"].double(), dim=1)
    captions = torch.nn.functional.normalize(data["captions"].double(), dim=1)
    scores = images @ captions.T  # (images, captions)
    positive = data["image_ids"][:, None] == data["caption_ids"][None, :]
    expected = {}
    for k in KS:
        top_captions = scores.topk(k, dim=1).indices
        expected[f"a_to_b/cmc/{k}"] = positive.gather(1, top_captions).any(dim=1).double().mean().item()
        top_images = scores.T.topk(min(k, N_IMAGES), dim=1).indices
        expected[f"b_to_a/cmc/{k}"] = positive.T.gather(1, top_images).any(dim=1).double().mean().item()
    return expected


def feed_shuffled(metric: CrossModalRetrieval, data: dict[str, Tensor], rank: int = 0, world_size: int = 1) -> None:
    """Batches of images only, captions only, or both, in a shuffled order; this rank takes every world_size-th."""
    g = torch.Generator().manual_seed(100 + rank)
    image_rows = torch.arange(rank, N_IMAGES, world_size)
    caption_rows = torch.arange(rank, data["captions"].shape[0], world_size)
    image_rows = image_rows[torch.randperm(image_rows.numel(), generator=g)]
    caption_rows = caption_rows[torch.randperm(caption_rows.numel(), generator=g)]
    image_batches, caption_batches = list(image_rows.split(4)), list(caption_rows.split(7))
    while image_batches or caption_batches:
        kwargs: dict[str, Any] = {}
        if image_batches and (not caption_batches or torch.rand(1, generator=g) < 0.5):
            rows = image_batches.pop()
            kwargs.update(embeddings_a=data["images"][rows], ids_a=data["image_ids"][rows], indexes_a=rows)
        if caption_batches and (not kwargs or torch.rand(1, generator=g) < 0.5):
            rows = caption_batches.pop()
            kwargs.update(embeddings_b=data["captions"][rows], ids_b=data["caption_ids"][rows], indexes_b=rows)
        metric.update(**kwargs)


def test_matches_the_dense_clip_style_reference_both_ways() -> None:
    data = image_caption_data()
    metric = CrossModalRetrieval(cmc_top_k=KS)
    feed_shuffled(metric, data)
    got = {key: value.item() for key, value in metric.compute().items()}
    assert got == pytest.approx(clip_style_recall(data), abs=1e-6)


def test_every_ranking_option_is_reported_per_direction() -> None:
    data = image_caption_data(1)
    metric = CrossModalRetrieval(cmc_top_k=(1,), map_at_r=True, mrr=True, prefix="val/")
    metric.update(data["images"], data["image_ids"], data["captions"], data["caption_ids"])
    assert list(metric.compute()) == [
        f"val/{direction}/{key}" for direction in ("a_to_b", "b_to_a") for key in ("cmc/1", "map_at_r", "mrr")
    ]


def test_missing_side_and_reset() -> None:
    metric = CrossModalRetrieval()
    metric.update(embeddings_a=torch.randn(3, 4), ids_a=torch.arange(3))
    with pytest.raises(ValueError, match="needs samples of both sides, got none of side B"):
        metric.compute()
    metric.update(embeddings_b=torch.randn(3, 4), ids_b=torch.arange(3))
    assert set(metric.compute()) >= {"a_to_b/cmc/1", "b_to_a/cmc/1"}
    metric.reset()
    assert not metric.side_a.embeddings_a and not metric.side_b.embeddings_b
    with pytest.raises(ValueError, match="update` needs"):
        metric.update()


def test_forward_returns_the_batch_value_and_keeps_the_batch() -> None:
    data = image_caption_data(2)
    metric = CrossModalRetrieval(cmc_top_k=KS)
    batch = metric(data["images"], data["image_ids"], data["captions"], data["caption_ids"])
    assert {key: value.item() for key, value in batch.items()} == pytest.approx(clip_style_recall(data), abs=1e-6)
    assert metric(embeddings_a=data["images"][:2], ids_a=data["image_ids"][:2]) == {}
    assert len(torch.cat(metric.side_a.embeddings_a)) == N_IMAGES + 2


def _ranks(rank: int, world_size: int) -> dict[str, Tensor]:
    metric = CrossModalRetrieval(cmc_top_k=KS, mrr=True)
    feed_shuffled(metric, image_caption_data(), rank, world_size)
    return metric.compute()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_identical_on_several_processes(world_size: int, tmp_path: Path) -> None:
    one = CrossModalRetrieval(cmc_top_k=KS, mrr=True)
    feed_shuffled(one, image_caption_data())
    expected = one.compute()
    for rank, values in enumerate(run_distributed(_ranks, world_size, tmp_path)):
        assert list(values) == list(expected)
        for key in expected:
            assert torch.equal(values[key], expected[key]), (world_size, rank, key)
