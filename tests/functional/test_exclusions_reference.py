"""Leave-one-out search with sequence ids and search groups (together and alone), custom relevance and every
``empty_target_action``, against the slow reference (tests/reference.py): neighbours, distances, per-query values
and reduced metrics.

Data: small integer coordinates with repeated rows, so exact distance ties and duplicates (distance 0) are common;
float32 and float64; every backend and small chunk sizes (blocks that split ties). Expected values come from the
reference only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import reference
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import torchmetrics_retrieval.functional as F

FALLBACK = "cannot restrict a search to search groups"
ACTIONS = ("skip", "neg", "pos", "error")
DISTANCES = ("euclidean", "sqeuclidean", "dot")  # exact in float64 on small integers


def _mod3(a: Tensor, b: Tensor) -> Tensor:
    return (a % 3) == (b % 3)


def _first_column(a: Tensor, b: Tensor) -> Tensor:
    return a[..., 0] == b[..., 0]


#: name -> (label values, label columns (0: 1-D labels), label_comparison_fn)
LABELINGS: dict[str, tuple[int, int, Callable[[Tensor, Tensor], Tensor] | None]] = {
    "equal": (4, 0, None),
    "mod3": (9, 0, _mod3),
    "2d_rows": (2, 2, None),
    "2d_first_column": (3, 2, _first_column),
}


@dataclass
class Problem:
    x: Tensor
    labels: Tensor
    fn: Callable[[Tensor, Tensor], Tensor] | None
    sequence_ids: Tensor | None
    search_groups: Tensor | None

    @property
    def n(self) -> int:
        return self.x.shape[0]


@st.composite
def problems(draw: st.DrawFn, max_n: int = 12) -> Problem:
    n = draw(st.integers(1, max_n))
    dim = draw(st.integers(1, 3))
    n_distinct = draw(st.integers(1, n))
    distinct = draw(st.lists(st.integers(-2, 2), min_size=n_distinct * dim, max_size=n_distinct * dim))
    rows = draw(st.lists(st.integers(0, n_distinct - 1), min_size=n, max_size=n))  # repeated rows: duplicates
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    x = torch.tensor(distinct, dtype=dtype).reshape(n_distinct, dim)[rows]
    n_values, columns, fn = LABELINGS[draw(st.sampled_from(sorted(LABELINGS)))]
    size = n * max(columns, 1)
    labels = torch.tensor(draw(st.lists(st.integers(0, n_values - 1), min_size=size, max_size=size)))
    labels = labels.reshape(n, columns) if columns else labels
    exclusions = draw(st.sampled_from(["both", "sequence_ids", "search_groups", "none"]))
    seq = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    groups = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    return Problem(
        x,
        labels,
        fn,
        seq if exclusions in ("both", "sequence_ids") else None,
        groups if exclusions in ("both", "search_groups") else None,
    )


def run(
    call: Callable[[], Any],
    backend: str,
    search_groups: Tensor | None,
    refs: list[reference.QueryRanking],
    searches: bool = True,
) -> Any:
    """``call()``; faiss must warn that it falls back to torch exactly when search groups are given and there is
    something to search (no search runs when no query has an eligible item, nor without ``searches``: full
    ``map`` without a per-query table reads every value off the full ranks)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    fell_back = any(FALLBACK in str(w.message) for w in caught)
    searched = searches and any(r.positions for r in refs)
    assert fell_back == (backend == "faiss" and search_groups is not None and searched), [
        str(w.message) for w in caught
    ]
    return result


def expected_width(refs: list[reference.QueryRanking], k: int) -> int:
    """``K = min(k, G)`` trimmed to the largest number of eligible items of any query."""
    return min(k, max(len(r.positions) for r in refs))


def assert_neighbours(
    refs: list[reference.QueryRanking], indices: Tensor, distances: Tensor, valid: Tensor, k: int, dtype: torch.dtype
) -> None:
    width = expected_width(refs, k)
    assert indices.shape == distances.shape == valid.shape == (len(refs), width)
    assert indices.dtype == torch.int64
    assert distances.dtype == dtype
    for q, r in enumerate(refs):
        n_found = min(width, len(r.positions))
        assert valid[q].tolist() == [True] * n_found + [False] * (width - n_found), q
        # the full sort by (distance, position) over the eligible gallery, cut at K: positions and exact distances
        assert indices[q, :n_found].tolist() == r.positions[:n_found], (q, r)
        assert distances[q, :n_found].tolist() == r.distances[:n_found], (q, r)
        assert distances[q, n_found:].tolist() == [math.inf] * (width - n_found), q


# ---- F.knn -----------------------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    problem=problems(),
    k=st.integers(1, 13),
    distance=st.sampled_from(DISTANCES),
    backend=st.sampled_from(["auto", "torch", "faiss"]),
    chunk_size=st.sampled_from([None, 1, 3]),
)
def test_knn_matches_reference(problem: Problem, k: int, distance: str, backend: str, chunk_size: int | None) -> None:
    refs = reference.whole_set(
        problem.x,
        problem.labels,
        sequence_ids=problem.sequence_ids,
        search_groups=problem.search_groups,
        distance=distance,
    )
    found = run(
        lambda: F.knn(
            problem.x,
            k=k,
            distance=distance,
            sequence_ids=problem.sequence_ids,
            search_groups=problem.search_groups,
            backend=backend,
            chunk_size=chunk_size,
        ),
        backend,
        problem.search_groups,
        refs,
    )
    assert_neighbours(refs, found.indices, found.distances, found.valid, k, problem.x.dtype)


