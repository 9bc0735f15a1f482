"""Capped searches (``Problem.caps``): each query wants only the items at most its cap away, as a rank of a
sharded search does once it knows a K-th distance from its own shard. The answer must be exactly the uncapped
top K cut at the cap (ties at the cap kept, in position order), whichever path the stage takes."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._search import plan, stream_topk
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions, KNNResult

K = 7


def _rows(n: int, seed: int) -> torch.Tensor:
    """Small integer points: many exact distance ties and duplicates."""
    x = torch.randint(-2, 3, (n, 6), generator=torch.Generator().manual_seed(seed)).float()
    x[10:20] = x[-1]
    return x


def _caps(reference: KNNResult, seed: int) -> torch.Tensor:
    """Per query: its uncapped j-th distance for a random j (a cap on a tie), 0, a cap below every item, or +inf."""
    n = reference.distances.shape[0]
    generator = torch.Generator().manual_seed(seed)
    column = torch.randint(0, K, (n,), generator=generator)
    caps = reference.distances.gather(1, column[:, None]).flatten().clone()
    kind = torch.randint(0, 5, (n,), generator=generator)
    caps[kind == 1] = 0.0
    caps[kind == 2] = -1.0 if reference.distances.dtype.is_floating_point else 0
    caps[kind == 3] = float("inf")
    return caps


def _cut(reference: KNNResult, caps: torch.Tensor) -> KNNResult:
    """The uncapped answer without the items beyond their query's cap."""
    valid = reference.valid & (reference.distances <= caps[:, None])
    return KNNResult(
        reference.distances.masked_fill(~valid, float("inf")), reference.indices.masked_fill(~valid, 0), valid
    )


def _assert_same(found: KNNResult, expected: KNNResult) -> None:
    assert torch.equal(found.valid, expected.valid)
    assert torch.equal(found.indices, expected.indices)
    assert torch.equal(found.distances, expected.distances)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_bipartite_pass_cut_at_the_caps(compiled: bool, distance: str) -> None:
    left, right = _rows(150, 1), _rows(260, 2)
    x = torch.cat([left, right])
    with plan.force_compiled(compiled):
        problem = make_problem(x, x, distance, Exclusions(torch.arange(410), None, None), True, split=150)
        reference = Search.prepare(problem, K, backend="torch")(torch.arange(410))
        caps = _caps(reference, 3)
        capped = Search.prepare(problem._replace(caps=caps), K, backend="torch")(torch.arange(410))
    _assert_same(capped, _cut(reference, caps))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_one_sided_search_cut_at_the_caps(compiled: bool, distance: str) -> None:
    query, gallery = _rows(120, 4), _rows(500, 5)
    sequences = (torch.arange(120) % 9, torch.arange(500) % 9)
    with plan.force_compiled(compiled):
        problem = make_problem(query, gallery, distance, Exclusions(None, sequences, None), same_set=False)
        reference = Search.prepare(problem, K, backend="torch")(torch.arange(120))
        caps = _caps(reference, 6)
        capped = Search.prepare(problem._replace(caps=caps), K, backend="torch")(torch.arange(120))
    _assert_same(capped, _cut(reference, caps))


def test_float64_rows_and_clustered_data() -> None:
    """Caps in float64 (distances not rounded to float32), on continuous data where the caps are tight."""
    x = torch.randn(400, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    x[200:] = x[:200] + 0.01 * torch.randn(200, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    problem = make_problem(x, x, "euclidean", Exclusions(torch.arange(400), None, None), True, split=180)
    reference = Search.prepare(problem, K, backend="torch")(torch.arange(400))
    caps = _caps(reference, 9)
    capped = Search.prepare(problem._replace(caps=caps), K, backend="torch")(torch.arange(400))
    _assert_same(capped, _cut(reference, caps))


def test_finite_caps_replace_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a cap for every query the stage starts from them and takes no sample of the gallery."""
    calls: list[int] = []
    original = stream_topk.sample_thresholds

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(stream_topk, "sample_thresholds", counting)
    x = torch.randn(3000, 8, generator=torch.Generator().manual_seed(10))
    problem = make_problem(x, x, "euclidean", Exclusions(torch.arange(3000), None, None), True, split=1000)
    reference = Search.prepare(problem, K, backend="torch")(torch.arange(3000))
    assert calls  # a gallery this large is sampled without caps
    calls.clear()
    caps = reference.distances[:, 2].clone()
    capped = Search.prepare(problem._replace(caps=caps), K, backend="torch")(torch.arange(3000))
    assert not calls
    _assert_same(capped, _cut(reference, caps))


def test_caps_need_exact_distances() -> None:
    """A cap is compared with canonical distances, which a search without exact distances does not compute."""
    x = _rows(50, 11)
    problem = make_problem(x, x, "euclidean", Exclusions(torch.arange(50), None, None), True)
    with pytest.raises(AssertionError, match="exact_distances"):
        Search.prepare(problem._replace(caps=torch.ones(50)), K, backend="torch", exact_distances=False)
