"""``EmbeddingMetrics(storage_dtype=float16 | bfloat16)``: ``compute()`` reads the stored half-precision rows as
held, and every value equals that of the same rows given in float32, bit for bit, for every metric family; and no
float32 or float64 copy of the set's rows is made on the way."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from tests.functional.test_half_rows import LargestRows, small_blocks
from tests.metrics._helpers import ALL_RANKING
from torchmetrics_retrieval import CrossModalRetrieval, EmbeddingMetrics, FNMRAtFMR, QrelsMetrics, TrialMetrics
from torchmetrics_retrieval.functional._search import keys, plan

HALF = [torch.float16, torch.bfloat16]
DISTANCES = ["euclidean", "sqeuclidean", "cosine", "dot"]
COMPILED = [True, False] if plan.HAS_NUMBA else [False]
#: Every family: the kNN ranking, the full ranking, the pair metrics and ROC AUC, open-set identification, PCF.
EVERY_FAMILY: dict[str, Any] = {
    **ALL_RANKING,
    "fmr_vals": (1e-2, 0.1),
    "eer": True,
    "roc_auc": True,
    "min_dcf_p_target": 0.05,
    "fpir_vals": (0.1,),
    "pcf_variance": (0.5,),
}


def near_tied_rows(n: int, dim: int, dtype: torch.dtype, seed: int) -> Tensor:
    """Half rows whose distances float16 could not tell apart: Gaussian rows of mixed norms, each next to a
    near copy (one entry moved by one half-precision step), small-integer rows (exact ties) and duplicates."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g))).to(dtype)
    x[1::2] = x[0::2][: x[1::2].shape[0]]
    x[1::2, 0] = torch.nextafter(x[1::2, 0].float(), torch.tensor(float("inf"))).to(dtype)
    x[1::2, 0] = torch.where(x[1::2, 0] == x[0::2, 0][: x[1::2].shape[0]], x[1::2, 0] * 2, x[1::2, 0])
    x[::5] = torch.randint(-2, 3, (x[::5].shape[0], dim), generator=g).to(dtype)
    x[3::17] = x[2]
    x[(x == 0).all(dim=1), 0] = 1.0
    return x


def fields(n: int, setup: str, seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n // 12, (n,), generator=g)
    labels[:13] = torch.arange(n, n + 13)  # labels of their own: lone queries, non-mated probes (open-set)
    if setup == "leave-one-out":
        return {"labels": labels}
    return {
        "labels": labels,
        "is_query": torch.rand(n, generator=g) < 0.6,
        "is_gallery": torch.rand(n, generator=g) < 0.8,
        "sequence_ids": torch.randint(0, 40, (n,), generator=g),
    }


def values(rows: Tensor, extra: dict[str, Tensor], storage: torch.dtype | None, **options: Any) -> dict[str, Tensor]:
    metric = EmbeddingMetrics(storage_dtype=storage, **EVERY_FAMILY, **options)
    half = len(rows) // 2  # two batches: the stored list is concatenated
    metric.update(rows[:half], **{k: v[:half] for k, v in extra.items()})
    metric.update(rows[half:], **{k: v[half:] for k, v in extra.items()})
    result = metric.compute()
    assert metric.per_query is not None
    return {**result, "per_query_distances": metric.per_query.distances}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("setup", ["leave-one-out", "query/gallery"])
@pytest.mark.parametrize("compiled", COMPILED)
def test_half_storage_gives_the_values_of_float32_rows(
    dtype: torch.dtype, distance: str, setup: str, compiled: bool
) -> None:
    x = near_tied_rows(600, 12, dtype, seed=1)
    extra = fields(600, setup, seed=2)
    with plan.force_compiled(compiled):
        got = values(x, extra, dtype, distance=distance)
        want = values(x.to(torch.float32), extra, None, distance=distance)
    assert got.keys() == want.keys()
    for key in want:  # bit for bit (NaN where both are NaN)
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, equal_nan=True, msg=key)


@pytest.mark.parametrize("dtype", HALF)
def test_half_storage_normalized_gives_the_values_of_float32_rows(dtype: torch.dtype) -> None:
    """``normalize=True`` normalises the rows in float32 (from the same float32 rows)."""
    x = near_tied_rows(400, 8, dtype, seed=3)
    extra = fields(400, "query/gallery", seed=4)
    got = values(x, extra, dtype, normalize=True, distance="dot")
    want = values(x.to(torch.float32), extra, None, normalize=True, distance="dot")
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, equal_nan=True, msg=key)


