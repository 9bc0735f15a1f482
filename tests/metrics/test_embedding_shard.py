"""EmbeddingMetrics in sharded mode (``distributed="shard"``) on real gloo processes:
every key, retrieved position and sample index identical to one process, with DistributedSampler padding,
uneven shards, an empty rank, exact distance ties across shards, exclusion rules, categories, per-class keys,
intervals, and all queries on one rank; the full-ranking metrics (mrr beyond K, map, minp) alone and together,
in one or many rounds; bad rows on one rank raise on every rank (no hang)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.metrics._distributed import run_distributed
from tests.metrics._helpers import ALL_RANKING, make_data
from tests.metrics.test_embedding_ddp import _by_sampler as by_sampler
from tests.metrics.test_embedding_ddp import _by_shards as by_shards
from tests.metrics.test_embedding_ddp import _outcome
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import count_relevant
from torchmetrics_retrieval.functional._ranks import kernels as count_kernels
from torchmetrics_retrieval.functional._ranks import plan as ranks_plan
from torchmetrics_retrieval.functional._ranks.count import relevant_ranks
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._sets import QueryGallery, split_query_gallery
from torchmetrics_retrieval.metrics import EmbeddingMetrics
from torchmetrics_retrieval.metrics._sharded import embedding as shard
from torchmetrics_retrieval.metrics._sharded import search as shard_search
from torchmetrics_retrieval.metrics._sharded.global_set import restrict_gallery
from torchmetrics_retrieval.metrics._sharded.ranks import shard_counts, shard_thresholds

N = 29  # not a multiple of 2 or 3: DistributedSampler pads with duplicates
FIELDS = ("is_query", "sequence_ids", "categories", "camera_ids")
FULL_RANKING = ("mrr", "map_full", "minp")  # tested apart (FULL_OPTIONS), with data made for them
SHARDED: dict[str, Any] = {
    **{name: value for name, value in ALL_RANKING.items() if name not in FULL_RANKING},
    "fpir_vals": (0.5,),
    "per_class": True,
    "confidence_level": 0.9,
    "n_bootstrap": 40,
}
UNEVEN = {1: [N], 2: [20, 9], 3: [3, 19, 7], 4: [3, 11, 7, 8]}
#: The scenarios of a set searched against itself (``_symmetric_scenarios``): by sampler, uneven, with an empty rank,
#: in visiting blocks of 2 rows, and so with the compiled kernels (their merge of candidate lists included).
SYMMETRIC = ("symmetric_sampler", "symmetric_uneven", "symmetric_empty_rank", "symmetric_blocks", "symmetric_compiled")
WITH_EMPTY = {1: [N], 2: [0, N], 3: [17, 0, 12], 4: [9, 0, 12, 8]}


def _data(queries_on_rank0: int = 0, every_sample_a_query: bool = False) -> dict[str, Tensor]:
    """With ``every_sample_a_query`` the set is searched against itself (the symmetric sharded search)."""
    data = make_data(n=N, seed=21)  # small-integer embeddings: many exact distance ties
    picked = {name: data[name] for name in ("embeddings", "labels", *FIELDS)}
    if queries_on_rank0:  # only the first rows (rank 0's shard) are queries
        picked["is_query"] = torch.arange(N) < queries_on_rank0
    if every_sample_a_query:
        del picked["is_query"]
    return picked


def _symmetric_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """The set against itself: each pair of shards meets on one rank; with 2-row visiting blocks, in blocks."""
    calls = []
    searched = shard.symmetric_top_k
    shard.symmetric_top_k = lambda *args: calls.append(1) or searched(*args)  # type: ignore[assignment]
    caps: list[tuple[bool, bool]] = []  # per bipartite pass: whether its own rows, and its visitors, came capped
    bipartite = shard_search._bipartite

    def recording(qg, left, right, *args):  # type: ignore[no-untyped-def]
        caps.append((bool(left[2].isfinite().any()), bool(right[2].isfinite().any())))
        return bipartite(qg, left, right, *args)

    shard_search._bipartite = recording
    data = _data(every_sample_a_query=True)
    outcomes = {
        "symmetric_sampler": _outcome(_by_sampler(rank, world_size, data)),
        "symmetric_uneven": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=True)),
        "symmetric_empty_rank": _outcome(_by_shards(rank, WITH_EMPTY[world_size], data, indexes=True)),
    }
    shard_search.VISIT_ROWS = 4  # visiting blocks of 2 rows: several steps a round
    outcomes["symmetric_blocks"] = _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=False))
    merges = []  # the candidate lists merged by the compiled kernel (this small data takes the torch merge otherwise)
    merge_sorted = shard_search.merge_sorted
    shard_search.merge_sorted = lambda *args: merges.append(1) or merge_sorted(*args)  # type: ignore[assignment]
    with plan.force_compiled(True):
        outcomes["symmetric_compiled"] = _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=False))
    outcomes["compiled_merges"] = len(merges)
    outcomes["symmetric_calls"] = len(calls)
    outcomes["capped_passes"] = [any(side) for side in zip(*caps, strict=True)] if caps else []
    return outcomes


def _by_sampler(rank: int, world_size: int, data: dict[str, Tensor], **kwargs: Any) -> EmbeddingMetrics:
    return by_sampler(rank, world_size, data, {**SHARDED, "distributed": "shard"}, **kwargs)


def _by_shards(rank: int, sizes: list[int], data: dict[str, Tensor], *, indexes: bool) -> EmbeddingMetrics:
    return by_shards(rank, sizes, data, indexes=indexes, options={**SHARDED, "distributed": "shard"})


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    data = _data()
    outcomes: dict[str, Any] = {
        "sampler": _outcome(_by_sampler(rank, world_size, data)),
        "sampler_gathered": _outcome(_by_sampler(rank, world_size, data, distributed="gather")),
        "sampler_float16": _outcome(_by_sampler(rank, world_size, data, storage_dtype=torch.float16)),
        "uneven": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=True)),
        "empty_rank": _outcome(_by_shards(rank, WITH_EMPTY[world_size], data, indexes=True)),
        "rank_order_without_indexes": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=False)),
        "queries_on_one_rank": _outcome(
            _by_shards(rank, UNEVEN[world_size], _data(UNEVEN[world_size][0]), indexes=True)
        ),
        "no_sample_anywhere": _outcome(EmbeddingMetrics(distributed="shard")),
        "full": _full_scenarios(rank, world_size),  # in the same processes: a spawn costs seconds
        **_symmetric_scenarios(rank, world_size),
    }
    if world_size > 1:
        # rank 1 holds an all-zero row: every rank raises
        metric = EmbeddingMetrics(distance="cosine", distributed="shard")
        rows = data["embeddings"][rank::world_size].clone()
        if rank == 1:
            rows[0] = 0.0
        metric.update(rows, data["labels"][rank::world_size])
        outcomes["zero_row_on_one_rank"] = _outcome(metric)
        outcomes["local_rows_after_error"] = sum(t.shape[0] for t in metric.embeddings)
    return outcomes


def _expected(data: dict[str, Tensor]) -> dict[str, Any]:
    values, result = retrieval_metrics(
        data["embeddings"],
        data["labels"],
        **{k: data[k] for k in FIELDS if k in data},
        return_per_query=True,
        **SHARDED,
    )
    assert result is not None
    return {"values": values, "indices": result.indices}


def _assert_identical(actual: dict[str, Any], expected: dict[str, Any], label: str) -> None:
    assert "error" not in actual, (label, actual.get("error"))
    assert list(actual["values"]) == list(expected["values"]), label
    for key, value in expected["values"].items():
        torch.testing.assert_close(actual["values"][key], value, rtol=0, atol=0, equal_nan=True, msg=f"{label} {key}")
    assert torch.equal(actual["indices"], expected["indices"]), label


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_is_identical_to_one_process(world_size: int, tmp_path: Path) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    expected = _expected(_data())
    one_rank_queries = _expected(_data(UNEVEN[world_size][0]))
    symmetric = _expected(_data(every_sample_a_query=True))
    for rank, outcomes in enumerate(ranks):
        for name in SYMMETRIC:
            _assert_identical(outcomes[name], symmetric, f"world_size={world_size} rank={rank} {name}")
        assert outcomes["symmetric_calls"] == (5 if world_size > 1 else 0)  # one process: never sharded
        assert (outcomes["compiled_merges"] > 0) == (world_size > 1 and plan.HAS_NUMBA)
        # the bipartite passes start from caps: the rank's own rows' and the visitors' (sent with them)
        assert outcomes["capped_passes"] == ([True, True] if world_size > 1 else [])
        for name in ("sampler", "sampler_gathered", "sampler_float16", "uneven", "empty_rank"):
            _assert_identical(outcomes[name], expected, f"world_size={world_size} rank={rank} {name}")
            if name != "sampler_float16":
                assert outcomes[name]["sample_indexes"].tolist() == list(range(N))
        _assert_identical(outcomes["rank_order_without_indexes"], expected, f"{world_size} {rank} rank order")
        assert outcomes["rank_order_without_indexes"]["sample_indexes"] is None
        _assert_identical(outcomes["queries_on_one_rank"], one_rank_queries, f"{world_size} {rank} one rank's queries")
        assert "at least one sample" in outcomes["no_sample_anywhere"]["error"]
        if world_size > 1:
            assert (
                "all-zero row" in outcomes["zero_row_on_one_rank"]["error"]
                or "other process" in (outcomes["zero_row_on_one_rank"]["error"])
            )
            assert outcomes["local_rows_after_error"] == len(range(rank, N, world_size))
    _assert_full_identical(ranks, world_size)


@pytest.mark.slow
def test_symmetric_sharded_search_on_four_ranks(tmp_path: Path) -> None:
    """Four ranks: shards one apart meet whole, shards two apart split their rectangle in halves."""
    ranks = run_distributed(_symmetric_scenarios, 4, tmp_path)
    expected = _expected(_data(every_sample_a_query=True))
    for rank, outcomes in enumerate(ranks):
        for name in SYMMETRIC:
            _assert_identical(outcomes[name], expected, f"world_size=4 rank={rank} {name}")


# ---- full-ranking metrics (mrr beyond K, map, minp): ranks summed over shards ------------------------------------

#: Each alone and together; K = 1 where mrr is on, so that many queries' first hit lies beyond the top K.
FULL_OPTIONS: dict[str, dict[str, Any]] = {
    "mrr": {"cmc_top_k": (1,), "precision_top_k": (), "map_top_k": (), "mrr": True},
    "map_full": {"map_full": True},
    "minp": {"minp": True, "distance": "dot"},
    "together": {**ALL_RANKING, "cmc_top_k": (1,), "distance": "sqeuclidean", "per_class": True},
}
FULL_FIELDS = (*FIELDS, "is_gallery")
#: The feedings of each option set (all of them for the metrics together); ``same_set_compiled``: a set against
#: itself with the compiled count.
FULL_FEEDS = ("uneven", "one_rank", "one_per_round", "same_set", "same_set_compiled")
ALL_FEEDS = ("sampler", "uneven", "empty_rank", "one_rank", "same_set", "same_set_compiled", "one_per_round")


def _full_data(variant: str, world_size: int) -> dict[str, Tensor]:
    """``split``: queries and gallery apart (both masks) under the sequence and camera rules; ``same_set``: every
    sample a query and a gallery item (the symmetric search), the same rules; ``one_rank``: rank 0 holds every
    query. Small-integer rows: exact distance ties and duplicates across shards."""
    data = make_data(n=N, seed=5)
    picked = {name: data[name] for name in ("embeddings", "labels", *FULL_FIELDS)}
    if variant == "same_set":
        del picked["is_query"], picked["is_gallery"]
    if variant == "one_rank":
        picked["is_query"] = torch.arange(N) < UNEVEN[world_size][0]
    return picked


def _full_metric(feed: str, rank: int, world_size: int, options: dict[str, Any]) -> EmbeddingMetrics:
    """This rank's metric of one feeding: ``sampler`` (padding, indexes), ``uneven`` shards (indexes, shuffled),
    ``empty_rank`` (rank order), ``one_rank`` (every query on rank 0), ``same_set``, ``one_per_round``."""
    options = {**options, "distributed": "shard"}
    data = _full_data(
        "same_set" if feed.startswith("same_set") else feed if feed == "one_rank" else "split", world_size
    )
    if feed in ("sampler", "one_per_round"):
        return by_sampler(rank, world_size, data, options)
    sizes = WITH_EMPTY[world_size] if feed == "empty_rank" else UNEVEN[world_size]
    return by_shards(rank, sizes, data, indexes=feed != "empty_rank", options=options)


def _full_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """Each option set of ``FULL_OPTIONS`` on its feedings; ``one_per_round``: one query of each rank per round
    (ranks with different numbers of rounds). ``calls``: the computes that took the sharded full-ranking path;
    ``kernel_calls``: the compiled count's calls in each feed."""
    calls, kernel_calls, current = [], {}, [""]
    ranks, budget, count_rows = shard.ShardedRanks, ranks_plan.BUDGET_ENTRIES, count_kernels.count_rows

    def kernel(*args: Any) -> Any:
        kernel_calls[current[0]] = kernel_calls.get(current[0], 0) + 1
        return count_rows(*args)

    shard.ShardedRanks = lambda *args: calls.append(1) or ranks(*args)  # type: ignore[assignment,misc]
    count_kernels.count_rows = kernel
    outcomes: dict[str, Any] = {}
    for name, options in FULL_OPTIONS.items():
        for feed in ALL_FEEDS if name == "together" else FULL_FEEDS:
            current[0] = f"{name}/{feed}"
            ranks_plan.BUDGET_ENTRIES = 1 if feed == "one_per_round" else budget
            with plan.force_compiled(True) if feed == "same_set_compiled" else contextlib.nullcontext():
                outcomes[current[0]] = _outcome(_full_metric(feed, rank, world_size, options))
    shard.ShardedRanks, ranks_plan.BUDGET_ENTRIES, count_kernels.count_rows = ranks, budget, count_rows  # type: ignore[misc]
    return {**outcomes, "calls": len(calls), "kernel_calls": kernel_calls}


