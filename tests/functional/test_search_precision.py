"""The bfloat16 candidate pass of the search (``search_precision``): the same neighbours, distances and metric
values as float32, bit for bit, against the float32 path and the slow float64 reference of ``test_knn``; the bound
it certifies with; the fallback to float32; and what ``"auto"`` chooses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import Tensor

from tests.functional.test_knn import assert_matches_reference, integer_points, reference_knn
from torchmetrics_retrieval import CrossModalRetrieval, EmbeddingMetrics
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.functional._search import certify, low_precision, plan
from torchmetrics_retrieval.functional._search.problem import Candidates, make_problem, rounding_terms
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional.search import DISTANCES, KNNResult, knn

PRECISIONS = ("float32", "bfloat16", "auto")


@pytest.fixture(autouse=True, scope="module", params=["compiled scans", "torch scans"])
def scan_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test twice: stage-1 buffers filled by the compiled (numba) scans, and by torch passes."""
    with plan.force_compiled(request.param == "compiled scans"):
        yield request.param


def _same(a: KNNResult, b: KNNResult) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def clustered(n: int, dim: int, seed: int, spread: float = 0.5) -> Tensor:
    """Clustered float data with exact duplicates and a run of rows equal to one."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(max(1, n // 20), dim, generator=g)
    x = centers.repeat_interleave(20, 0)[:n] + spread * torch.randn(n, dim, generator=g)
    x[1], x[5:9] = x[0], x[4]
    return x


def near_ties_after_rounding(n: int, dim: int, seed: int) -> Tensor:
    """Rows that differ in float32 but are equal (or nearly) after rounding to bfloat16: one base row, each copy
    moved by a few float32 units in a few entries, so that only the canonical stage can order them."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(4, dim, generator=g)
    x = base.repeat(n // 4 + 1, 1)[:n].clone()
    steps = torch.randint(-40, 41, (n, dim), generator=g).float() * 2.0**-22
    return (x * (1.0 + steps)).contiguous()


def _three(query: Tensor, gallery: Tensor | None, k: int, **kwargs: object) -> list[KNNResult]:
    return [knn(query, gallery, k, search_precision=p, backend="torch", **kwargs) for p in PRECISIONS]  # type: ignore[arg-type]


# ---- bit-identical answers ---------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 40),
    dim=st.sampled_from([1, 2, 4, 8]),
    k=st.integers(1, 12),
    distance=st.sampled_from(DISTANCES),
    seed=st.integers(0, 2**16),
    gallery=st.booleans(),
)
def test_integer_data_with_exact_ties_matches_float32_and_the_reference(n, dim, k, distance, seed, gallery) -> None:
    x = integer_points(n, dim, seed)
    g = integer_points(n + 3, dim, seed + 1) if gallery else None
    results = _three(x, g, k, distance=distance)
    assert _same(results[0], results[1]) and _same(results[0], results[2])
    self_index = None if gallery else list(range(n))
    expected = reference_knn(x, x if g is None else g, k, distance, self_index)
    assert_matches_reference(results[1], expected, exact_distances=True)


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("gallery", [False, True])
@pytest.mark.parametrize("data", ["clustered", "equal after rounding", "D = 4"])
def test_float_data_bit_identical_to_float32(distance: str, gallery: bool, data: str) -> None:
    if data == "clustered":
        x = clustered(600, 64, 0)
    elif data == "equal after rounding":
        x = near_ties_after_rounding(400, 32, 1)
    else:
        x = clustered(500, 4, 2, spread=0.3)
    g = x[::2] * 1.5 + 0.01 if gallery else None
    for k in (1, 19):
        results = _three(x, g, k, distance=distance)
        assert _same(results[0], results[1]) and _same(results[0], results[2]), k
        # without exact distances: the same order, and canonical distances (keys of bfloat16 would differ)
        low = knn(x, g, k, distance=distance, search_precision="bfloat16", exact_distances=False)
        assert _same(low, results[0])


