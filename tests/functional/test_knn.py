"""Tests of the exact kNN search against a slow float64 reference written here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import Tensor

from torchmetrics_retrieval.functional._search import certify, faiss_stage, keys, plan, problem, rounds, stream_topk
from torchmetrics_retrieval.functional._search.torch_stage import TorchStage
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional.search import (
    DISTANCES,
    Distance,
    KNNBackend,
    KNNResult,
    distance_blocks,
    knn,
    knn_chunks,
)


@pytest.fixture(autouse=True, scope="module", params=["compiled scans", "torch scans"])
def scan_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test twice: stage-1 buffers filled by the compiled (numba) scans, and by torch passes."""
    with plan.force_compiled(request.param == "compiled scans"):  # whatever the size
        yield request.param


# ----------------------------------------------------------------------------------------------------------------------
# slow reference: float64 per query, explicit exclusions, stable sort by (distance, index)
# ----------------------------------------------------------------------------------------------------------------------


def reference_distances(q: Tensor, g: Tensor, distance: str) -> Tensor:
    """Distances of one query to every gallery item, float64, from the definitions."""
    q, g = q.double(), g.double()
    if distance == "euclidean":
        return ((g - q) ** 2).sum(dim=1).sqrt()
    if distance == "sqeuclidean":
        return ((g - q) ** 2).sum(dim=1)
    if distance == "cosine":
        return 1.0 - (g @ q) / ((g * g).sum(dim=1) * (q @ q)).sqrt()
    return -(g @ q)


def reference_knn(
    query: Tensor,
    gallery: Tensor,
    k: int,
    distance: str,
    self_index: list[int] | None = None,
    sequence_ids: tuple[Tensor, Tensor] | None = None,
    search_groups: tuple[Tensor, Tensor] | None = None,
) -> list[list[tuple[int, float]]]:
    """For each query, the list of (gallery position, distance) of its nearest eligible items."""
    result = []
    for i in range(query.shape[0]):
        d = reference_distances(query[i], gallery, distance).to(query.dtype).tolist()
        eligible = []
        for j in range(gallery.shape[0]):
            if self_index is not None and self_index[i] == j:
                continue
            if sequence_ids is not None and sequence_ids[0][i] == sequence_ids[1][j]:
                continue
            if search_groups is not None and search_groups[0][i] != search_groups[1][j]:
                continue
            eligible.append(j)
        ranked = sorted(eligible, key=lambda j: (d[j], j))
        result.append([(j, d[j]) for j in ranked[:k]])
    return result


def assert_matches_reference(result, expected: list[list[tuple[int, float]]], *, exact_distances: bool) -> None:
    n_cols = max(len(row) for row in expected)
    assert result.indices.shape == (len(expected), n_cols)
    assert result.indices.dtype == torch.long and result.valid.dtype == torch.bool
    for i, row in enumerate(expected):
        n = len(row)
        assert result.indices[i, :n].tolist() == [j for j, _ in row], f"query {i}"
        got = result.distances[i, :n].tolist()
        if exact_distances:
            assert got == [d for _, d in row], f"query {i}"
        else:
            assert got == pytest.approx([d for _, d in row], rel=1e-5, abs=1e-5), f"query {i}"
        assert result.valid[i, :n].all() and not result.valid[i, n:].any()
        assert (result.indices[i, n:] == 0).all() and torch.isinf(result.distances[i, n:]).all()


