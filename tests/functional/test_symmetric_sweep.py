"""The group-by-group symmetric search (stage 1 of knn for large leave-one-out searches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.functional import search as search_module
from torchmetrics_retrieval.functional._search import plan, torch_stage
from torchmetrics_retrieval.functional._search.compiled.buffer import load_kernels
from torchmetrics_retrieval.functional._search.stream_topk import product_keys
from torchmetrics_retrieval.functional._search.symmetric_sweep import SymmetricSweep, window_groups
from torchmetrics_retrieval.functional.search import knn


def integer_rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Small integer points (exact keys, many ties, 40 copies of one point) and their symmetric key rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, (n, 4), generator=g).float()
    x[100:140] = x[7]
    half_sq, ones = (x * x).sum(dim=1, keepdim=True) / 2, torch.ones(n, 1)
    return x, torch.cat([x, half_sq, ones], dim=1), torch.cat([-x, ones, half_sq], dim=1)


def mask_self(keys: torch.Tensor, rows: slice, cols: slice | torch.Tensor) -> None:
    positions = torch.arange(rows.start, rows.stop)[:, None]
    columns = cols[None, :] if isinstance(cols, torch.Tensor) else torch.arange(cols.start, cols.stop)[None, :]
    keys.masked_fill_(positions == columns, float("inf"))


class Recorder(SymmetricSweep):
    """The sweep, recording the ranges taken, the spills kept and dropped and the largest spill."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.taken: list[tuple[int, int]] = []
        self.kept = self.dropped = self.largest = 0

    def take(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        self.taken.append((start, stop))
        return super().take(start, stop)

    def _scan_spill(self, *args: object) -> tuple[object, int]:
        spill, count = super()._scan_spill(*args)  # type: ignore[arg-type]
        self.dropped += spill is None
        return spill, count

    def _keep_spill(self, *args: object) -> None:
        super()._keep_spill(*args)  # type: ignore[arg-type]
        self.largest = max(self.largest, self.spilled_bytes)
        self.kept += 1


@pytest.mark.parametrize(
    ("group_rows", "spill_bytes", "ranges", "spills"),
    [
        (256, 2**22, [(0, 700), (700, 701), (701, 3000)], "kept"),  # every later group in the window
        (300, 60_000, [(0, 3000)], "some dropped"),  # a window of 5 groups, over budget at times
        (512, 20_000, [(0, 1000), (1000, 3000)], "dropped"),  # every spill outgrows the budget
        (256, 0, [(0, 3000)], "none"),  # no window
    ],
)
def test_candidates_are_the_best_keys_below_each_floor(
    group_rows: int, spill_bytes: int, ranges: list[tuple[int, int]], spills: str
) -> None:
    _, left, right = integer_rows(3000, seed=1)
    kp = 9
    sweep = Recorder(
        product_keys(left, right),
        3000,
        kp,
        mask_self,
        rows_per_chunk=128,
        cols_per_block=384,
        spill_bytes=spill_bytes,
        group_rows=group_rows,
    )
    parts = [sweep.take(start, stop) for start, stop in ranges]
    keys, items, floor = (torch.cat([part[i] for part in parts if part is not None]) for i in range(3))
    assert keys.shape == (3000, kp)
    full = left @ right.T
    full.fill_diagonal_(float("inf"))
    found = keys < float("inf")
    assert torch.equal(full.gather(1, items)[found], keys[found])  # real pairs with their keys
    candidate = torch.zeros(full.shape, dtype=torch.int32).scatter_add_(1, items, found.int()) > 0
    assert bool((torch.where(candidate, float("inf"), full) >= floor[:, None]).all())  # nothing else is below
    below = (full < floor[:, None]).sum(dim=1)
    assert bool(((below <= kp) & (found.sum(dim=1) >= below)).all())
    complete = found.all(dim=1)  # a full row holds the kp smallest keys
    assert torch.equal(keys[complete], full[complete].sort(dim=1).values[:, :kp])
    assert int(complete.sum()) > 2900
    assert sweep.largest <= spill_bytes
    assert (sweep.kept > 0) == (spills in ("kept", "some dropped"))
    assert (sweep.dropped > 0) == (spills in ("some dropped", "dropped"))


@pytest.mark.parametrize(("group_rows", "spill_bytes"), [(256, 2**22), (300, 60_000), (512, 20_000)])
def test_the_spill_scans_give_the_same_candidates_on_any_number_of_threads(group_rows: int, spill_bytes: int) -> None:
    # Many exact ties: a spill listed in another order, or cut at another row, would change which tied keys
    # a full buffer keeps. More than one thread takes the counted, row-parallel scan; one thread the plain one.
    _, left, right = integer_rows(3000, seed=4)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            sweep = Recorder(
                product_keys(left, right), 3000, 9, mask_self, rows_per_chunk=128, cols_per_block=384,
                spill_bytes=spill_bytes, group_rows=group_rows,
            )  # fmt: skip
            results.append((sweep.take(0, 3000), sweep.kept, sweep.dropped))
    finally:
        torch.set_num_threads(before)
    (first, kept, dropped), *others = results
    assert kept + dropped > 0  # the spill scans ran
    for result, other_kept, other_dropped in others:
        assert result is not None and first is not None
        assert all(torch.equal(a, b) for a, b in zip(first, result, strict=True))
        assert (other_kept, other_dropped) == (kept, dropped)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_spilled_entries_are_grouped_by_query_in_their_listed_order(n_threads: int) -> None:
    rng = np.random.default_rng(5)
    count, base, n_targets = 1000, 700, 50  # the lists hold more slots than entries
    targets = np.concatenate([rng.integers(base, base + n_targets, count), np.zeros(24)]).astype(np.int32)
    sources = rng.integers(0, 10**6, count + 24).astype(np.int32)
    values = rng.random(count + 24).astype(np.float32)
    offsets, items, keys = load_kernels().group_spill((targets, sources, values), count, base, n_targets, n_threads)
    order = np.argsort(targets[:count], kind="stable")  # by query, each query's entries in listed order
    assert np.array_equal(offsets, np.searchsorted(targets[:count][order], np.arange(base, base + n_targets + 1)))
    assert np.array_equal(items, sources[:count][order]) and np.array_equal(keys, values[:count][order])


def test_only_the_next_rows_can_be_taken() -> None:
    _, left, right = integer_rows(1000, seed=2)
    sweep = SymmetricSweep(
        product_keys(left, right), 1000, 5, mask_self, rows_per_chunk=128, cols_per_block=256, group_rows=256
    )
    assert sweep.take(10, 20) is None
    assert sweep.take(0, 300) is not None
    assert sweep.take(0, 10) is None and sweep.take(301, 400) is None and sweep.take(300, 1001) is None
    assert sweep.take(300, 1000) is not None


def test_window_grows_with_the_budget() -> None:
    assert window_groups(100_000, 1030, 0) == 0
    small, large = window_groups(100_000, 1030, 2**26), window_groups(100_000, 1030, 2**28)
    assert 0 < small < large  # a 4x budget doubles the window (spill ~ window^2)
    assert abs(large / small - 2) < 0.2


@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_knn_through_the_sweep_matches_faiss(monkeypatch: pytest.MonkeyPatch, distance: str) -> None:
    # Leave-one-out with sequence ids and 60 duplicates, the symmetric buffer forced not to fit: knn takes
    # the sweep for its first round (and its plain search for the queries it leaves uncertified).
    monkeypatch.setattr(plan, "_forced", True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2500, 12, generator=g)
    x[200:260] = x[5]
    seq = torch.randint(0, 800, (2500,), generator=g)
    expected = knn(x, None, 30, distance=distance, sequence_ids=seq, backend="faiss")
    monkeypatch.setattr(plan, "SYMMETRIC_BUFFER_BYTES", 0)
    monkeypatch.setattr(torch_stage, "SymmetricSweep", Recorder)
    monkeypatch.setattr(plan, "GROUP_ROWS", 300)
    monkeypatch.setattr(plan, "SPILL_BYTES", 2**18)
    for exact in (True, False):
        stage = search_module._checked_search(x, None, 30, distance, None, seq, None, "torch", None, exact)
        found = stage(torch.arange(2500))
        assert torch.equal(found.indices, expected.indices)
        if exact:  # (else the distances of candidates without a near tie come from the stage's float32 keys)
            assert torch.equal(found.distances, expected.distances)
        assert torch.allclose(found.distances, expected.distances, rtol=1e-5, atol=1e-5)
        sweep = stage.stage._sweep
        assert sweep.kept > 0 and sweep.taken[0][0] == 0 and sweep.taken[-1][1] == 2500  # it served every row


def test_knn_through_the_sweep_with_search_groups_and_rows_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Search groups (faiss cannot take them: the reference is the one-pass symmetric search). Rows asked for
    # out of order are not the sweep's next rows: they take the plain search, with the same answer.
    monkeypatch.setattr(plan, "_forced", True)
    g = torch.Generator().manual_seed(6)
    x = torch.randint(-3, 4, (2000, 5), generator=g).float()  # exact ties everywhere
    groups = torch.randint(0, 3, (2000,), generator=g)
    expected = knn(x, None, 25, search_groups=groups, backend="torch")
    monkeypatch.setattr(plan, "SYMMETRIC_BUFFER_BYTES", 0)
    monkeypatch.setattr(torch_stage, "SymmetricSweep", Recorder)
    monkeypatch.setattr(plan, "GROUP_ROWS", 256)
    search = search_module._checked_search(x, None, 25, "euclidean", None, None, groups, "torch", None, True)
    later, first = search(torch.arange(1200, 2000)), search(torch.arange(0, 1200))
    assert torch.equal(torch.cat([first.indices, later.indices]), expected.indices)
    assert torch.equal(torch.cat([first.distances, later.distances]), expected.distances)
    sweep = search.stage._sweep
    assert sweep.taken == [(1200, 2000), (0, 1200)] and sweep.position == 1200  # it served the second only