def test_equal_after_rounding_matches_the_reference() -> None:
    x = near_ties_after_rounding(120, 16, 3)
    result = knn(x, None, 7, search_precision="bfloat16", backend="torch")
    assert_matches_reference(result, reference_knn(x, x, 7, "euclidean", list(range(120))), exact_distances=True)


def test_sequence_ids_and_groups_bit_identical() -> None:
    x = clustered(300, 16, 4)
    ids = torch.arange(300) // 3
    groups = torch.arange(300) % 4
    for kwargs in ({"sequence_ids": ids}, {"search_groups": groups}):
        a = knn(x, None, 9, search_precision="float32", **kwargs)  # type: ignore[arg-type]
        b = knn(x, None, 9, search_precision="bfloat16", **kwargs)  # type: ignore[arg-type]
        assert _same(a, b)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_metric_values_identical_for_every_precision(distance: str) -> None:
    x = clustered(400, 32, 5)
    labels = torch.arange(400) // 20
    options = {"cmc_top_k": (1, 5), "map_at_r": True, "mrr": True, "map_full": True, "distance": distance}
    values = [retrieval_metrics(x, labels, search_precision=p, **options) for p in PRECISIONS]  # type: ignore[arg-type]
    for other in values[1:]:
        assert other.keys() == values[0].keys()
        assert all(torch.equal(other[key], values[0][key]) for key in values[0])


def test_half_storage_values_identical_for_every_precision() -> None:
    x = clustered(300, 16, 6)
    labels = torch.arange(300) // 20
    found = []
    for precision in PRECISIONS:
        metric = EmbeddingMetrics(storage_dtype=torch.float16, search_precision=precision, map_at_r=True)
        metric.update(x, labels)
        found.append(metric.compute())
    assert all(torch.equal(found[0][key], other[key]) for other in found[1:] for key in found[0])


@pytest.mark.parametrize("distance", DISTANCES)
def test_symmetric_sweep_and_one_pass_bit_identical(monkeypatch: pytest.MonkeyPatch, distance: str) -> None:
    """The sweep (the symmetric buffer forced not to fit, compiled scans) with bfloat16 keys: the float32 answer."""
    x = clustered(1500, 12, 12)
    seq = torch.arange(1500) // 7
    expected = knn(x, None, 25, distance=distance, sequence_ids=seq, search_precision="float32", backend="torch")
    one_pass = knn(x, None, 25, distance=distance, sequence_ids=seq, search_precision="bfloat16", backend="torch")
    assert _same(one_pass, expected)
    monkeypatch.setattr(plan, "_forced", True)
    monkeypatch.setattr(plan, "SYMMETRIC_BUFFER_BYTES", 0)
    monkeypatch.setattr(plan, "GROUP_ROWS", 256)
    monkeypatch.setattr(plan, "SPILL_BYTES", 2**18)
    swept = knn(x, None, 25, distance=distance, sequence_ids=seq, search_precision="bfloat16", backend="torch")
    assert _same(swept, expected)