def integer_points(n: int, dim: int, seed: int, low: int = -2, high: int = 3) -> Tensor:
    """Small-integer embeddings (many exact ties), a few exact duplicates, no all-zero row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(low, high, (n, dim), generator=g).float()
    x[(x == 0).all(dim=1), 0] = 1.0
    if n >= 4:
        x[n - 1] = x[0]
        x[n // 2] = x[1]
    return x


# ----------------------------------------------------------------------------------------------------------------------
# property tests
# ----------------------------------------------------------------------------------------------------------------------

BACKENDS: tuple[KNNBackend, ...] = ("torch", "faiss")
CHUNKS = (1, 3, 7, None)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 25),
    dim=st.integers(1, 4),
    k=st.integers(1, 30),
    distance=st.sampled_from(DISTANCES),
    backend=st.sampled_from(BACKENDS),
    chunk_size=st.sampled_from(CHUNKS),
    seed=st.integers(0, 2**16),
    n_sequences=st.integers(0, 5),
    exact=st.booleans(),
)
def test_leave_one_out_matches_reference(n, dim, k, distance, backend, chunk_size, seed, n_sequences, exact) -> None:
    # exact=False: only near-tied candidates get float64 distances; the neighbours must not change.
    x = integer_points(n, dim, seed)
    seq = None if n_sequences == 0 else torch.arange(n) % n_sequences
    result = knn(
        x, k=k, distance=distance, backend=backend, chunk_size=chunk_size, sequence_ids=seq, exact_distances=exact
    )
    expected = reference_knn(
        x, x, k, distance, self_index=list(range(n)), sequence_ids=None if seq is None else (seq, seq)
    )
    if max(len(row) for row in expected) == 0:
        assert result.indices.shape == (n, 0)
        return
    assert_matches_reference(result, expected, exact_distances=exact)


@settings(max_examples=40, deadline=None)
@given(
    n_query=st.integers(1, 12),
    n_gallery=st.integers(1, 30),
    k=st.integers(1, 12),
    distance=st.sampled_from(DISTANCES),
    chunk_size=st.sampled_from(CHUNKS),
    seed=st.integers(0, 2**16),
    with_groups=st.booleans(),
    exact=st.booleans(),
)
def test_query_gallery_with_groups_matches_reference(
    n_query, n_gallery, k, distance, chunk_size, seed, with_groups, exact
):
    x = integer_points(n_query + n_gallery, 3, seed)
    query, gallery = x[:n_query], x[n_query:]
    groups = (torch.arange(n_query) % 2, torch.arange(n_gallery) % 3) if with_groups else None
    result = knn(
        query, gallery, k, distance=distance, search_groups=groups, chunk_size=chunk_size, exact_distances=exact
    )
    expected = reference_knn(query, gallery, k, distance, search_groups=groups)
    if max(len(row) for row in expected) == 0:
        assert result.indices.shape == (n_query, 0)
        return
    assert_matches_reference(result, expected, exact_distances=exact)


@settings(max_examples=30, deadline=None)
@given(
    distance=st.sampled_from(DISTANCES),
    chunk_size=st.sampled_from(CHUNKS),
    k=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_float_data_backends_identical_and_match_reference(distance, chunk_size, k, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    query, gallery = torch.randn(9, 5, generator=g), torch.randn(40, 5, generator=g)
    gallery[3] = query[0]  # a duplicate of a query
    by_torch = knn(query, gallery, k, distance=distance, backend="torch", chunk_size=chunk_size)
    by_faiss = knn(query, gallery, k, distance=distance, backend="faiss", chunk_size=chunk_size)
    for a, b in zip(by_torch, by_faiss, strict=True):
        assert torch.equal(a, b)
    expected = reference_knn(query, gallery, k, distance)
    assert_matches_reference(by_torch, expected, exact_distances=False)
    for backend in BACKENDS:
        fast = knn(query, gallery, k, distance=distance, backend=backend, chunk_size=chunk_size, exact_distances=False)
        assert_matches_reference(fast, expected, exact_distances=False)


@settings(max_examples=25, deadline=None)
@given(distance=st.sampled_from(DISTANCES), seed=st.integers(0, 2**16), backend=st.sampled_from(BACKENDS))
def test_query_order_does_not_matter(distance, seed, backend) -> None:
    x = integer_points(20, 3, seed)
    query = x[:8]
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(seed))
    a = knn(query, x, 5, distance=distance, exclude_self=torch.arange(8), backend=backend)
    b = knn(query[perm], x, 5, distance=distance, exclude_self=perm, backend=backend)
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u[perm], v)


def test_many_near_ties_need_several_rounds() -> None:
    # 300 identical items and 5 slightly different ones: the certificate fails until the whole tie is seen.
    x = torch.ones(305, 4)
    x[300:] += torch.arange(1, 6)[:, None] * 1e-3
    result = knn(x[:2], x, 3, exclude_self=torch.tensor([0, 1]), chunk_size=16)
    assert result.indices.tolist() == [[1, 2, 3], [0, 2, 3]]
    assert result.distances.tolist() == [[0.0] * 3] * 2


def test_larger_random_float_data_both_backends() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(600, 16, generator=g), dim=1)
    x[10] = x[20]
    a = knn(x, k=25, backend="torch", chunk_size=64)
    b = knn(x, k=25, backend="faiss")
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)
    exact = torch.cdist(x.double(), x.double())
    exact.fill_diagonal_(float("inf"))
    assert torch.equal(a.indices[:, 0], exact.argmin(dim=1))
    assert a.indices[10, 0] == 20 and a.distances[10, 0] == 0.0


def spy(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, note: Callable[[tuple, Any], Any]) -> list[Any]:
    """Wrap ``owner.name``: every call runs as before, and ``note(arguments, result)`` is recorded."""
    notes: list[Any] = []
    original = getattr(owner, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        notes.append(note(args, result))
        return result

    monkeypatch.setattr(owner, name, recording)
    return notes


def record_rounds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(rows ranked, rows left uncertified) of every stage-2 ranking."""
    return spy(monkeypatch, rounds, "rank", lambda args, ranked: (args[1].numel(), int((~ranked.certified).sum())))