def _full_expected(data: dict[str, Tensor], options: dict[str, Any]) -> dict[str, Any]:
    values, result = retrieval_metrics(
        data["embeddings"], data["labels"], **{k: v for k, v in data.items() if k in FULL_FIELDS}, **options,
        return_per_query=True,
    )  # fmt: skip
    assert result is not None
    return {"values": values, "indices": result.indices, "per_query": result.values}


def _assert_full_identical(ranks: list[dict[str, Any]], world_size: int) -> None:
    """mrr (first hits beyond K), map and minp, alone and together, identical to one process on every rank."""
    for name, options in FULL_OPTIONS.items():
        split = _full_expected(_full_data("split", world_size), options)
        if "mrr" in split["per_query"]:  # some first hits lie beyond K = 1, so the full ranking is needed
            assert bool((split["per_query"]["mrr"] < 1).any()) and bool((split["per_query"]["mrr"] > 0).any())
        same_set = _full_expected(_full_data("same_set", world_size), options)
        expected = {
            "one_rank": _full_expected(_full_data("one_rank", world_size), options),
            "same_set": same_set,
            "same_set_compiled": same_set,
        }
        for rank, outcomes in enumerate(ranks):
            for feed in ALL_FEEDS if name == "together" else FULL_FEEDS:
                label = f"world_size={world_size} rank={rank} {name}/{feed}"
                _assert_identical(outcomes["full"][f"{name}/{feed}"], expected.get(feed, split), label)
    n_computes = len(ALL_FEEDS) + (len(FULL_OPTIONS) - 1) * len(FULL_FEEDS)
    for outcomes in ranks:  # sharded on several processes (one ShardedRanks per compute), never gathered
        assert outcomes["full"]["calls"] == (0 if world_size == 1 else n_computes)
        if world_size > 1:  # the compiled count ran in every compiled feed (the small data takes the torch one else)
            found = outcomes["full"]["kernel_calls"]
            assert all(found.get(f"{name}/same_set_compiled", 0) > 0 for name in FULL_OPTIONS), found
            assert not any(found.get(f"{name}/same_set", 0) for name in FULL_OPTIONS), found