def test_large_sets_read_float64_rows_on_demand_with_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``plan.FLOAT64_COPY_BYTES`` the search keeps no float64 copy of the set (the canonical stage upcasts
    the candidates' rows only): the values are those of the copy, in either precision."""
    x = clustered(300, 16, 11)
    labels = torch.arange(300) // 20
    options = {"map_at_r": True, "mrr": True, "cmc_top_k": (1, 5)}
    expected = retrieval_metrics(x, labels, search_precision="float32", **options)  # type: ignore[arg-type]
    monkeypatch.setattr(plan, "FLOAT64_COPY_BYTES", 0)
    assert plan.lazy_float64(x)
    for precision in ("float32", "bfloat16"):
        found = retrieval_metrics(x, labels, search_precision=precision, **options)  # type: ignore[arg-type]
        assert all(torch.equal(found[key], expected[key]) for key in expected)


def test_cross_modal_values_identical_for_every_precision() -> None:
    """The bipartite search of the two sides (one symmetric pass over the rectangle between them)."""
    images = clustered(200, 24, 13)
    captions = images.repeat_interleave(2, 0) + 0.3 * torch.randn(400, 24, generator=torch.Generator().manual_seed(1))
    found = []
    for precision in PRECISIONS:
        metric = CrossModalRetrieval(search_precision=precision, map_at_r=True)  # type: ignore[arg-type]
        metric.update(images, torch.arange(200), captions, torch.arange(400) // 2)
        found.append(metric.compute())
    assert all(torch.equal(found[0][key], other[key]) for other in found[1:] for key in found[0])


def test_command_line_values_identical_for_every_precision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchmetrics_retrieval.cli import main

    x = clustered(300, 16, 14)
    torch.save(x, tmp_path / "x.pt")
    torch.save(torch.arange(300) // 20, tmp_path / "y.pt")
    printed = []
    for precision in PRECISIONS:
        args = ["evaluate", str(tmp_path / "x.pt"), str(tmp_path / "y.pt"), "--json", "--search-precision", precision]
        assert main(args) == 0
        printed.append(json.loads(capsys.readouterr().out))
    assert printed[0] == printed[1] == printed[2]


# ---- the bound ----------------------------------------------------------------------------------------------------


def _exact_keys(q: Tensor, g: Tensor, distance: str) -> Tensor:
    q64, g64 = q.double(), g.double()
    if distance == "cosine":
        q64, g64 = q64 / q64.norm(dim=1, keepdim=True), g64 / g64.norm(dim=1, keepdim=True)
    dots = q64 @ g64.T
    if distance in ("euclidean", "sqeuclidean"):
        return (g64 * g64).sum(dim=1)[None] - 2.0 * dots
    return -dots


@pytest.mark.parametrize("distance", ["euclidean", "dot", "cosine"])
@pytest.mark.parametrize("scale", [1.0, 1e6, 1e-6])
def test_bound_holds_over_millions_of_random_pairs(distance: str, scale: float) -> None:
    """The bfloat16 keys of 2M pairs (rows of mixed norms, heavy-tailed entries) stay within the certified bound:
    ``(1 + 2**-6)`` times the float32 bound plus :func:`low_precision.extra_tolerance`, without its margin."""
    g = torch.Generator().manual_seed(7)
    dim = 96
    q = torch.randn(1000, dim, generator=g) ** 3 * scale * torch.rand(1000, 1, generator=g) * 10
    x = torch.randn(2000, dim, generator=g) ** 3 * scale * torch.rand(2000, 1, generator=g) * 10
    problem = make_problem(q, x, distance, Exclusions(None, None, None), False)
    low_q = low_precision.round_rows(problem.query64, problem.query_sq64, distance)
    low_g = low_precision.round_rows(problem.gallery64, problem.gallery_sq64, distance)
    l2 = distance in ("euclidean", "sqeuclidean")
    bias = problem.gallery_sq64.float() if l2 else torch.zeros(2000)
    keys = low_precision.BFloat16Keys(low_q.rows, low_g.rows, bias, -2.0 if l2 else -1.0)(slice(None), slice(None))
    error = (keys.double() - _exact_keys(q, x, distance)).abs().amax(dim=1)
    # the bound without its safety margin, which must hold on its own
    extra = low_precision.extra_tolerance(low_q.error, low_q.rounded_norm, low_g, distance) / plan.TOLERANCE_FACTOR
    rounding = rounding_terms(dim)
    float32_part = certify.key_tolerance(problem, slice(None), rounding) / plan.TOLERANCE_FACTOR
    bound = float32_part * (1.0 + 2.0**-6) + extra
    assert bool((error <= bound).all())
    assert float((error / bound).max()) > 1e-3  # the bound is not vacuous: the errors are of its order
    # and what the certificate uses is that bound with its margin
    slots, full = torch.zeros(1000, 1, dtype=torch.long), torch.ones(1000, 1, dtype=torch.bool)
    extra_with_margin = low_precision.extra_tolerance(low_q.error, low_q.rounded_norm, low_g, distance)
    candidates = Candidates(slots, full, torch.zeros(1000), torch.zeros(1000, 1), rounding, extra_with_margin)
    assert bool((certify.candidate_tolerance(problem, slice(None), candidates) >= bound).all())


def test_bfloat16_products_accumulate_in_float32() -> None:
    """The bound assumes float32 accumulation: ``1 + 4095 ones`` in bfloat16 accumulation would stop at 256."""
    a = torch.ones(1, 4096, dtype=torch.bfloat16)
    a[0, 0] = 256
    with low_precision.float32_accumulation():
        total = float(low_precision.bf16_products(a, torch.ones(1, 4096, dtype=torch.bfloat16)))
    assert abs(total - (256 + 4095)) <= 2.0**-8 * (256 + 4095)  # one bfloat16 rounding of the float32 sum


def test_row_errors_are_exact() -> None:
    x = torch.tensor([[1.0 + 2.0**-9 + 2.0**-12, 3.0], [2.0**-20, 1.0]])
    rows = low_precision.round_rows(x.double(), (x.double() ** 2).sum(dim=1), "dot")
    expected = (x.double() - x.bfloat16().double()).norm(dim=1)
    assert torch.equal(rows.error, expected)
    assert rows.rows.dtype == torch.bfloat16


# ---- fallback and auto -------------------------------------------------------------------------------------------


def test_too_wide_a_bound_falls_back_to_float32() -> None:
    """Coarse data in D = 2 with masses of near ties: the bfloat16 bound decides too few queries, so the search
    continues in float32 after its first round; the answer is still the exact one."""
    g = torch.Generator().manual_seed(8)
    x = torch.randint(0, 200, (3000, 2), generator=g).float() * (1.0 + 2.0**-10) + 1000.0
    before = dict(low_precision.counters)
    low = knn(x, None, 5, search_precision="bfloat16", backend="torch")
    assert low_precision.counters["fallbacks"] == before["fallbacks"] + 1
    undecided = low_precision.counters["first_round_undecided"] - before["first_round_undecided"]
    assert undecided > plan.BF16_FALLBACK_SHARE * 3000
    assert _same(low, knn(x, None, 5, search_precision="float32", backend="torch"))


def test_a_well_decided_search_does_not_fall_back() -> None:
    x = clustered(2000, 64, 9)
    before = dict(low_precision.counters)
    knn(x, None, 5, search_precision="bfloat16", backend="torch")
    assert low_precision.counters["fallbacks"] == before["fallbacks"]
    assert low_precision.counters["bfloat16_searches"] == before["bfloat16_searches"] + 1


def test_auto_chooses_by_flags_and_measured_speed() -> None:
    cpu = torch.device("cpu")
    assert low_precision.auto_precision(cpu, flags=frozenset({"avx2", "avx512f"})) == "float32"
    fast = low_precision.auto_precision(cpu, flags=frozenset({"amx_bf16"}), speedup=2.5)
    assert fast == "bfloat16"
    assert low_precision.auto_precision(cpu, flags=frozenset({"avx512_bf16"}), speedup=1.2) == "float32"
    assert low_precision.auto_precision(torch.device("meta")) == "float32"


def test_auto_on_this_machine_follows_its_flags() -> None:
    has_units = bool(low_precision.BF16_CPU_FLAGS & low_precision.cpu_flags())
    if not has_units:  # bfloat16 emulated: never taken, and never probed
        assert low_precision.resolve("auto", torch.device("cpu")) == "float32"
    assert low_precision.resolve("bfloat16", torch.device("cpu")) == "bfloat16"


def test_faiss_backend_stays_float32() -> None:
    x = clustered(200, 8, 10)
    before = low_precision.counters["bfloat16_searches"]
    a = knn(x, None, 3, backend="faiss", search_precision="bfloat16")
    assert low_precision.counters["bfloat16_searches"] == before
    assert _same(a, knn(x, None, 3, backend="faiss", search_precision="float32"))