def record_range_searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of every range search of the faiss stage."""
    return spy(monkeypatch, faiss_stage.FaissStage, "_range", lambda args, _: args[1].numel())


def assert_first_rows_match_reference(result, x: Tensor, k: int, step: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(0, x.shape[0], step):
        d = reference_distances(x[i], x, "euclidean").float()
        d[i] = float("inf")
        order = torch.argsort(d, stable=True)[:k]
        assert result.indices[i].tolist() == order.tolist(), f"query {i}"
        assert result.distances[i].tolist() == pytest.approx(d[order].tolist(), rel=1e-6)


@pytest.mark.parametrize(
    ("backend", "k"),
    [("torch", 38), ("faiss", 64)],  # faiss: from 64 candidates, a range search below the estimates
)
def test_estimated_thresholds_that_fall_short_are_searched_again(
    monkeypatch: pytest.MonkeyPatch, backend: KNNBackend, k: int
) -> None:
    # Both stages start from thresholds estimated on a strided sample (every 4th row here). Make that
    # sample unrepresentative: the sampled rows are unit vectors, the others have norm 2, so for a unit
    # query the nearest items are all sampled rows and the estimate (a sample rank below kp) is too low.
    # Those queries must end uncertified after round 1 and exact after round 2.
    monkeypatch.setattr(stream_topk, "sample_size", lambda n_gallery, kp: n_gallery // 4)
    monkeypatch.setattr(faiss_stage, "sample_size", lambda n_gallery, kp: n_gallery // 4)
    monkeypatch.setattr(plan, "RANK_PAIRS", 2**21)  # one stage-2 ranking per round, as the spy counts rounds
    x = torch.nn.functional.normalize(torch.randn(8192, 8, generator=torch.Generator().manual_seed(0)), dim=1) * 2
    x[::4] /= 2
    rounds, ranged = record_rounds(monkeypatch), record_range_searches(monkeypatch)
    result = knn(x, k=k, backend=backend)
    assert ranged == ([8192] if backend == "faiss" else [])
    # every unit query fell short once (and perhaps a few others: an estimate misses by chance), none twice
    (first, short), (second, left) = rounds
    assert first == 8192 and 2048 <= short <= 2048 + 8 and second == short and left == 0
    other = knn(x, k=k, backend="faiss" if backend == "torch" else "torch")
    for u, v in zip(result, other, strict=True):
        assert torch.equal(u, v)
    fast = knn(x, k=k, backend=backend, exact_distances=False)
    assert torch.equal(fast.indices, result.indices) and torch.equal(fast.valid, result.valid)
    assert torch.allclose(fast.distances, result.distances, rtol=1e-4, atol=1e-5)
    assert_first_rows_match_reference(result, x, k, step=97)


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_stage_two_in_parts_gives_the_same_answer(monkeypatch: pytest.MonkeyPatch, backend: KNNBackend) -> None:
    # Stage 2 ranks the candidates of a round's rows in parts of at most plan.RANK_PAIRS pairs. Parts of one row,
    # with exact ties (duplicated rows) and queries that fall short of their estimate (the sample of the
    # test above), must give the answer of one part, and rank every row of the round exactly once.
    monkeypatch.setattr(stream_topk, "sample_size", lambda n_gallery, kp: n_gallery // 4)
    monkeypatch.setattr(faiss_stage, "sample_size", lambda n_gallery, kp: n_gallery // 4)
    x = torch.nn.functional.normalize(torch.randn(600, 8, generator=torch.Generator().manual_seed(3)), dim=1) * 2
    x[::4] /= 2
    x[1::50] = x[0]  # twelve copies of one row: ties at distance 0
    whole = knn(x, k=12, backend=backend)
    monkeypatch.setattr(plan, "RANK_PAIRS", 2 * 14 - 1)  # kp = 14, then 28: parts of one row in every round
    ranked = record_rounds(monkeypatch)
    parts = knn(x, k=12, backend=backend)
    for u, v in zip(parts, whole, strict=True):
        assert torch.equal(u, v)
    assert all(rows == 1 for rows, _ in ranked) and sum(left for _, left in ranked[:600]) > 0
    assert len(ranked) == 600 + sum(left for _, left in ranked)  # a row left uncertified is ranked once more
    assert_first_rows_match_reference(parts, x, 12, step=37)


def test_faiss_range_search_leaves_crowded_queries_to_the_next_round(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1000 copies of one vector among 3000: for a copy, the estimated threshold ties with hundreds of
    # sample keys, so a range search below it would return every copy. Those queries are left without
    # candidates in round 1 and found by the top-k search of round 2.
    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(3000, 8, generator=g), dim=1)
    copies = torch.randperm(3000, generator=g)[:1000]
    x[copies] = x[copies[0]].clone()
    rounds, ranged = record_rounds(monkeypatch), record_range_searches(monkeypatch)
    result = knn(x, k=64, backend="faiss")
    assert ranged == [3000]
    assert rounds[0][0] == 3000 and rounds[0][1] >= 1000 and rounds[-1][1] == 0
    other = knn(x, k=64, backend="torch")
    for u, v in zip(result, other, strict=True):
        assert torch.equal(u, v)
    fast = knn(x, k=64, backend="faiss", exact_distances=False)
    assert torch.equal(fast.indices, result.indices) and torch.equal(fast.valid, result.valid)
    copy = int(copies[5])
    assert result.distances[copy].tolist() == [0.0] * 64
    assert result.indices[copy].tolist() == sorted(set(copies.tolist()) - {copy})[:64]  # ties by position
    assert_first_rows_match_reference(result, x, 64, step=151)


@pytest.mark.parametrize("distance", DISTANCES)
def test_faiss_range_search_with_exclusions_matches_reference(
    monkeypatch: pytest.MonkeyPatch, distance: Distance
) -> None:
    # A query set against a gallery that contains it (explicit positions) with sequences of 7 items:
    # the range search returns the excluded items too, and they must be dropped.
    g = torch.Generator().manual_seed(2)
    gallery = torch.randn(3000, 6, generator=g) * (1 + torch.rand(3000, 1, generator=g))
    positions = torch.arange(0, 3000, 40)
    ranged = record_range_searches(monkeypatch)
    sequences = torch.arange(3000) // 7
    search = {"distance": distance, "exclude_self": positions, "sequence_ids": (sequences[positions], sequences)}
    result = knn(gallery[positions], gallery, 70, backend="faiss", **search)
    by_torch = knn(gallery[positions], gallery, 70, backend="torch", **search)
    assert ranged == [positions.numel()]
    for u, v in zip(result, by_torch, strict=True):
        assert torch.equal(u, v)
    expected = reference_knn(
        gallery[positions], gallery, 70, distance, positions.tolist(), (sequences[positions], sequences)
    )
    assert_matches_reference(result, expected, exact_distances=False)


def test_faiss_stage_searches_top_k_when_the_sample_is_the_whole_gallery(monkeypatch: pytest.MonkeyPatch) -> None:
    # A threshold sample as large as the gallery gives no threshold at all: the range search would return
    # nothing (it once crashed on that empty result). The stage then takes the top-k search.
    whole = lambda n_gallery, kp: n_gallery  # noqa: E731
    monkeypatch.setattr(stream_topk, "sample_size", whole)
    monkeypatch.setattr(faiss_stage, "sample_size", whole)
    x = torch.randn(1100, 8, generator=torch.Generator().manual_seed(9))
    ranged = record_range_searches(monkeypatch)
    result = knn(x[:50], x, 64, backend="faiss")
    assert ranged == []
    assert_matches_reference(result, reference_knn(x[:50], x, 64, "euclidean"), exact_distances=True)
    one_sided = problem.make_problem(x[:50], x, "euclidean", Exclusions(None, None, None), False)
    empty = faiss_stage.FaissStage(one_sided, use_gpu=False)._range(torch.arange(50), 66)
    assert not bool(empty.ok.any()) and bool((empty.floor < -1e38).all())  # nothing found, nothing certified


def exact_keys(query: Tensor, gallery: Tensor, distance: str) -> Tensor:
    """The stage-1 keys of every pair from the float64 values: what the rounding bound is about."""
    q, g = query.double(), gallery.double()
    if distance == "dot":
        return -(q @ g.T)
    if distance == "cosine":
        return -(q @ g.T) / ((q * q).sum(dim=1)[:, None] * (g * g).sum(dim=1)[None, :]).sqrt()
    return (g * g).sum(dim=1)[None, :] - 2.0 * (q @ g.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distance", DISTANCES)
def test_stage_keys_stay_within_their_rounding_bound(distance: Distance, dtype: torch.dtype) -> None:
    # Points far from the origin with a small spread and varied norms: the keys cancel (|g|^2 - 2<q,g> is
    # about -|q|^2), the hard case for a bound that scales with (|q| + max |g|)^2. Every stage's key of every
    # pair it returns is within its rounding bound (``certify.key_tolerance`` without the safety margin).
    g = torch.Generator().manual_seed(8)
    x = ((4.0 + torch.randn(1, 48, generator=g)) * (1 + 0.1 * torch.randn(2400, 48, generator=g))).to(dtype)
    x[::3] *= 1.7
    query, gallery = x[:300], x
    exact = exact_keys(query, gallery, distance)
    none = Exclusions(None, None, None)
    rows = torch.arange(300)
    one_sided = problem.make_problem(query, gallery, distance, none, same_set=False)
    symmetric = problem.make_problem(gallery, gallery, distance, none, same_set=True)
    faiss = faiss_stage.FaissStage(one_sided, use_gpu=False)
    searches = {
        "torch": (one_sided, TorchStage(one_sided, None)(rows, 2400, first_round=False)),
        "symmetric": (symmetric, TorchStage(symmetric, None)(rows, 2399, first_round=True)),
        "symmetric sweep": (symmetric, TorchStage(symmetric, None)._sweep_take(rows, 2399)),
        "faiss top-k": (one_sided, faiss._top(rows, 2400)),
        "faiss range": (one_sided, faiss._range(rows, 100)),
    }
    for name, (searched, found) in searches.items():
        assert int(found.ok.sum()) >= 300 * 50, name  # (the range search leaves a few crowded rows empty)
        error = (found.keys.double() - exact.gather(1, found.indices)).abs().masked_fill(~found.ok, 0.0)
        bound = certify.key_tolerance(searched, rows, found.rounding) / plan.TOLERANCE_FACTOR
        assert bool((error <= bound[:, None]).all()), (name, float((error / bound[:, None]).max()))


def test_canonical_dots_do_not_depend_on_how_the_pairs_are_grouped() -> None:
    # The pairs are grouped by the side with more rows. Padding the query side with unused rows flips the
    # grouping without changing any pair: every value must stay the same bit for bit (a duplicate's distance
    # is exactly 0 only if its dot product equals the self-dot, which may come from the other grouping).
    g = torch.Generator().manual_seed(12)
    query, gallery = torch.randn(40, 37, generator=g).double(), torch.randn(900, 37, generator=g).double()
    rows, cols = torch.randint(0, 40, (5000,), generator=g), torch.randint(0, 900, (5000,), generator=g)
    by_gallery = keys.canonical_dots(rows, cols, query, gallery)
    by_query = keys.canonical_dots(rows, cols, torch.cat([query, torch.zeros(2000, 37).double()]), gallery)
    assert torch.equal(by_gallery, by_query)
    assert torch.allclose(by_gallery, (query[rows] * gallery[cols]).sum(dim=1))


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "dot"])
def test_canonical_distances_in_blocks_of_pairs_are_the_same(monkeypatch: pytest.MonkeyPatch, distance: str) -> None:
    # Blocks of 7 pairs cut every query's candidates across blocks; near-duplicates take the direct squared
    # differences in some blocks and not in others. Every distance and neighbour must stay the same bit for bit.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 24, generator=g)
    x[150:] = x[:150] + 1e-5 * torch.randn(150, 24, generator=g)  # near-duplicates
    whole = knn(x, k=9, distance=distance, exclude_self=True)
    monkeypatch.setattr(certify, "PAIR_BLOCK", 7)
    blocks = knn(x, k=9, distance=distance, exclude_self=True)
    assert torch.equal(blocks.indices, whole.indices) and torch.equal(blocks.distances, whole.distances)
    monkeypatch.undo()
    expected = torch.cdist(x.double(), x.double()) if distance == "euclidean" else None
    if expected is not None:
        expected.fill_diagonal_(float("inf"))
        assert torch.allclose(blocks.distances.double(), expected.gather(1, blocks.indices), atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# hand cases
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gallery", [False, True])
def test_knn_chunks_are_the_rows_of_knn(gallery: bool) -> None:
    g = torch.Generator().manual_seed(10)
    x, seq = torch.randn(500, 6, generator=g), torch.randint(0, 90, (500,), generator=g)
    other = torch.randn(300, 6, generator=g) if gallery else None
    ids = (seq, torch.randint(0, 90, (300,), generator=g)) if gallery else seq
    whole = knn(x, other, 7, sequence_ids=ids, exact_distances=False)
    parts = list(knn_chunks(x, other, 7, rows_per_chunk=128, sequence_ids=ids, exact_distances=False))
    assert [rows.tolist() for rows, _ in parts] == [list(range(s, min(s + 128, 500))) for s in range(0, 500, 128)]
    for field, expected in zip(KNNResult._fields, whole, strict=True):
        assert torch.equal(torch.cat([getattr(found, field) for _, found in parts]), expected), field


def test_knn_chunks_check_their_arguments_before_the_first_chunk() -> None:
    x = torch.randn(20, 3)
    with pytest.raises(ValueError, match="`rows_per_chunk` must be an int >= 1, got 0"):
        knn_chunks(x, k=1, rows_per_chunk=0)
    with pytest.raises(ValueError, match="`k` must be an int >= 1, got 0"):
        knn_chunks(x, k=0, rows_per_chunk=5)  # no iteration needed for the error
    no_one_eligible = knn_chunks(x, k=3, rows_per_chunk=8, search_groups=torch.arange(20))
    assert [tuple(found.indices.shape) for _, found in no_one_eligible] == [(8, 0), (8, 0), (4, 0)]


def test_ranks_keep_their_relevance_when_only_mixed_ties_are_ordered_exactly(scan_engine: str) -> None:
    # Gallery items on 8 circles around the queries (which sit near the origin), 60 per circle: the
    # float32 keys cannot order a circle's items (their distances differ by float32 rounding of the
    # coordinates only), the circles are far apart, and a circle's items share a label. Every circle is
    # then a run of near ties with one label: its exact order does not change the relevance of any rank.
    g = torch.Generator().manual_seed(12)
    level = torch.arange(8).repeat_interleave(60) + 1.0
    angle = torch.rand(480, generator=g) * 2 * torch.pi
    gallery, gallery_labels = torch.stack([level * angle.cos(), level * angle.sin()], dim=1), level.long() % 2
    query, query_labels = 1e-3 * torch.randn(50, 2, generator=g), torch.randint(0, 2, (50,), generator=g)

    def relevance(rows: Tensor, items: Tensor) -> Tensor:
        return gallery_labels[items] == query_labels[rows][:, None]

    whole = knn(query, gallery, 150)
    chunks = list(knn_chunks(query, gallery, 150, rows_per_chunk=20, exact_distances=False, relevance=relevance))
    indices, valid = (torch.cat([getattr(found, name) for _, found in chunks]) for name in ("indices", "valid"))
    everyone = torch.arange(50)
    assert torch.equal(relevance(everyone, indices) & valid, relevance(everyone, whole.indices) & whole.valid)
    differ = int((indices != whole.indices).any(dim=1).sum())
    assert differ > 0 if scan_engine == "compiled scans" else differ == 0  # only the compiled ranking skips
    with pytest.raises(ValueError, match="`relevance` needs exact_distances=False, got exact_distances=True"):
        knn_chunks(query, gallery, 150, rows_per_chunk=20, relevance=relevance)
    with pytest.raises(TypeError, match="`relevance` must be None or a callable, got"):
        knn_chunks(query, gallery, 150, rows_per_chunk=20, exact_distances=False, relevance=[1])  # type: ignore[arg-type]


def test_duplicate_of_the_query_is_a_real_neighbour() -> None:
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    for backend in BACKENDS:
        result = knn(x, k=2, backend=backend)
        assert result.indices.tolist() == [[1, 2], [0, 2], [0, 1]]
        assert result.distances.tolist() == [[0.0, 5.0], [0.0, 5.0], [5.0, 5.0]]


def test_sequence_ids_exclude_the_same_sequence() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    seq = torch.tensor([7, 7, 8, 9])
    result = knn(x, k=3, sequence_ids=seq)
    # query 0: item 1 is its sequence; 2 at 2, 3 at 10; the third slot is empty
    assert result.indices.tolist() == [[2, 3, 0], [2, 3, 0], [1, 0, 3], [2, 1, 0]]
    assert result.valid.tolist() == [[True, True, False], [True, True, False], [True, True, True], [True, True, True]]
    assert result.distances[0].tolist() == [2.0, 10.0, float("inf")]


def test_search_groups_restrict_the_gallery() -> None:
    query = torch.tensor([[0.0], [0.0]])
    gallery = torch.tensor([[1.0], [5.0], [2.0]])
    result = knn(query, gallery, 3, search_groups=(torch.tensor([0, 1]), torch.tensor([1, 0, 1])))
    assert result.indices.tolist() == [[1, 0], [0, 2]]
    assert result.distances.tolist() == [[5.0, float("inf")], [1.0, 2.0]]
    assert result.valid.tolist() == [[True, False], [True, True]]


def test_auto_backend_choice(monkeypatch: pytest.MonkeyPatch, scan_engine: str) -> None:
    chosen = spy(monkeypatch, plan, "resolve_backend", lambda _, engine: engine)
    x = torch.randn(200, 4, generator=torch.Generator().manual_seed(0))
    knn(x, k=5)  # the set against itself
    knn(x[:50], x, k=5)  # small K against a gallery
    knn(x[:50], x, k=100)  # large K against a gallery
    knn(x, k=5, search_groups=torch.arange(200) % 2)
    if scan_engine == "compiled scans":
        assert chosen == ["torch", "faiss", "torch", "torch"]
    else:  # without numba, the torch scans only win for large leave-one-out searches with small K
        assert chosen == ["faiss", "faiss", "faiss", "torch"]


def test_faiss_with_search_groups_falls_back_to_torch() -> None:
    query, gallery = torch.tensor([[0.0]]), torch.tensor([[1.0], [2.0]])
    with pytest.warns(UserWarning, match="search groups"):
        result = knn(query, gallery, 1, search_groups=(torch.tensor([1]), torch.tensor([0, 1])), backend="faiss")
    assert result.indices.tolist() == [[1]]


def test_k_larger_than_gallery_is_clamped() -> None:
    query, gallery = torch.tensor([[0.0]]), torch.tensor([[2.0], [1.0]])
    result = knn(query, gallery, 10)
    assert result.indices.tolist() == [[1, 0]] and result.distances.tolist() == [[1.0, 2.0]]


def test_k_trimmed_to_the_largest_eligible_count() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0]])
    result = knn(x, k=5)  # each query has 2 eligible items
    assert result.indices.shape == (3, 2) and bool(result.valid.all())


def test_no_eligible_item_at_all_gives_empty_columns() -> None:
    result = knn(torch.tensor([[0.0]]), k=3)
    assert result.indices.shape == (1, 0) and result.distances.shape == (1, 0) and result.valid.shape == (1, 0)


def test_explicit_self_positions_with_minus_one() -> None:
    gallery = torch.tensor([[0.0], [1.0], [3.0]])
    query = torch.tensor([[0.0], [1.0]])
    result = knn(query, gallery, 2, exclude_self=torch.tensor([-1, 1]))
    assert result.indices.tolist() == [[0, 1], [0, 2]]
    assert result.distances.tolist() == [[0.0, 1.0], [1.0, 2.0]]


def test_exclude_self_true_with_a_gallery_and_false_without() -> None:
    x = torch.tensor([[0.0], [1.0]])
    assert knn(x, x.clone(), 1, exclude_self=True).indices.tolist() == [[1], [0]]
    assert knn(x, k=1, exclude_self=False).indices.tolist() == [[0], [1]]


def test_distances_by_definition() -> None:
    query, gallery = torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 0.0], [6.0, 8.0], [-4.0, 3.0]])
    expected: dict[Distance, list[float]] = {
        "euclidean": [5.0, 5.0, 7.0710678],
        "sqeuclidean": [25.0, 25.0, 50.0],
        "dot": [-50.0, 0.0, 0.0],
    }
    for distance, values in expected.items():
        result = knn(query, gallery, 3, distance=distance)
        assert result.distances[0].tolist() == pytest.approx(values)
    assert knn(query, gallery, 3, distance="euclidean").indices.tolist() == [[0, 1, 2]]
    assert knn(query, gallery, 3, distance="dot").indices.tolist() == [[1, 0, 2]]
    cosine = knn(query, gallery[1:], 2, distance="cosine")
    assert cosine.indices.tolist() == [[0, 1]] and cosine.distances.tolist() == [[0.0, 1.0]]


def test_dtype_and_device_are_kept() -> None:
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    result = knn(x, k=1)
    assert result.distances.dtype == torch.float64 and result.distances.device == x.device
    assert knn(x.half(), k=1).distances.dtype == torch.float16


# ----------------------------------------------------------------------------------------------------------------------
# distance_blocks
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("chunk_size", [1, 3, 7, None])
def test_distance_blocks_tile_once_and_mark_exclusions(distance, chunk_size) -> None:
    query, gallery = integer_points(11, 3, 1), integer_points(13, 3, 2)
    self_index = torch.tensor([-1, 0, 5, -1, 12, 3, -1, -1, 1, 2, 4])
    seq = (torch.arange(11) % 4, torch.arange(13) % 5)
    groups = (torch.arange(11) % 2, torch.arange(13) % 3 % 2)
    seen = torch.zeros(11, 13, dtype=torch.long)
    for block in distance_blocks(
        query,
        gallery,
        distance=distance,
        self_index=self_index,
        sequence_ids=seq,
        search_groups=groups,
        chunk_size=chunk_size,
    ):
        rows, cols = block.query_slice, block.gallery_slice
        seen[rows, cols] += 1
        for i in range(rows.start, rows.stop):
            expected = reference_distances(query[i], gallery[cols], distance).float()
            for j in range(cols.start, cols.stop):
                excluded = self_index[i] == j or seq[0][i] == seq[1][j] or groups[0][i] != groups[1][j]
                eligible = True if block.eligible is None else bool(block.eligible[i - rows.start, j - cols.start])
                value = float(block.distances[i - rows.start, j - cols.start])
                assert eligible == (not excluded)
                if excluded:
                    assert value == float("inf")
                else:
                    assert value == pytest.approx(float(expected[j - cols.start]), abs=1e-4)
    assert bool((seen == 1).all())


def test_distance_blocks_default_blocks_and_none_mask() -> None:
    blocks = list(distance_blocks(torch.zeros(5, 2), torch.ones(4, 2)))
    assert len(blocks) == 1 and blocks[0].eligible is None
    assert blocks[0].distances.shape == (5, 4)


# ----------------------------------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------------------------------

X = torch.zeros(3, 2) + torch.arange(3.0)[:, None]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"query": [[0.0]]}, TypeError, "`query` must be a torch.Tensor"),
        ({"query": torch.zeros(3)}, ValueError, "`query` must be 2-D"),
        ({"query": torch.zeros(3, 2, dtype=torch.long)}, TypeError, "`query` must have a floating dtype"),
        ({"query": torch.tensor([[float("nan")]])}, ValueError, "`query` must be finite"),
        ({"query": torch.zeros(0, 2)}, ValueError, "`query` must have at least one row"),
        ({"gallery": torch.tensor([[float("inf"), 0.0]])}, ValueError, "`gallery` must be finite"),
        ({"gallery": torch.zeros(3, 5)}, ValueError, "`gallery` must have 2 columns"),
        ({"k": 0}, ValueError, "`k` must be an int >= 1, got 0"),
        ({"k": 1.5}, TypeError, "`k` must be an int"),
        ({"exact_distances": "yes"}, TypeError, "`exact_distances` must be a bool, got 'yes'"),
        ({"k": True}, TypeError, "`k` must be an int"),
        ({"distance": "manhattan"}, ValueError, "`distance` must be one of"),
        ({"backend": "annoy"}, ValueError, "`backend` must be one of"),
        ({"chunk_size": 0}, ValueError, "`chunk_size` must be an int >= 1"),
        ({"exclude_self": "yes"}, TypeError, "`exclude_self` must be None, a bool"),
        ({"exclude_self": torch.tensor([0, 1, 2], dtype=torch.int32)}, TypeError, "`exclude_self` must have dtype"),
        ({"exclude_self": torch.zeros(3, 1, dtype=torch.long)}, ValueError, "`exclude_self` must be 1-D"),
        ({"exclude_self": torch.tensor([0, 1])}, ValueError, "`exclude_self` must have 3 rows"),
        (
            {"exclude_self": torch.tensor([0, 1, 3])},
            ValueError,
            r"must hold gallery positions in \[0, 3\)",
        ),
        ({"exclude_self": torch.tensor([0, -2, 1])}, ValueError, "`exclude_self` must hold gallery positions"),
        ({"sequence_ids": torch.zeros(3)}, TypeError, "`sequence_ids` must be a"),
        ({"search_groups": torch.zeros(3, dtype=torch.long)}, TypeError, "`search_groups` must be a"),
        ({"sequence_ids": (torch.zeros(2, dtype=torch.long), torch.zeros(3))}, ValueError, r"`sequence_ids\[0\]`"),
        ({"search_groups": (torch.zeros(3, dtype=torch.long), torch.zeros(3))}, TypeError, r"`search_groups\[1\]`"),
        ({"sequence_ids": (torch.zeros(3, 1), torch.zeros(3))}, ValueError, r"`sequence_ids\[0\]` must be 1-D"),
        ({"query": torch.full((3, 2), 1e30)}, ValueError, "`query` must have row norms below"),
    ],
)
def test_knn_errors(kwargs, error, match) -> None:
    args = {"query": X, "gallery": X.clone(), "k": 1, **kwargs}
    with pytest.raises(error, match=match):
        knn(args.pop("query"), args.pop("gallery"), args.pop("k"), **args)


def test_knn_errors_without_gallery() -> None:
    with pytest.raises(TypeError, match="`sequence_ids` must be one tensor"):
        knn(X, sequence_ids=(torch.zeros(3), torch.zeros(3)))
    with pytest.raises(ValueError, match="`sequence_ids` must have 3 rows"):
        knn(X, sequence_ids=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="`gallery` must have 3 rows like `query`"):
        knn(X, torch.zeros(2, 2), exclude_self=True)
    with pytest.raises(ValueError, match="all-zero row with distance='cosine'"):
        knn(torch.zeros(2, 2), distance="cosine")


def test_distance_blocks_errors() -> None:
    with pytest.raises(ValueError, match="`distance` must be one of"):
        distance_blocks(X, X, distance="l1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`chunk_size` must be an int >= 1"):
        distance_blocks(X, X, chunk_size=-1)
    with pytest.raises(ValueError, match="`self_index` must hold gallery positions"):
        distance_blocks(X, X, self_index=torch.tensor([0, 1, 5]))
    with pytest.raises(TypeError, match="`sequence_ids` must be a"):
        distance_blocks(X, X, sequence_ids=torch.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`gallery` must have 2 columns"):
        distance_blocks(X, torch.zeros(3, 1))


@pytest.mark.parametrize(
    "cols",
    [slice(3, 17), torch.tensor([0, 2, 5, 6, 11, 19]), torch.tensor([11, 2, 19, 5]), torch.tensor([[4, 9], [1, 2]])],
    ids=["slice", "ascending positions", "positions in any order", "per-row positions"],
)
def test_the_self_rule_marks_exactly_each_rows_own_item(cols: slice | torch.Tensor) -> None:
    """Every form of block columns, against an entry-by-entry loop: a row's own item (-1: none in the gallery)
    is marked wherever it is one of the block's columns, and nothing else is."""
    own = torch.tensor([5, -1, 11, 2, 19, 0, 2, 12])
    rows = slice(2, 4) if isinstance(cols, torch.Tensor) and cols.ndim == 2 else slice(0, 8)
    positions = cols if isinstance(cols, torch.Tensor) else torch.arange(cols.start, cols.stop)
    n_rows = rows.stop - rows.start
    expected = torch.zeros(n_rows, positions.shape[-1], dtype=torch.bool)
    for i in range(n_rows):
        row_positions = positions[i] if positions.ndim == 2 else positions
        for j in range(positions.shape[-1]):
            expected[i, j] = bool(row_positions[j] == own[rows.start + i])
    found = Exclusions(own, None, None).fill_excluded_(torch.zeros_like(expected), rows, cols, True)
    assert torch.equal(found, expected)
    assert bool(expected.any())


@pytest.mark.parametrize(
    ("rows", "cols"),
    [(slice(0, 8), slice(0, 8)), (slice(4, 12), slice(0, 6)), (slice(0, 5), slice(3, 20)), (slice(8, 12), slice(0, 8))],
    ids=["the diagonal block", "rows after columns", "columns after rows", "no common item"],
)
def test_the_self_rule_of_a_set_against_itself_marks_the_blocks_diagonal(rows: slice, cols: slice) -> None:
    """With query i being item i, the marked entries are those whose row and column are the same sample, as an
    entry-by-entry loop finds them, wherever the block sits."""
    n_rows, n_cols = rows.stop - rows.start, cols.stop - cols.start
    expected = torch.zeros(n_rows, n_cols, dtype=torch.bool)
    for i in range(n_rows):
        for j in range(n_cols):
            expected[i, j] = rows.start + i == cols.start + j
    exclusions = Exclusions(torch.arange(20), None, None, self_is_identity=True)
    found = exclusions.fill_excluded_(torch.zeros_like(expected), rows, cols, True)
    assert torch.equal(found, expected)
