"""The compiled kernels are chosen once for a whole search, not for each group of its queries: a last group
smaller than the size threshold must not fall back to the torch passes (same values, many times slower)."""

from __future__ import annotations

import pytest
import torch

import torchmetrics_retrieval.functional as F
from tests.functional.conftest import KernelCalls
from torchmetrics_retrieval.functional._ranks import count as _full_ranking
from torchmetrics_retrieval.functional._ranks import plan as ranks_plan
from torchmetrics_retrieval.functional._search import plan, stream_topk


def test_every_chunk_of_the_full_ranking_count_takes_the_kernels(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(90, 4, generator=g), torch.randint(0, 5, (90,), generator=g)
    monkeypatch.setattr(ranks_plan, "BUDGET_ENTRIES", 200)  # chunks of a few queries, the last one smaller
    monkeypatch.setattr(plan, "MIN_PAIRS", 90 * 90)  # the whole count is large enough, no chunk of it is
    chosen: list[bool] = []
    original = _full_ranking._Counter.__init__

    def spy(self: _full_ranking._Counter, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        chosen.append(self.compiled)

    monkeypatch.setattr(_full_ranking._Counter, "__init__", spy)
    with kernel_calls.expect(True, "ranks.count_rows"):
        F.retrieval_metrics(x, labels, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), map_full=True)
    assert len(chosen) > 2 and all(chosen)
    # and the kernels ran: every chunk's counter built its table and counted its rows with them
    assert kernel_calls.total("ranks.build_table") == len(chosen)
    assert kernel_calls.total("ranks.count_rows") >= len(chosen)


def test_every_group_of_a_one_sided_search_takes_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(1)
    query, gallery = torch.randn(70, 4, generator=g), torch.randn(200, 4, generator=g)
    monkeypatch.setattr(plan, "ROUND_PAIRS", 150)  # groups of 21 queries, the last one smaller
    monkeypatch.setattr(plan, "MIN_PAIRS", 70 * 200)
    chosen: list[bool | None] = []
    original = stream_topk._new_buffer

    def spy(kp: int, tau: torch.Tensor, n_gallery: int, compiled: bool | None = None) -> object:
        buffer = original(kp, tau, n_gallery, compiled)
        chosen.append(type(buffer).__name__ == "CompiledBuffer")
        return buffer

    monkeypatch.setattr(stream_topk, "_new_buffer", spy)
    F.knn(query, gallery, k=5, backend="torch")
    assert len(chosen) > 2 and all(chosen)


@pytest.mark.skipif(not plan.HAS_NUMBA, reason="the compiled kernels need numba")
def test_a_share_of_a_large_search_takes_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "MIN_PAIRS", 100 * 100)
    cpu = torch.device("cpu")
    assert not plan.use_compiled(cpu, 10, 10)
    with plan.part_of(100, 100):  # e.g. one shard's searches of a sharded search over 100 samples
        assert plan.use_compiled(cpu, 10, 10)
        with plan.force_compiled(False):  # the tests' switch still decides
            assert not plan.use_compiled(cpu, 10, 10)
        assert not plan.use_compiled(torch.device("meta"), 10, 10)  # CPU only
    assert not plan.use_compiled(cpu, 10, 10)