def test_float16_distances_would_tie_what_float32_tells_apart() -> None:
    """The data above is a real test: rounding the distances to float16 (as the search of float16 rows reports
    them) ties pairs that differ in float32, so metrics over float16 distances would differ."""
    x = near_tied_rows(600, 12, torch.float16, seed=1).to(torch.float64)
    d = torch.cdist(x[:50], x)
    assert (d.to(torch.float16).unique().numel()) < (d.to(torch.float32).unique().numel())


@pytest.mark.parametrize("setup", ["leave-one-out", "query/gallery"])
def test_compute_makes_no_float32_copy_of_a_half_set(monkeypatch: pytest.MonkeyPatch, setup: str) -> None:
    """From ``compute()`` to the values, no tensor of float32 or float64 rows (D or D + 2 columns) is larger than
    a block (256 rows, of a 1,500-row set), with the ranking and full-ranking families. Gaussian rows: the
    canonical stage gathers the float64 rows of near-duplicate candidate pairs, few here."""
    n, dim = 1500, 24
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(n, dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g))).to(torch.float16)
    extra = fields(n, setup, seed=6)
    monkeypatch.setattr(keys, "_LAZY_PAIRS", 128)
    monkeypatch.setattr(plan, "KEY_TILE_ROWS", 256)  # the full-ranking count's key blocks
    monkeypatch.setattr(plan, "BLOCK_COLUMNS", 256)
    monkeypatch.setattr(plan, "SYMMETRIC_KEY_TILE", 256)
    metric = EmbeddingMetrics(storage_dtype=torch.float16, cmc_top_k=(1, 5), map_at_r=True, mrr=True, minp=True)
    metric.update(x, **extra)
    with small_blocks(monkeypatch, sweep=True, compiled=True), LargestRows(dim) as seen:
        metric.compute()
    assert 0 < seen.largest[torch.float32] <= 256, seen.largest
    assert seen.largest[torch.float64] <= 256, seen.largest


def same_values(make: Any, feed: Any) -> None:
    """A metric fed half-precision rows gives the values of the same rows fed in float32, bit for bit."""
    got, want = (feed(make(), convert).compute() for convert in (lambda t: t, lambda t: t.to(torch.float32)))
    if not isinstance(want, dict):
        got, want = {"value": got}, {"value": want}
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, equal_nan=True, msg=key)


def fed(metric: Any, *updates: dict[str, Any]) -> Any:
    for update in updates:
        metric.update(**update)
    return metric


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "dot"])
def test_every_class_reads_half_rows_with_float32_values(distance: str) -> None:
    """The pair metrics, the cross-modal ranking, trial lists and graded relevance (each of which held a float32
    copy of half rows before): half-precision input gives the values of the same rows in float32."""
    n = 500
    x, y = near_tied_rows(n, 12, torch.float16, seed=8), near_tied_rows(n, 12, torch.bfloat16, seed=9)
    g = torch.Generator().manual_seed(10)
    labels, ids = torch.randint(0, 40, (n,), generator=g), torch.arange(n)
    enrol, test = torch.randint(0, n, (2, 3000), generator=g)
    trials = (enrol, test, torch.rand(3000, generator=g) < 0.3)
    qrels = {str(q): {str(d): 1 + (q + d) % 3 for d in range(q % 7, n, 37)} for q in range(100)}
    same_values(
        lambda: FNMRAtFMR(distance=distance, fmr_vals=(0.01, 0.1), eer=True, roc_auc=True, min_dcf_p_target=0.05),
        lambda m, c: fed(m, {"embeddings": c(x), "labels": labels}),
    )
    same_values(
        lambda: CrossModalRetrieval(distance=distance, cmc_top_k=(1, 5), map_at_r=True, mrr=True, map_full=True),
        lambda m, c: fed(m, {"embeddings_a": c(x), "ids_a": labels}, {"embeddings_b": c(y), "ids_b": labels}),
    )
    same_values(
        lambda: TrialMetrics(trials, distance=distance, fmr_vals=0.1, eer=True, roc_auc=True, cllr=True),
        lambda m, c: fed(m, {"embeddings": c(x), "indexes": ids}),
    )
    same_values(
        lambda: QrelsMetrics(qrels, distance=distance, ndcg_top_k=10, map_top_k=10, mrr=True),
        lambda m, c: fed(m, {"corpus": c(y), "corpus_ids": ids}, {"query": c(x[:100]), "query_ids": ids[:100]}),
    )
