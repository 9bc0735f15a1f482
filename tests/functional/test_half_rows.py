"""A set stored in half precision is searched without a float32 copy of it (``_search.half_rows``): its stage rows
are made block by block with the values of the whole copy, the search's answer and its stage-1 candidates are those
of the same rows converted to float32 up front, bit for bit, and no float32 or float64 tensor of the whole set's
rows is ever made."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torchmetrics_retrieval import EmbeddingMetrics
from torchmetrics_retrieval.functional._search import keys, plan
from torchmetrics_retrieval.functional._search.faiss_stage import FaissStage
from torchmetrics_retrieval.functional._search.half_rows import BlockRows
from torchmetrics_retrieval.functional._search.keys import Float64Rows, self_dots, stage_rows
from torchmetrics_retrieval.functional._search.problem import Problem, make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.torch_stage import TorchStage
from torchmetrics_retrieval.functional._search.types import Exclusions

DISTANCES = ["euclidean", "sqeuclidean", "cosine", "dot"]
HALF = [torch.float16, torch.bfloat16]
COMPILED = [True, False] if plan.HAS_NUMBA else [False]
#: ``(setup, compiled)``: the symmetric sweep runs on the compiled kernels only.
SETUPS = [(s, c) for s in ("leave-one-out", "query/gallery", "sweep") for c in COMPILED if s != "sweep" or c]
N, DIM, K = 1500, 24, 9


def tied_rows(n: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Half rows with exact ties and duplicates: small integers (many equal distances), repeated rows, and
    Gaussian rows of mixed norms; no zero row (cosine)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    x[::3] = torch.randint(-2, 3, (x[::3].shape[0], dim), generator=g).float()
    x[1::7] = x[0]  # duplicates
    x[5::11] = x[3]
    x = x.to(dtype)
    x[(x == 0).all(dim=1), 0] = 1.0
    return x


def problem_of(x: torch.Tensor, distance: str, setup: str) -> Problem:
    """Leave-one-out (the set against itself, excluding each row) or the first 400 rows against the rest."""
    none = Exclusions(None, None, None)
    if setup == "query/gallery":
        return make_problem(x[:400], x[400:], distance, none, False, lazy64=True)
    own = Exclusions(torch.arange(x.shape[0]), None, None)
    return make_problem(x, x, distance, own, True, lazy64=True)


@contextmanager
def small_blocks(monkeypatch: pytest.MonkeyPatch, sweep: bool, compiled: bool) -> Iterator[None]:
    """Stage-1 blocks much smaller than the set, query groups smaller than the queries (and, with ``sweep``, the
    symmetric buffer forced not to fit)."""
    with monkeypatch.context() as patch:
        patch.setattr(plan, "STAGE1_ROWS", 64)
        patch.setattr(plan, "STAGE1_COLUMNS", 256)
        patch.setattr(plan, "HALF_QUERY_CHUNKS", 3)  # groups of 192 query rows (the last one shorter)
        patch.setattr(plan, "_forced", compiled)
        if sweep:
            patch.setattr(plan, "SYMMETRIC_BUFFER_BYTES", 0)
            patch.setattr(plan, "GROUP_ROWS", 256)
            patch.setattr(plan, "SPILL_BYTES", 2**16)
        yield


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("compiled", COMPILED)
def test_block_rows_equal_the_whole_copy(dtype: torch.dtype, distance: str, compiled: bool) -> None:
    """Any block (a slice, positions, a subset's block, a strided destination) holds the rows of the whole
    float32 copy that ``stage_rows`` makes, bit for bit."""
    x = tied_rows(700, DIM, dtype, seed=1)
    x64 = Float64Rows(x)
    sq64 = self_dots(x64)
    whole = stage_rows(x64, sq64, distance, compiled)[0]
    rows = BlockRows(x64, sq64, distance, compiled)
    assert rows.shape == whole.shape
    positions = torch.randperm(700, generator=torch.Generator().manual_seed(2))[:300]
    subset = rows.take(positions)
    cases = [  # (each block is valid until the next one of its rows: checked in turn)
        (rows, slice(0, 256), whole[0:256]),
        (rows, slice(512, 700), whole[512:700]),
        (rows, slice(512, 700), whole[512:700]),  # the same slice again (from the buffer)
        (rows, slice(600, 650), whole[600:650]),  # within the last slice (a view of the buffer)
        (rows, slice(0, 100), whole[0:100]),
        (rows, positions, whole[positions]),
        (subset, slice(10, 200), whole[positions[10:200]]),
        (subset, torch.tensor([3, 3, 0]), whole[positions[[3, 3, 0]]]),
    ]
    for source, index, want in cases:
        assert torch.equal(source[index].view(torch.int32), want.view(torch.int32))
    if distance != "cosine":  # (written into the columns of a wider block, as the symmetric L2 keys do)
        wide = torch.zeros(100, DIM + 2)
        rows.write(slice(100, 200), wide[:, :DIM])
        assert torch.equal(wide[:, :DIM], whole[100:200])


def run(problem: Problem, k: int, sweep: bool) -> tuple[Any, ...]:
    """The search's answer and its stage-1 candidates of the first round (the whole query set)."""
    search = Search.prepare(problem, k, backend="torch", precision="float32")
    queries = torch.arange(problem.query.shape[0])
    result = search(queries)
    stage = TorchStage(problem, None)
    assert isinstance(search.stage, TorchStage)
    found = stage(queries, search.kp, True)
    assert (stage._sweep is not None) == sweep
    return (*result, found.indices, found.ok, found.floor, found.keys)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize(("setup", "compiled"), SETUPS)
def test_half_storage_search_equals_float32_rows_up_front(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, distance: str, setup: str, compiled: bool
) -> None:
    """Half rows made float32 per block against the same rows converted to float32 before the search: the same
    neighbours, distances and validity, and the same stage-1 candidates, keys and floors."""
    x = tied_rows(N, DIM, dtype, seed=3)
    with small_blocks(monkeypatch, setup == "sweep", compiled):
        half = problem_of(x, distance, setup)
        assert isinstance(half.query64, Float64Rows) and half.query64.x.dtype == dtype
        got = run(half._replace(dtype=torch.float32), K, setup == "sweep")
        want = run(problem_of(x.to(torch.float32), distance, setup), K, setup == "sweep")
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


class LargestRows(TorchDispatchMode):
    """Records the most rows of any float32 or float64 tensor of ``dim`` or ``dim + 2`` columns an operation
    makes (a float32 copy of the set's stage rows, the symmetric rows ``[x, h, 1]``, a float64 copy)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim, self.largest = dim, {torch.float32: 0, torch.float64: 0}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.dtype in self.largest and value.dim() == 2:
                if value.shape[1] in (self.dim, self.dim + 2):
                    self.largest[value.dtype] = max(self.largest[value.dtype], value.shape[0])
        return out


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize(("setup", "compiled"), SETUPS)
def test_no_float32_or_float64_copy_of_a_half_set(
    monkeypatch: pytest.MonkeyPatch, distance: str, setup: str, compiled: bool
) -> None:
    """From the problem to the answer, no tensor of float32 or float64 rows is larger than a block of 256 rows
    (the set has 1500): stage 1 makes its rows per block, the norms and the canonical stage read float64 rows per
    block. (Before, ``stage_rows`` made a float32 copy of the whole set, and the symmetric keys an ``(N, D + 2)``
    one.) Gaussian rows: the canonical stage also gathers the float64 rows of its near-duplicate candidate pairs
    (``certify``), and the gallery sample of a round's first thresholds, which grows with the candidates per
    query; both stay far below a block here, as they do when few queries need later rounds."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(N, DIM, generator=g) * torch.exp(torch.randn(N, 1, generator=g))).to(torch.float16)
    monkeypatch.setattr(keys, "_LAZY_PAIRS", 128)  # the rows the canonical stage and the norms gather at once
    with small_blocks(monkeypatch, setup == "sweep", compiled), LargestRows(DIM) as seen:
        problem = problem_of(x, distance, setup)
        Search.prepare(problem, K, precision="float32")(torch.arange(problem.query.shape[0]))
    assert 0 < seen.largest[torch.float32] <= 256, seen.largest
    assert seen.largest[torch.float64] <= 256, seen.largest


def test_half_storage_takes_the_torch_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """``backend="auto"`` takes the torch stage for half rows where float32 rows would take faiss (which needs a
    float32 index, a copy of the set)."""
    monkeypatch.setattr(plan, "_forced", True)
    x = tied_rows(N, DIM, torch.float16, seed=5)
    none = Exclusions(None, None, None)
    for rows, stage in [(x, TorchStage), (x.to(torch.float32), FaissStage)]:
        problem = make_problem(rows[:400], rows[400:], "euclidean", none, False)
        assert isinstance(Search.prepare(problem, K, precision="float32").stage, stage)


@pytest.mark.parametrize("dtype", HALF)
def test_embedding_metrics_half_storage_equal_float32_rows(dtype: torch.dtype) -> None:
    """The metrics of a set stored in half precision equal those of its rows given in float32."""
    x = tied_rows(N, DIM, dtype, seed=6)
    labels = torch.arange(N) // 20
    values = []
    for storage, rows in [(dtype, x.to(torch.float32)), (None, x.to(torch.float32))]:
        metric = EmbeddingMetrics(storage_dtype=storage, map_at_r=True, cmc_top_k=(1, 5))
        metric.update(rows, labels)
        values.append(metric.compute())
    assert values[0].keys() == values[1].keys()
    assert all(torch.equal(values[0][key], values[1][key]) for key in values[0])


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("setup", ["leave-one-out", "query/gallery"])
def test_half_storage_bfloat16_pass_equals_float32(monkeypatch: pytest.MonkeyPatch, distance: str, setup: str) -> None:
    """The bfloat16 candidate pass over half rows (query groups rounded per block) gives the float32 answer."""
    x = tied_rows(N, DIM, torch.float16, seed=7)
    with small_blocks(monkeypatch, False, True):
        problem = problem_of(x, distance, setup)
        queries = torch.arange(problem.query.shape[0])
        want = Search.prepare(problem, K, backend="torch", precision="float32")(queries)
        got = Search.prepare(problem, K, backend="torch", precision="bfloat16")(queries)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_side_taking_every_sample_is_the_stored_set_itself() -> None:
    """A few queries against the whole set: the gallery is the stored rows, not a copy of them."""
    from torchmetrics_retrieval.functional._sets import _split_one_set

    x = tied_rows(100, DIM, torch.float16, seed=8)
    labels = torch.arange(100) // 5
    is_query = torch.arange(100) < 10
    qg = _split_one_set(x, labels, is_query, None, None, None, None)
    assert qg.gallery is x and qg.gallery_labels is labels and torch.equal(qg.query, x[:10])
    assert torch.equal(qg.self_index, torch.arange(10)) and not qg.same_set


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("setup", ["leave-one-out", "query/gallery"])
def test_key_blocks_of_half_rows_equal_float32_rows_without_a_copy(distance: str, setup: str) -> None:
    """The key blocks of the passes over every pair (full-ranking counts, pair histograms) from half rows made
    per block: the keys of the rows converted up front, bit for bit, and no float32 tensor of more than a tile."""
    from torchmetrics_retrieval.functional._search.key_blocks import key_blocks

    x = tied_rows(N, DIM, torch.float16, seed=9)
    half, full = problem_of(x, distance, setup), problem_of(x.to(torch.float32), distance, setup)
    rows, symmetric = torch.arange(half.query.shape[0]), setup == "leave-one-out"
    with LargestRows(DIM) as seen:
        got = [(block.rows, block.cols, block.keys.clone()) for block in key_blocks(half, rows, 300, symmetric)]
    want = [(block.rows, block.cols, block.keys.clone()) for block in key_blocks(full, rows, 300, symmetric)]
    assert len(got) == len(want) > 4
    for (rows_a, cols_a, keys_a), (rows_b, cols_b, keys_b) in zip(got, want, strict=True):
        assert rows_a == rows_b and cols_a == cols_b and torch.equal(keys_a, keys_b)
    assert 0 < seen.largest[torch.float32] <= 300, seen.largest
