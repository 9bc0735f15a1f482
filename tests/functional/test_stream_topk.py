"""The block scans of the torch stage-1 selection against a plain mask, for every branch they take."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.functional import knn
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.plan import SEGMENT, SIGMAS
from torchmetrics_retrieval.functional._search.stream_topk import (
    product_keys,
    sample_size,
    sample_thresholds,
    stream_topk,
    stream_topk_symmetric,
)
from torchmetrics_retrieval.functional._search.torch_buffer import _below_by_column, _below_by_row


def expected_by_row(keys: torch.Tensor, tau: torch.Tensor) -> tuple[list[int], list[int], list[float]]:
    r, c = torch.nonzero(keys < tau[:, None], as_tuple=True)  # row-major: sorted by row, then column
    return r.tolist(), c.tolist(), keys[r, c].tolist()


@pytest.mark.parametrize("share", [0.0, 0.002, 0.05, 0.5, 1.0])  # from no entry to every entry below tau
@pytest.mark.parametrize("shape", [(2 * SEGMENT, 3 * SEGMENT), (SEGMENT + 5, 2 * SEGMENT), (7, 13)])
def test_scans_find_exactly_the_entries_below_the_threshold(share: float, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    keys = torch.rand(shape, generator=g)
    tau_rows = torch.full((shape[0],), share) * torch.linspace(0.5, 1.5, shape[0])
    assert [t.tolist() for t in _below_by_row(keys, tau_rows)] == list(expected_by_row(keys, tau_rows))
    # by column: the entries below their column's threshold, sorted by column then row
    tau_cols = torch.full((shape[1],), share) * torch.linspace(0.5, 1.5, shape[1])
    c, r, v = _below_by_column(keys, tau_cols)
    assert (c.tolist(), r.tolist(), v.tolist()) == expected_by_row(keys.T, tau_cols)


def test_column_scan_on_a_non_contiguous_block() -> None:
    keys = torch.rand(3 * SEGMENT, 2 * SEGMENT, generator=torch.Generator().manual_seed(1))[:, ::2]
    tau = torch.full((SEGMENT,), 0.1)
    c, r, v = _below_by_column(keys, tau)
    assert (c.tolist(), r.tolist(), v.tolist()) == expected_by_row(keys.T, tau)


@pytest.mark.parametrize("estimate", [False, True])
def test_sample_thresholds_bound_the_sample_rank_and_flag_ties(estimate: bool) -> None:
    # Keys of 300 queries against a 20000-item gallery, sampled evenly (sample_size items). Without
    # an estimate the threshold is a proven bound: at least the kp-th smallest key over the whole gallery.
    # With it (rank m + 3 (sqrt(m) + 1) over group minima), it is at least that rank of the sample keys.
    g = torch.Generator().manual_seed(3)
    n_query, n_gallery, kp = 300, 20000, 50
    keys = torch.rand(n_query, n_gallery, generator=g)
    keys[:10] = 0.5  # all tied: far more than twice the rank of sample keys lie below the threshold

    def key_fn(rows: slice, cols: torch.Tensor) -> torch.Tensor:
        return keys[rows][:, cols].clone()

    tau, crowded = sample_thresholds(n_query, n_gallery, key_fn, kp, lambda *_: None, 64, estimate)
    n_sample = sample_size(n_gallery, kp)
    sample = torch.arange(n_sample) * n_gallery // n_sample
    expected = kp * n_sample / n_gallery
    rank = math.ceil(expected + SIGMAS * (math.sqrt(expected) + 1)) if estimate else kp
    assert bool((tau >= keys[:, sample].kthvalue(rank, dim=1).values).all())
    if not estimate:
        assert bool((tau >= keys.kthvalue(kp, dim=1).values).all())
    assert crowded.tolist() == [True] * 10 + [False] * (n_query - 10)


@pytest.mark.parametrize("estimate", [False, True])
def test_compiled_and_torch_buffers_keep_the_same_best_keys(monkeypatch: pytest.MonkeyPatch, estimate: bool) -> None:
    # Small integer coordinates: many tied keys, and kp = 7 makes the buffers compact again and again.
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-3, 4, (3000, 3), generator=g).float()
    half_sq, ones = (x * x).sum(dim=1, keepdim=True) / 2, torch.ones(3000, 1)
    left, right = torch.cat([x, half_sq, ones], dim=1), torch.cat([-x, ones, half_sq], dim=1)

    def mask(keys: torch.Tensor, rows: slice, cols: slice | torch.Tensor) -> None:
        positions = torch.arange(rows.start, rows.stop)[:, None]
        columns = cols[None, :] if isinstance(cols, torch.Tensor) else torch.arange(cols.start, cols.stop)[None, :]
        keys.masked_fill_(positions == columns, float("inf"))

    def run(compiled: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        monkeypatch.setattr(plan, "_forced", compiled)
        keys = product_keys(left, right)
        return stream_topk_symmetric(keys, 3000, 7, mask, rows_per_chunk=256, cols_per_block=512, estimate=estimate)

    (keys_c, items_c, floor_c), (keys_t, _, floor_t) = run(True), run(False)
    assert torch.equal(keys_c.sort(dim=1).values, keys_t.sort(dim=1).values)
    assert torch.equal(floor_c, floor_t)
    # the compiled candidates are real pairs with their keys, and no other item is below the floor
    full = left @ right.T
    full.fill_diagonal_(float("inf"))
    assert torch.equal(full.gather(1, items_c), keys_c)
    below = (full < floor_c[:, None]).sum(dim=1)
    assert bool((below <= 7).all())


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_no_item_left_out_lies_below_the_floor(monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    # 600 copies of one point: a block row of a copy has hundreds of entries below the (proven) first
    # threshold, more than a buffer row holds, so the buffer keeps the best of them. The ones it drops
    # must not be below the floor it reports (the torch buffer once kept its old threshold there).
    monkeypatch.setattr(plan, "_forced", compiled)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3000, 4, generator=g)
    x[:600] = x[0].clone()
    bias = (x * x).sum(dim=1)
    keys, items, floor = stream_topk(
        x, x, bias, -2.0, 7, lambda *_: None, rows_per_chunk=256, cols_per_block=1024, estimate=False
    )
    full = torch.addmm(bias[None, :], x, x.T, alpha=-2.0)
    left_out = full.scatter(1, items, float("inf"))
    assert bool((left_out >= floor[:, None]).all())
    assert torch.equal(full.gather(1, items), keys)


def test_compiled_kernels_serve_large_cpu_searches_only() -> None:
    cpu = torch.device("cpu")
    side = math.isqrt(plan.MIN_PAIRS)
    assert not plan.use_compiled(cpu, 1797, 1797)  # the demo: loading the kernels would cost more
    assert plan.use_compiled(cpu, side, side)
    assert not plan.use_compiled(torch.device("meta"), side, side)
    assert not plan.use_compiled(cpu, 1, 2**31)  # positions are stored as int32
    with plan.force_compiled(True):
        assert plan.use_compiled(cpu, 2, 2)
        assert not plan.use_compiled(torch.device("meta"), 2, 2)  # forcing never takes them off the CPU
    with plan.force_compiled(False):
        assert not plan.use_compiled(cpu, side, side)


def test_without_numba_the_torch_buffer_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "HAS_NUMBA", False)
    monkeypatch.setattr(plan, "MIN_PAIRS", 0)
    assert not plan.use_compiled(torch.device("cpu"), 10**5, 10**5)
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(7))
    result = knn(x, k=3, backend="torch", exact_distances=False)
    d = torch.cdist(x.double(), x.double()).fill_diagonal_(float("inf"))
    assert torch.equal(result.indices, torch.sort(d, dim=1, stable=True).indices[:, :3])


@pytest.mark.parametrize("n", [0, 1, 5, 21, 40, 64, 65, 300])
@pytest.mark.parametrize("kp", [1, 7, 21, 64])
def test_compiled_row_sorts_put_the_smallest_codes_first(n: int, kp: int) -> None:
    """The short-row insertion sort (whole or cut to the ``kp`` smallest) and the radix sort against Python's sort, on
    codes with repeats and with the high bits shared, as a row's keys share them."""
    pytest.importorskip("numba")
    from torchmetrics_retrieval.functional._search.compiled.kernels import radix_sort, smallest_by_insertion

    rng = np.random.default_rng(n * 100 + kp)
    codes = (np.int64(3) << 55) + rng.integers(0, 2**40, n) // rng.integers(1, 4, n) * 2**12
    codes[: n // 3] = codes[n // 3 : 2 * (n // 3)]  # repeated codes
    whole = codes.copy()
    radix_sort(whole, np.empty_like(whole), np.empty(256, np.int64))
    assert whole.tolist() == sorted(codes.tolist())
    front = codes.copy()
    smallest_by_insertion(front, kp)  # kp may exceed n: then the whole row is sorted
    kept = min(kp, n)
    assert front[:kept].tolist() == sorted(codes.tolist())[:kept]
