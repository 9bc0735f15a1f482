"""FNMR@FMR, EER and minDCF in sharded mode (``metrics._sharded.pairs``) on real gloo processes: every value
identical, bit for bit, to one process, for ``EmbeddingMetrics`` and ``FNMRAtFMR``, with DistributedSampler
padding and indexes, uneven shards, an empty rank, the rank order without indexes, small-integer rows (exact
ties and duplicates across shards, FMR values on tied distances), random rows cut into many tiles (a set
against itself: symmetric tiles whose two blocks lie on other ranks), every distance, the exclusion rules, few
histogram buckets; ``roc_auc`` (``metrics._sharded.auc``) with ties between positive and negative distances,
duplicates, the exclusion rules, an empty rank, padding and float64 rows, and its NaN with a warning on every
rank; the sharded paths taken (spies); a bad row on one rank raises on every rank."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.metrics._distributed import run_distributed
from tests.metrics._helpers import ALL_RANKING, make_data
from torchmetrics_retrieval.functional import fnmr_at_fmr, retrieval_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional._pairs.passes import PairPasses
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._sets import split_query_gallery
from torchmetrics_retrieval.metrics import EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.metrics._sharded import auc as _shard_auc
from torchmetrics_retrieval.metrics._sharded import embedding as _shard
from torchmetrics_retrieval.metrics._sharded import pairs as _shard_pairs
from torchmetrics_retrieval.metrics._sharded import tiles as _shard_tiles
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, global_rows

N = 29  # not a multiple of 2 or 3: DistributedSampler pads with duplicates
UNEVEN = {1: [N], 2: [20, 9], 3: [3, 19, 7]}
WITH_EMPTY = {1: [N], 2: [0, N], 3: [17, 0, 12]}
#: FMR values on a fine grid: with many tied distances, most quantiles fall on (or between) tied values.
FMR = tuple(i / 16 for i in range(17))
PAIRS: dict[str, Any] = {"fmr_vals": FMR, "eer": True, "min_dcf_p_target": (0.1, 0.5), "dcf_costs": (2.0, 1.0)}
NO_RANKING: dict[str, Any] = {"cmc_top_k": (), "precision_top_k": (), "map_top_k": ()}

#: name: (metric, data, options, feeding). Data: ``ints`` (small integers) or ``floats``, ``split`` (masks, so
#: queries and gallery apart) or ``same`` (the set against itself).
SCENARIOS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "sampler": ("embedding", "ints_split", {**PAIRS, **NO_RANKING}, "sampler"),
    "uneven": ("embedding", "ints_split", {**PAIRS, **NO_RANKING, "distance": "sqeuclidean"}, "uneven"),
    "empty_rank": ("embedding", "ints_same", {**PAIRS, **NO_RANKING, "distance": "dot"}, "empty_rank"),
    "rank_order": ("embedding", "ints_same", {**PAIRS, **NO_RANKING, "chunk_size": 4}, "rank_order"),
    "with_ranking": ("embedding", "ints_split", {**PAIRS, **ALL_RANKING, "fpir_vals": (0.5,)}, "sampler"),
    "same_tiles": ("embedding", "floats_same", {**PAIRS, **NO_RANKING, "chunk_size": 4}, "uneven"),
    "same_tiles_cosine": (
        "embedding",
        "floats_same",
        {**PAIRS, **NO_RANKING, "chunk_size": 3, "distance": "cosine"},
        "sampler",
    ),
    "split_tiles_dot": (
        "embedding",
        "floats_split",
        {**PAIRS, **NO_RANKING, "chunk_size": 3, "distance": "dot"},
        "uneven",
    ),
    "normalize": ("embedding", "floats_split", {**PAIRS, **NO_RANKING, "normalize": True, "chunk_size": 5}, "sampler"),
    "few_buckets": ("embedding", "ints_same", {**PAIRS, **NO_RANKING, "chunk_size": 5}, "sampler"),
    "few_buckets_split": ("embedding", "ints_split", {**PAIRS, **NO_RANKING, "distance": "euclidean"}, "uneven"),
    "fnmr_sampler": ("fnmr", "ints_split", PAIRS, "sampler"),
    "fnmr_same_empty_rank": ("fnmr", "ints_same", {**PAIRS, "chunk_size": 4}, "empty_rank"),
    "fnmr_tiles": (
        "fnmr",
        "floats_split",
        {**PAIRS, "chunk_size": 3, "distance": "sqeuclidean", "progress": True},
        "uneven",
    ),
    "fnmr_float64": ("fnmr", "floats64_same", {**PAIRS, "chunk_size": 4}, "sampler"),
    "fnmr_roc_auc": ("fnmr", "ints_split", {**PAIRS, "roc_auc": True}, "sampler"),
    "fnmr_roc_auc_float64": ("fnmr", "floats64_same", {**PAIRS, "roc_auc": True, "chunk_size": 4}, "empty_rank"),
    "fnmr_roc_auc_dot": ("fnmr", "floats_split", {**PAIRS, "roc_auc": True, "distance": "dot"}, "uneven"),
    "auc_sampler": ("embedding", "ints_split", {**PAIRS, **NO_RANKING, "roc_auc": True}, "sampler"),
    "auc_same_empty_rank": (
        "embedding",
        "ints_same",
        {**PAIRS, **NO_RANKING, "roc_auc": True, "chunk_size": 3, "distance": "sqeuclidean"},
        "empty_rank",
    ),
    "auc_with_ranking": ("embedding", "ints_split", {**PAIRS, **ALL_RANKING, "roc_auc": True}, "uneven"),
    "auc_compiled": ("embedding", "ints_split", {**PAIRS, **NO_RANKING, "roc_auc": True}, "uneven"),
    "fnmr_roc_auc_compiled": ("fnmr", "floats_same", {**PAIRS, "roc_auc": True, "distance": "cosine"}, "sampler"),
    "auc_rank_order": ("embedding", "ints_same", {**PAIRS, **NO_RANKING, "roc_auc": True}, "rank_order"),
    "auc_float64_cosine": (
        "embedding",
        "floats64_same",
        {**PAIRS, **NO_RANKING, "roc_auc": True, "distance": "cosine"},
        "sampler",
    ),
}
#: Labels without any positive pair (all distinct) or without any negative pair (all equal): roc_auc is NaN.
NAN_LABELS = {"no_positive": torch.arange(N), "no_negative": torch.zeros(N, dtype=torch.long)}
AUC_ONLY: dict[str, Any] = {**NO_RANKING, "fmr_vals": (), "roc_auc": True}
FEW_BUCKETS = 8
#: Bytes of row blocks fetched at once, by scenario in turn: one block per fetch, a few blocks (the last fetch of a
#: pass shorter), every block in one fetch.
FETCHES = (1, 250, 2**23)
EMBEDDING_FIELDS = ("is_query", "is_gallery", "sequence_ids", "camera_ids")
FNMR_FIELDS = ("is_query", "is_gallery", "sequence_ids", "search_groups")


def _data(variant: str, metric: str) -> dict[str, Tensor]:
    data = make_data(n=N, seed=8)
    if variant.startswith("floats"):  # random rows: a pair's float32 key depends on how it is computed
        data["embeddings"] = torch.randn(N, 5, generator=torch.Generator().manual_seed(2)) * 3 + 1
        if variant.startswith("floats64"):
            data["embeddings"] = data["embeddings"].double()
    names = EMBEDDING_FIELDS if metric == "embedding" else FNMR_FIELDS
    if variant.endswith("same"):  # every sample a query and a gallery item
        names = tuple(name for name in names if name not in ("is_query", "is_gallery"))
    return {name: data[name] for name in ("embeddings", "labels", *names)}


def _metric(metric: str, options: dict[str, Any]) -> EmbeddingMetrics | FNMRAtFMR:
    return EmbeddingMetrics(**options) if metric == "embedding" else FNMRAtFMR(**options)


def _fed(metric: Any, rank: int, world_size: int, data: dict[str, Tensor], feed: str) -> Any:
    """``sampler``: DistributedSampler (shuffled, padded), indexes; ``uneven`` / ``empty_rank``: consecutive
    shards, shuffled, indexes; ``rank_order``: consecutive shards in order, no indexes."""
    if feed == "sampler":
        dataset = TensorDataset(torch.arange(N), *data.values())
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=3)
        for index, *fields in DataLoader(dataset, batch_size=4, sampler=sampler):
            metric.update(**dict(zip(data, fields, strict=True)), indexes=index)
        return metric
    sizes = (WITH_EMPTY if feed == "empty_rank" else UNEVEN)[world_size]
    start = sum(sizes[:rank])
    rows = torch.arange(start, start + sizes[rank])
    if feed != "rank_order":
        rows = rows[torch.randperm(rows.numel(), generator=torch.Generator().manual_seed(rank))]
    for batch in rows.split(5) if rows.numel() else [rows]:
        metric.update(
            **{name: value[batch] for name, value in data.items()}, indexes=None if feed == "rank_order" else batch
        )
    return metric


def _values(metric: Any) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {"values": metric.compute()}
    except ValueError as err:
        return {"error": str(err)}


def _table(passes: PairPasses, qg: Any) -> Tensor:
    """``(Q, G)``: the float32 distance of every ordered pair of the passes' tiles (NaN: not in a tile)."""
    table = torch.full((qg.query.shape[0], qg.gallery.shape[0]), torch.nan)
    for block, _ in passes._blocks():
        distances = passes._distances(block).clone()
        table[block.rows, block.cols] = distances
        if block.mirrored:
            table[block.cols, block.rows] = distances.T
    return table


