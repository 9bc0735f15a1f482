"""``CrossModalRetrieval`` against a dense CLIP-style reference written here: the full image x caption score matrix,
several captions per image, recall@k both ways; batches in shuffled order; 1, 2 and 3 gloo processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.metrics._distributed import run_distributed, sampler_rows
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


# ---- sharded mode (the default under DDP) -------------------------------------------------------------------------

SHARDED_OPTIONS: dict[str, Any] = {
    "cmc_top_k": KS,
    "precision_top_k": (2,),
    "ndcg_top_k": (4,),
    "map_at_r": True,
    "r_precision": True,
    "fpir_vals": (0.5,),
    "confidence_level": 0.9,
    "n_bootstrap": 30,
}


def tied_data() -> dict[str, Tensor]:
    """Small-integer rows (exact distance ties), captions partly exact copies of images (distance 0), groups
    with a single side (so some queries have no relevant item)."""
    g = torch.Generator().manual_seed(7)
    images = torch.randint(-2, 3, (N_IMAGES, 3), generator=g).float()
    captions = torch.randint(-2, 3, (40, 3), generator=g).float()
    captions[:15] = images[torch.randint(0, N_IMAGES, (15,), generator=g)]
    images[images.abs().sum(dim=1) == 0] = 1.0  # cosine needs no zero row
    captions[captions.abs().sum(dim=1) == 0] = 1.0
    caption_ids = torch.randint(0, N_IMAGES + 4, (40,), generator=g)
    return {"images": images, "image_ids": torch.arange(N_IMAGES), "captions": captions, "caption_ids": caption_ids}


def feed_rows(metric: CrossModalRetrieval, data: dict[str, Tensor], images: Tensor, captions: Tensor) -> None:
    """The given rows (repeats allowed: padding), each side in batches of 5, with their indexes."""
    for rows in images.split(5):
        metric.update(embeddings_a=data["images"][rows], ids_a=data["image_ids"][rows], indexes_a=rows)
    for rows in captions.split(5):
        metric.update(embeddings_b=data["captions"][rows], ids_b=data["caption_ids"][rows], indexes_b=rows)


def _sharded_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    from torchmetrics_retrieval.metrics._sharded import cross_modal as _shard_cross_modal

    calls = []
    sharded = _shard_cross_modal.sharded_cross_modal
    _shard_cross_modal.sharded_cross_modal = lambda *args: calls.append(1) or sharded(*args)  # type: ignore[assignment]
    stacked, search = [], _shard_cross_modal.symmetric_top_k  # both directions from one search of A and B stacked
    _shard_cross_modal.symmetric_top_k = lambda *args: stacked.append(1) or search(*args)  # type: ignore[assignment]
    outcomes: dict[str, Any] = {}
    for name, data in (("clip", image_caption_data(3)), ("tied", tied_data())):
        n_captions = data["captions"].shape[0]
        for distributed in ("shard", "gather"):
            metric = CrossModalRetrieval(distributed=distributed, **SHARDED_OPTIONS)
            feed_shuffled(metric, data, rank, world_size)
            outcomes[f"{name}_{distributed}"] = metric.compute()
        metric = CrossModalRetrieval(**SHARDED_OPTIONS)  # padded duplicates, de-duplicated by index
        feed_rows(metric, data, sampler_rows(N_IMAGES, rank, world_size), sampler_rows(n_captions, rank, world_size))
        outcomes[f"{name}_padded"] = metric.compute()
        metric = CrossModalRetrieval(**SHARDED_OPTIONS)  # every image on the last rank, none on rank 0 at all
        images = torch.arange(N_IMAGES) if rank == world_size - 1 else torch.arange(0)
        captions = torch.arange(0) if rank == 0 and world_size > 1 else torch.arange(rank, n_captions, world_size)
        if world_size > 1:
            captions = torch.arange(rank - 1, n_captions, world_size - 1) if rank else captions
        feed_rows(metric, data, images, captions)
        outcomes[f"{name}_one_rank_queries"] = metric.compute()
    outcomes["calls"], outcomes["stacked"] = len(calls), len(stacked)
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sharded_identical_to_one_process(world_size: int, tmp_path: Path) -> None:
    """Every key of every scenario on 1-4 processes equals one process's, bit for bit; the sharded path ran, with
    both directions from one search of A and B stacked."""
    results = run_distributed(_sharded_scenarios, world_size, tmp_path)
    for name, data in (("clip", image_caption_data(3)), ("tied", tied_data())):
        one = CrossModalRetrieval(**SHARDED_OPTIONS)
        feed_shuffled(one, data)
        expected = one.compute()
        for rank, outcomes in enumerate(results):
            for scenario in ("shard", "gather", "padded", "one_rank_queries"):
                got = outcomes[f"{name}_{scenario}"]
                assert list(got) == list(expected)
                for key in expected:  # NaN (dir@fpir without a non-mated probe) equals NaN
                    torch.testing.assert_close(
                        got[key], expected[key], rtol=0, atol=0, equal_nan=True, msg=f"{world_size} {rank} {key}"
                    )
            assert outcomes["calls"] == outcomes["stacked"] == (0 if world_size == 1 else 3 * 2)


def _zero_caption_on_last_rank(rank: int, world_size: int) -> str:
    data = image_caption_data(4)
    if rank == world_size - 1:
        data["captions"][rank] = 0.0
    metric = CrossModalRetrieval()
    feed_shuffled(metric, data, rank, world_size)
    stored = len(metric.side_b.embeddings_b)
    try:
        metric.compute()
    except ValueError as error:
        assert len(metric.side_b.embeddings_b) == stored  # the local state is kept
        return str(error)
    return "no error"


@pytest.mark.slow
def test_a_bad_row_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    messages = run_distributed(_zero_caption_on_last_rank, 2, tmp_path, timeout=60.0)
    assert "`embeddings_b` must have no all-zero row" in messages[1]
    assert "`embeddings_b`" in messages[0] and "other process" in messages[0]