# ---- F.retrieval_per_query and F.retrieval_metrics ------------------------------------------------------------------


def reference_values(r: reference.QueryRanking, k: int, precision_mode: str) -> dict[str, float]:
    return {
        "cmc/1": reference.cmc(r, 1),
        f"cmc/{k}": reference.cmc(r, k),
        f"precision/{k}": reference.precision(r, k, precision_mode),
        f"recall/{k}": reference.recall(r, k),
        f"map/{k}": reference.map_at_k(r, k),
        f"ndcg/{k}": reference.ndcg(r, k),
        "map_at_r": reference.map_at_r(r),
        "r_precision": reference.r_precision(r),
        "mrr": reference.reciprocal_rank(r),
        "map": reference.average_precision(r),
    }


def ranking_options(k: int, precision_mode: str, **options: Any) -> dict[str, Any]:
    cutoffs = tuple(sorted({1, k}))
    return {
        "cmc_top_k": cutoffs,
        "precision_top_k": (k,),
        "recall_top_k": (k,),
        "map_top_k": (k,),
        "ndcg_top_k": (k,),
        "map_at_r": True,
        "r_precision": True,
        "mrr": True,
        "map_full": True,
        "precision_mode": precision_mode,
        **options,
    }


@st.composite
def masks(draw: st.DrawFn, n: int) -> tuple[Tensor | None, Tensor | None]:
    if not draw(st.booleans()):
        return None, None
    is_query = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    is_gallery = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    is_query[draw(st.integers(0, n - 1))] = True  # at least one query and one gallery item
    is_gallery[draw(st.integers(0, n - 1))] = True
    return is_query, is_gallery


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    problem=problems(),
    k=st.integers(1, 6),
    distance=st.sampled_from(DISTANCES),
    backend=st.sampled_from(["auto", "torch", "faiss"]),
    chunk_size=st.sampled_from([None, 3]),
    precision_mode=st.sampled_from(["min_k_n", "standard"]),
    action=st.sampled_from(ACTIONS),
)
def test_per_query_and_reduced_metrics_match_reference(
    data: st.DataObject,
    problem: Problem,
    k: int,
    distance: str,
    backend: str,
    chunk_size: int | None,
    precision_mode: str,
    action: str,
) -> None:
    is_query, is_gallery = data.draw(masks(problem.n))
    refs = reference.whole_set(
        problem.x,
        problem.labels,
        is_query=None if is_query is None else is_query.tolist(),
        is_gallery=None if is_gallery is None else is_gallery.tolist(),
        sequence_ids=problem.sequence_ids,
        search_groups=problem.search_groups,
        distance=distance,
        label_comparison_fn=problem.fn,
    )
    sets = {
        "is_query": is_query,
        "is_gallery": is_gallery,
        "sequence_ids": problem.sequence_ids,
        "search_groups": problem.search_groups,
    }
    common = {"distance": distance, "knn_backend": backend, "chunk_size": chunk_size, "label_comparison_fn": problem.fn}
    options = ranking_options(k, precision_mode, **common)
    expected = [reference_values(r, k, precision_mode) for r in refs]
    n_relevant = [r.n_relevant for r in refs]

    # (a) per query: positions in the input set, distances, relevance, values before the empty-target rule
    result = run(
        lambda: F.retrieval_per_query(problem.x, problem.labels, options=F.RetrievalOptions.create(**options), **sets),
        backend,
        problem.search_groups,
        refs,
    )
    queries = [i for i in range(problem.n) if is_query is None or bool(is_query[i])]
    assert result.query_positions.tolist() == queries
    assert torch.equal(result.query_labels, problem.labels[queries])
    assert result.n_relevant.tolist() == n_relevant
    assert result.counted.tolist() == [n > 0 for n in n_relevant]  # "skip" is the default action
    k_searched = max(k, *n_relevant)  # map_at_r and r_precision need the R(q) nearest
    assert_neighbours(refs, result.indices, result.distances, result.valid, k_searched, problem.x.dtype)
    for q, r in enumerate(refs):
        n_found = int(result.valid[q].sum())
        assert result.is_relevant[q, :n_found].tolist() == r.relevant[:n_found], q
        assert not result.is_relevant[q, n_found:].any(), q
    assert sorted(result.values) == sorted(expected[0])
    for key, values in result.values.items():
        assert values.shape == (len(refs),), key
        assert values.tolist() == pytest.approx([e[key] for e in expected], abs=1e-6), key

    # (b) reduced under the empty-target action, without a neighbour table: with full ``map`` read off the full
    # ranks (no search), without it from the search
    for map_full in (True, False):

        def call(map_full: bool = map_full) -> dict[str, Tensor]:
            chosen = {**options, "map_full": map_full}
            return F.retrieval_metrics(problem.x, problem.labels, **sets, **chosen, empty_target_action=action)

        if action == "error" and any(n == 0 for n in n_relevant):
            with pytest.raises(ValueError, match="`empty_target_action` is 'error'"):
                run(call, backend, problem.search_groups, refs, searches=not map_full)
            continue
        metrics = run(call, backend, problem.search_groups, refs, searches=not map_full)
        rule = "neg" if action == "error" else action  # "error" without a lone query counts every query
        assert sorted(metrics) == sorted(key for key in expected[0] if map_full or key != "map")
        for key, value in metrics.items():
            want = reference.mean_over([e[key] for e in expected], refs, rule)
            assert value.ndim == 0, key
            if math.isnan(want):  # "skip" with every query lone
                assert math.isnan(float(value)), key
            else:
                assert float(value) == pytest.approx(want, abs=1e-6), key