#: The float32 distance of every pair, from the tiles of every rank: (data, distance, chunk_size).
TABLES = (("floats_same", "euclidean", 4), ("floats_split", "dot", 3), ("floats_same", "cosine", 3))
TABLES += (("floats_split", "sqeuclidean", 4), ("floats64_same", "sqeuclidean", 5), ("ints_split", "euclidean", 2))


def _tables(rank: int, world_size: int) -> dict[str, Any]:
    """Per ``TABLES`` entry: ``(distances, times)``, every rank's tiles put together: each ordered pair's
    distance and how many ranks computed it (the set in rank order, which is the dataset order)."""
    out = {}
    for variant, distance, chunk_size in TABLES:
        metric = _fed(
            EmbeddingMetrics(distributed="shard"), rank, world_size, _data(variant, "embedding"), "rank_order"
        )
        local, small, owner, row, _ = global_rows(metric, None)
        labels = small.pop("labels")
        placeholder = local.new_zeros((1, 1)).expand(owner.numel(), 1)
        qg = split_query_gallery(placeholder, labels, **{k: v for k, v in small.items() if v is not None})
        shards = ShardedSet(qg, local, owner, row, None)
        table = _table(_shard_pairs.ShardedPairs(shards, distance, None, chunk_size), qg)
        tables = torch.stack(gather(table, None))
        out[f"{variant}/{distance}"] = (tables.nan_to_num(0.0).sum(0), (~tables.isnan()).sum(0))
    return out


