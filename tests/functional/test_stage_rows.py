"""The stage rows and canonical norms of the search engine, bit for bit, whichever way they are computed: the compiled
cosine rows (``compiled.row_kernels``) against torch's float64 formula on adversarial rows, the norms and canonical dot
products of rows read on demand block by block against the float64 copy, and a gallery cache shared by problems."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._search import keys, plan
from torchmetrics_retrieval.functional._search.keys import Float64Rows, canonical_dots, self_dots, stage_rows
from torchmetrics_retrieval.functional._search.problem import GalleryCache, make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def adversarial(n: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows of norms from 1e-30 to 1e17 (as far as the dtype holds them), zero-padded rows, duplicates, one-entry
    rows and rows whose quotients are float32 subnormals or ties of the float32 rounding; no zero row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    low, high = (1e-6, 1e3) if dtype == torch.float16 else (1e-30, 1e17)  # float16 holds no more
    x *= torch.exp(torch.randn(n, 1, generator=g, dtype=torch.float64) * 20).clamp(low, high)
    x[::4, dim // 2 :] = 0.0  # zero padding
    x[1::7] = x[0]  # duplicates
    x[2::9, 1:] = 0.0  # one entry: a unit row of +-1
    x[3::11] = 1e-40  # subnormal entries (float32, bfloat16), of quotients 1/sqrt(dim)
    x[5::13] = -1.0
    x[5::13, 0] = 1e-39  # an entry far below the norm: a subnormal float32 quotient
    x[6::17] = torch.randint(-3, 4, (x[6::17].shape[0], dim), generator=g).double()  # small integers: exact ties
    x = x.to(dtype)
    return x[(x.to(torch.float64) != 0).any(dim=1)]


def torch_formula(x64: torch.Tensor, sq64: torch.Tensor) -> torch.Tensor:
    """The float64 quotient of every entry rounded to float32, as torch computes it."""
    return (x64 / ieee_sqrt(sq64)[:, None]).to(torch.float32)


@pytest.mark.skipif(not plan.HAS_NUMBA, reason="the compiled kernel needs numba")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (9, 3), (300, 384), (257, 17)])
def test_compiled_cosine_rows_equal_the_float64_formula(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = adversarial(*shape, dtype, seed=shape[0])
    x64 = x.to(torch.float64)
    sq64 = self_dots(x64)
    want = torch_formula(x64, sq64)
    if dtype != torch.float16 and shape[0] > 5 and shape[1] > 1:  # the kernel meets subnormal quotients
        assert bool(((want != 0) & (want.abs() < torch.finfo(torch.float32).tiny)).any())
    sources = [x64] if dtype == torch.float64 else [Float64Rows(x), x64, Float64Rows(x.T.contiguous().T)]
    for source in sources:  # lazy rows of every dtype (also strided), and a float64 tensor
        for compiled in (True, False):
            got, norms = stage_rows(source, sq64, "cosine", compiled)
            assert norms is None
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (type(source), compiled)


@pytest.mark.skipif(not plan.HAS_NUMBA, reason="the compiled kernel needs numba")
def test_compiled_cosine_rows_round_quotients_next_to_halfway() -> None:
    """Quotients within a float64 step of halfway between two float32 values (float64 rows, norms given): there a
    kernel that multiplied by the reciprocal of the norm (or rounded twice otherwise) would round some the other
    way; the correctly rounded float64 quotient, rounded to float32, gives torch's values."""
    g = torch.Generator().manual_seed(9)
    odd = 2 * torch.randint(2**23, 2**24, (60, 32), generator=g, dtype=torch.float64) + 1  # 25 significant bits
    halfway = odd * torch.exp2(torch.randint(-60, 40, (60, 1), generator=g)).double()
    norms = torch.tensor([3.0, 5.0, 7.0, 11.0, 13.0, 1.0]).repeat(10).double()
    exact = halfway * norms[:, None]  # exactly: 28 significant bits at most
    side = torch.where(torch.arange(32) % 2 == 0, float("inf"), -float("inf")).expand_as(exact)
    x64 = torch.nextafter(exact, side)  # one float64 step above or below
    want = torch_formula(x64, norms * norms)
    assert not torch.equal((x64 * (1.0 / norms)[:, None]).to(torch.float32), want)  # the test can tell them apart
    got, _ = stage_rows(x64, norms * norms, "cosine", compiled=True)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.skipif(not plan.HAS_NUMBA, reason="the compiled kernel needs numba")