def _ranks_over_shards(qg: QueryGallery, options: RetrievalOptions, shards: list[Tensor], m: int, last: bool) -> Tensor:
    """What the ranks of sharded mode sum, in one process: every shard's thresholds, every shard's counts."""
    problems = []
    for gallery in shards:
        if gallery.numel():  # a rank without gallery items lists and counts nothing
            sub = restrict_gallery(qg, gallery, qg.gallery[gallery])
            problem = make_problem(sub.query, sub.gallery, options.distance, sub.exclusions(), same_set=False)
            problems.append((sub, problem, gallery))
    pairs = torch.cat([shard_thresholds(sub, problem, gallery, options, m, last) for sub, problem, gallery in problems])
    before = sum(shard_counts(problem, gallery, pairs, options, m, last) for _, problem, gallery in problems)
    filled = torch.bincount(pairs[:, 0].long(), minlength=qg.query.shape[0]).clamp(max=m)
    return torch.where(torch.arange(m)[None, :] < filled[:, None], before + 1, 0)  # type: ignore[operator]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled kernels", "torch passes"])
@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_counts_summed_over_shards_are_the_full_ranks(compiled: bool, distance: str) -> None:
    """Interleaved shards (one empty), exact ties and duplicates split across them, blocks of 7: the thresholds'
    virtual positions in each shard give, summed, the ranks of one process, with either counting kernel."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (90, 4), generator=g).float()
    x[5:12] = x[3]  # duplicates: exact ties of equal rows, which the counts compare by position
    x[x.abs().sum(dim=1) == 0] = 1.0  # cosine: no zero row
    labels = torch.randint(0, 6, (90,), generator=g)
    qg = split_query_gallery(
        x, labels, is_query=torch.rand(90, generator=g) < 0.7, is_gallery=torch.rand(90, generator=g) < 0.9,
        sequence_ids=torch.randint(0, 20, (90,), generator=g), camera_ids=torch.randint(0, 3, (90,), generator=g),
    )  # fmt: skip
    owner = torch.randint(0, 3, (qg.gallery.shape[0],), generator=g)
    owner[owner == 1] = 3  # shard 1 holds no item
    shards = [torch.nonzero(owner == r).flatten() for r in range(4)]
    options = RetrievalOptions.create(distance=distance, chunk_size=7)
    n_relevant = count_relevant(qg, options)
    n_max = int(n_relevant.max())
    with plan.force_compiled(compiled):
        for max_relevant, last in ((None, False), (1, False), (None, True)):
            m = 1 if last or max_relevant else n_max
            expected = relevant_ranks(qg, n_relevant, options, max_relevant, last)
            assert torch.equal(_ranks_over_shards(qg, options, shards, m, last), expected), (max_relevant, last)


def test_full_ranking_metrics_are_shardable() -> None:
    assert shard.shardable(RetrievalOptions.create(mrr=True, map_full=True, minp=True))
    assert not shard.shardable(RetrievalOptions.create(mrr=True, clustering=True))


def test_distributed_must_be_shard_or_gather() -> None:
    with pytest.raises(ValueError, match="`distributed` must be one of"):
        EmbeddingMetrics(distributed="ring")  # type: ignore[arg-type]