# ---- fixed cases: a lone query, and each exclusion alone and together -----------------------------------------------


def tied_set() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Six points on a line with duplicates; with labels compared modulo 3, queries 4 and 5 are lone."""
    x = torch.tensor([[0.0], [1.0], [1.0], [2.0], [0.0], [1.0]])
    labels = torch.tensor([0, 3, 0, 3, 1, 2])  # modulo 3: 0 0 0 0 1 2
    seq = torch.tensor([0, 0, 1, 1, 2, 2])
    groups = torch.tensor([0, 0, 0, 1, 1, 0])
    return x, labels, seq, groups


@pytest.mark.parametrize("exclusions", ["both", "sequence_ids", "search_groups"])
@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_lone_query_under_every_action(exclusions: str, backend: str) -> None:
    x, labels, seq, groups = tied_set()
    sets = {
        "sequence_ids": seq if exclusions != "search_groups" else None,
        "search_groups": groups if exclusions != "sequence_ids" else None,
    }
    refs = reference.whole_set(x, labels, **sets, label_comparison_fn=_mod3)  # type: ignore[arg-type]
    assert refs[4].n_relevant == refs[5].n_relevant == 0  # no other sample is 1 (2) modulo 3
    n_lone = sum(r.n_relevant == 0 for r in refs)
    options = {"cmc_top_k": (1, 2), "map_top_k": (), "precision_top_k": (2,), "mrr": True, "map_full": True}
    options |= {"label_comparison_fn": _mod3, "knn_backend": backend, "chunk_size": 3}
    expected = {
        "cmc/1": [reference.cmc(r, 1) for r in refs],
        "cmc/2": [reference.cmc(r, 2) for r in refs],
        "precision/2": [reference.precision(r, 2) for r in refs],
        "mrr": [reference.reciprocal_rank(r) for r in refs],
        "map": [reference.average_precision(r) for r in refs],
    }
    for action in ("skip", "neg", "pos"):
        metrics = run(
            lambda action=action: F.retrieval_metrics(x, labels, **sets, **options, empty_target_action=action),
            backend,
            sets["search_groups"],
            refs,
            searches=False,  # full ``map``: every value from the full ranks
        )
        assert {key: float(v) for key, v in metrics.items()} == pytest.approx(
            {key: reference.mean_over(values, refs, action) for key, values in expected.items()}, abs=1e-6
        )
    with pytest.raises(ValueError, match=f"`empty_target_action` is 'error' and {n_lone} of 6 queries"):
        run(
            lambda: F.retrieval_metrics(x, labels, **sets, **options, empty_target_action="error"),
            backend,
            sets["search_groups"],
            refs,
        )
    found = run(lambda: F.knn(x, k=6, backend=backend, chunk_size=3, **sets), backend, sets["search_groups"], refs)
    assert_neighbours(refs, found.indices, found.distances, found.valid, 6, x.dtype)


def test_reference_exclusions_by_hand() -> None:
    """The reference itself on the fixed set: the rules the property tests rely on, written out."""
    x, labels, seq, groups = tied_set()
    both = reference.whole_set(x, labels, sequence_ids=seq, search_groups=groups)
    # query 1 (x=1, seq 0, group 0): 0 shares its sequence, 3 and 4 are in group 1; 2 and 5 tie at 0, by position
    assert both[1].positions == [2, 5]
    assert both[1].distances == [0.0, 0.0]
    # query 3 (x=2, seq 1, group 1): only 4 (group 1, seq 2) is eligible
    assert both[3].positions == [4]
    assert both[3].distances == [2.0]
    only_groups = reference.whole_set(x, labels, search_groups=groups)
    assert only_groups[1].positions == [2, 5, 0]
    only_seq = reference.whole_set(x, labels, sequence_ids=seq)
    assert only_seq[0].positions == [4, 2, 5, 3]
    masked = reference.whole_set(
        x, labels, is_query=[False, True, False, False, False, True], is_gallery=[True, True, True, False, False, False]
    )
    assert [r.positions for r in masked] == [[2, 0], [1, 2, 0]]