def _counting(calls: list[int], made: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args: calls.append(1) or made(*args)


def _nan_cases(rank: int, world_size: int) -> dict[str, Any]:
    """roc_auc without positive or without negative pairs: the value and the roc_auc warnings, per metric."""
    out: dict[str, Any] = {}
    data = _data("ints_split", "fnmr")
    for name, labels in NAN_LABELS.items():
        for metric in ("embedding", "fnmr"):
            fed = _metric(metric, {**(AUC_ONLY if metric == "embedding" else {"fmr_vals": ()}), "roc_auc": True})
            fed.update(data["embeddings"][rank::world_size], labels[rank::world_size])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = fed.compute()["roc_auc"]
            out[f"{name}/{metric}"] = (value, [str(w.message) for w in caught if "roc_auc" in str(w.message)])
    return out


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    outcomes: dict[str, Any] = {"tables": _tables(rank, world_size)}
    calls: list[int] = []
    auc_calls: list[int] = []
    _shard_pairs.ShardedPairs = _counting(calls, _shard_pairs.ShardedPairs)  # type: ignore[assignment,misc]
    _shard_auc.sharded_roc_auc = _counting(auc_calls, _shard_auc.sharded_roc_auc)
    for i, (name, (metric, variant, options, feed)) in enumerate(SCENARIOS.items()):
        pairs_plan.N_BUCKETS = FEW_BUCKETS if name.startswith("few_buckets") else 2**16
        _shard_tiles.FETCH_BYTES = FETCHES[i % len(FETCHES)]
        before, auc_before = len(calls), len(auc_calls)
        fed = _fed(_metric(metric, {**options, "distributed": "shard"}), rank, world_size, _data(variant, metric), feed)
        with plan.force_compiled(True if name.endswith("compiled") else None):  # the compiled kernels on tiny data
            values = _values(fed)
        outcomes[name] = {**values, "sharded": len(calls) - before, "auc_sharded": len(auc_calls) - auc_before}
    pairs_plan.N_BUCKETS = 2**16
    outcomes["nan"] = _nan_cases(rank, world_size)
    outcomes["auc_sharded_total"] = len(auc_calls)
    if world_size > 1:  # a bad row on rank 1 only: every rank raises, none waits
        data = _data("ints_split", "embedding")
        for name, bad, distance in (("zero_row", 0.0, "cosine"), ("huge_row", 1e19, "euclidean")):
            rows = data["embeddings"][rank::world_size].clone()
            if rank == 1:
                rows[0] = bad
            for metric, options in (("embedding", {**PAIRS, **NO_RANKING}), ("fnmr", PAIRS)):
                fed = _metric(metric, {**options, "distance": distance, "distributed": "shard"})
                fed.update(rows, data["labels"][rank::world_size])
                outcomes[f"{name}/{metric}"] = _values(fed)
    return outcomes


def _expected(name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Tensor]:
    metric, variant, options, _ = SCENARIOS[name]
    monkeypatch.setattr(pairs_plan, "N_BUCKETS", FEW_BUCKETS if name.startswith("few_buckets") else 2**16)
    data = _data(variant, metric)
    embeddings, labels = data.pop("embeddings"), data.pop("labels")
    with warnings.catch_warnings(), plan.force_compiled(True if name.endswith("compiled") else None):
        warnings.simplefilter("ignore")
        if metric == "embedding":
            return retrieval_metrics(embeddings, labels, **data, **options)  # type: ignore[return-value]
        return fnmr_at_fmr(embeddings, labels, **data, **{k: v for k, v in options.items() if k != "progress"})


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_pairs_are_identical_to_one_process(
    world_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    for variant, distance, chunk_size in TABLES:  # every pair's float32 distance: one process's, from one rank
        data = _data(variant, "embedding")
        qg = split_query_gallery(data.pop("embeddings"), data.pop("labels"), **data)
        expected_table = _table(PairPasses(qg, distance, None, chunk_size), qg)
        for rank, outcomes in enumerate(ranks):
            table, times = outcomes["tables"][f"{variant}/{distance}"]
            assert bool((times == 1).all()), (world_size, rank, variant, distance)
            assert torch.equal(table, expected_table), (world_size, rank, variant, distance)
    for name in SCENARIOS:
        expected = _expected(name, monkeypatch)
        assert "eer" in expected and "fnmr@fmr/0.5" in expected
        for rank, outcomes in enumerate(ranks):
            label = f"world_size={world_size} rank={rank} {name}"
            actual = outcomes[name]
            assert "error" not in actual, (label, actual.get("error"))
            assert list(actual["values"]) == list(expected), label
            for key, value in expected.items():
                torch.testing.assert_close(actual["values"][key], value, rtol=0, atol=0, equal_nan=True, msg=label)
            sharded = 0 if world_size == 1 else 1
            assert actual["sharded"] == sharded, label
            assert actual["auc_sharded"] == (sharded if SCENARIOS[name][2].get("roc_auc") else 0), label
    data = _data("ints_split", "fnmr")
    for name, labels in NAN_LABELS.items():  # NaN with the one-process warning, on every rank
        with pytest.warns(UserWarning, match="roc_auc is NaN") as caught:
            expected_value = fnmr_at_fmr(data["embeddings"], labels, fmr_vals=(), roc_auc=True)["roc_auc"]
        messages = [str(w.message) for w in caught if "roc_auc" in str(w.message)]
        assert expected_value.isnan() and len(messages) == 1
        for rank, outcomes in enumerate(ranks):
            for metric in ("embedding", "fnmr"):
                value, warned = outcomes["nan"][f"{name}/{metric}"]
                assert value.isnan() and value.dtype == expected_value.dtype, (world_size, rank, name, metric)
                assert warned == messages, (world_size, rank, name, metric, warned)
    n_auc = sum(1 for scenario in SCENARIOS.values() if scenario[2].get("roc_auc")) + 2 * len(NAN_LABELS)
    for outcomes in ranks:  # every roc_auc sharded (the NaN cases too) as soon as there are several processes
        assert outcomes["auc_sharded_total"] == (n_auc if world_size > 1 else 0), world_size
    if world_size > 1:
        for outcomes in ranks:
            for name in ("zero_row/embedding", "zero_row/fnmr", "huge_row/embedding", "huge_row/fnmr"):
                error = outcomes[name].get("error", "")
                assert "all-zero row" in error or "norms below" in error or "other process" in error, (name, error)


def test_ties_and_buckets_are_exercised() -> None:
    """The small-integer scenarios have heavy ties and several distances per bucket (with few buckets)."""
    data = _data("ints_same", "embedding")
    x = data["embeddings"]
    d = torch.cdist(x, x)[~torch.eye(N, dtype=torch.bool)]
    assert torch.unique(d).numel() > FEW_BUCKETS  # few buckets: several distinct distances share a bucket
    assert torch.unique(d).numel() < d.numel() // 10  # heavy ties
    # roc_auc: many distances shared by positive and negative pairs (ties counting one half), duplicate rows
    same = (data["labels"][:, None] == data["labels"][None, :])[~torch.eye(N, dtype=torch.bool)]
    assert torch.isin(d[same], d[~same]).sum() > 10
    assert int((d == 0).sum()) > 0


def _float32_distances(qg: Any, chunk_size: int) -> Tensor:
    """Every ordered pair's float32 distance as one process's pair passes read it."""
    return _table(PairPasses(qg, "euclidean", None, chunk_size), qg)


def test_random_rows_depend_on_the_tiles() -> None:
    """Why the shards compute one process's tiles: on the random rows of the tests, the float32 distance of many
    pairs differs between the symmetric pass and a one-sided pass of the same rows (a shard pairing its rows
    another way would read other distances)."""
    x, labels = _data("floats_same", "embedding")["embeddings"], torch.arange(N) % 3
    symmetric = _float32_distances(split_query_gallery(x, labels), 4)
    one_sided = _float32_distances(split_query_gallery(x, labels, x.clone(), labels), 4)
    off_diagonal = ~torch.eye(N, dtype=torch.bool)
    assert int((symmetric != one_sided)[off_diagonal].sum()) > 10


def test_pair_metrics_and_roc_auc_are_shardable() -> None:
    assert _shard.shardable(RetrievalOptions.create(fmr_vals=(0.1,), eer=True, min_dcf_p_target=(0.5,)))
    assert _shard.shardable(RetrievalOptions.create(fmr_vals=(0.1,), roc_auc=True))
    assert _shard.shardable(RetrievalOptions.create(fmr_vals=(), roc_auc=True))


def test_fnmr_distributed_must_be_shard_or_gather() -> None:
    with pytest.raises(ValueError, match="`distributed` must be one of"):
        FNMRAtFMR(distributed="ring")  # type: ignore[arg-type]