def test_compiled_cosine_rows_of_half_rows_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_STAGE_BLOCK_BYTES", 4 * 5 * 16)  # blocks of 5 rows of half entries made float32
    x = adversarial(123, 16, torch.bfloat16, seed=4)
    x64 = x.to(torch.float64)
    sq64 = self_dots(x64)
    got, _ = stage_rows(Float64Rows(x), sq64, "cosine", compiled=True)
    assert torch.equal(got.view(torch.int32), torch_formula(x64, sq64).view(torch.int32))


@pytest.mark.parametrize("dtype", DTYPES[:3])
def test_norms_and_dots_of_lazy_rows_in_blocks(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = adversarial(301, 24, dtype, seed=5), adversarial(203, 24, dtype, seed=6)
    x64, y64 = x.to(torch.float64), y.to(torch.float64)
    want = self_dots(x64)
    for block, compiled_from in ((7, 1), (300, 10**9), (301, 1), (2**13, 1)):  # blocks of 7 rows, 300 + 1, one
        monkeypatch.setattr(keys, "_LAZY_PAIRS", block)
        monkeypatch.setattr(keys, "_COMPILED_PAIRS", compiled_from)  # the compiled kernel, or torch
        assert torch.equal(self_dots(Float64Rows(x)), want), block
    g = torch.Generator().manual_seed(7)
    pairs = torch.randperm(x.shape[0] * y.shape[0], generator=g)[:3000]  # distinct pairs, as every caller's
    pair_rows, pair_cols = pairs // y.shape[0], pairs % y.shape[0]
    expected = canonical_dots(pair_rows, pair_cols, x64, y64)
    for pairs in (29, 4096):  # many blocks (rows and buffers reused across them), or one
        monkeypatch.setattr(keys, "_LAZY_PAIRS", pairs)
        assert torch.equal(canonical_dots(pair_rows, pair_cols, Float64Rows(x), Float64Rows(y)), expected)
        assert torch.equal(canonical_dots(pair_rows, pair_cols, Float64Rows(x), y64), expected)
        assert torch.equal(canonical_dots(pair_cols, pair_rows, y64, Float64Rows(x)), expected)


@pytest.mark.parametrize("distance", ["cosine", "euclidean", "dot"])
@pytest.mark.parametrize("keep_rows", [True, False])
def test_gallery_cache_serves_every_problem_of_the_gallery(
    distance: str, keep_rows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(8)
    query, gallery = torch.randn(40, 8, generator=g), torch.randn(150, 8, generator=g)
    gallery[10:20] = gallery[:10]  # exact ties
    none = Exclusions(None, None, None)
    cache = GalleryCache(keep_rows)
    calls: list[int] = []  # the rows of every stage_rows call
    original = keys.stage_rows

    def counting(x64: keys.Rows64, *args: object) -> object:
        calls.append(x64.shape[0])
        return original(x64, *args)  # type: ignore[arg-type]

    monkeypatch.setattr("torchmetrics_retrieval.functional._search.problem.stage_rows", counting)
    for rows in (torch.arange(40), torch.arange(25, 40), torch.tensor([3, 1, 4])):
        fresh = make_problem(query[rows], gallery, distance, none, False, lazy64=True)
        shared = make_problem(query[rows], gallery, distance, none, False, lazy64=True, gallery_cache=cache)
        assert cache.sq64 is shared.gallery_sq64 and torch.equal(shared.gallery_sq64, fresh.gallery_sq64)
        for got, want in zip(shared.stage_gallery(), fresh.stage_gallery(), strict=True):
            assert (got is None and want is None) or torch.equal(got, want)
        for exact in (True, False):
            found = Search.prepare(shared, 9, backend="torch", exact_distances=exact)(torch.arange(rows.numel()))
            expected = Search.prepare(fresh, 9, backend="torch", exact_distances=exact)(torch.arange(rows.numel()))
            for a, b in zip(found, expected, strict=True):
                assert torch.equal(a, b), (distance, exact)
    assert (cache.stage is not None) == keep_rows
    # per query set, the fresh problem stages its gallery three times (here and for each search), the shared one too
    # unless the cache keeps the rows: then once in all
    assert calls.count(gallery.shape[0]) == 3 * 3 + (1 if keep_rows else 3 * 3)
