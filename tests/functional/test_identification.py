"""Open-set identification (``dir@fpir/{f}``, ``fnir@fpir/{f}``) against a brute-force numpy version written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchmetrics_retrieval.functional as F
from torchmetrics_retrieval.functional._search import plan

FPIRS = (0.0, 0.1, 0.3, 1.0)


def brute_dir(query: torch.Tensor, query_ids: torch.Tensor, gallery: torch.Tensor, gallery_ids: torch.Tensor):
    d = torch.cdist(query.double(), gallery.double()).numpy()
    nearest = np.argmin(d, axis=1)  # the first (lowest position) on a tie, as the package orders ties
    s = d[np.arange(d.shape[0]), nearest]
    mated = (query_ids[:, None] == gallery_ids[None, :]).numpy().any(axis=1)
    hit = (gallery_ids.numpy()[nearest] == query_ids.numpy()) & mated
    out = {}
    for f in FPIRS:
        t = np.quantile(s[~mated], f)  # numpy's default (linear) rule
        out[f"dir@fpir/{f}"] = float(np.sum(hit & (s < t)) / np.sum(mated))
        out[f"fnir@fpir/{f}"] = 1 - out[f"dir@fpir/{f}"]
    return out


def probes(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    gallery_ids = torch.arange(30).repeat(2)  # 30 enrolled identities, two images each
    centres = torch.randn(40, 8, generator=g)
    gallery = centres[gallery_ids] + 0.6 * torch.randn(60, 8, generator=g)
    query_ids = torch.randint(0, 40, (80,), generator=g)  # ids 30-39 are not enrolled: non-mated probes
    query = centres[query_ids] + 0.6 * torch.randn(80, 8, generator=g)
    return query.double(), query_ids, gallery.double(), gallery_ids


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled kernels", "torch passes"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_brute_force_version(seed: int, compiled: bool) -> None:
    query, query_ids, gallery, gallery_ids = probes(seed)
    with plan.force_compiled(compiled):
        got = F.retrieval_metrics(
            query, query_ids, gallery, gallery_ids, fpir_vals=FPIRS, cmc_top_k=(1,), precision_top_k=(), map_top_k=()
        )
    expected = brute_dir(query, query_ids, gallery, gallery_ids)
    assert {key: got[key].item() for key in expected} == pytest.approx(expected, abs=1e-6)


def test_chunked_pass_gives_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchmetrics_retrieval.functional import _per_query

    query, query_ids, gallery, gallery_ids = probes(2)
    monkeypatch.setattr(_per_query, "NEIGHBOUR_TABLE_BYTES", 64)  # a few queries per chunk
    got = F.retrieval_metrics(query, query_ids, gallery, gallery_ids, fpir_vals=FPIRS, cmc_top_k=(3,), map_top_k=())
    expected = brute_dir(query, query_ids, gallery, gallery_ids)
    assert {key: got[key].item() for key in expected} == pytest.approx(expected, abs=1e-6)


def test_without_non_mated_probes_it_is_nan_with_a_warning() -> None:
    x, labels = torch.randn(10, 3), torch.arange(10) % 2
    with pytest.warns(UserWarning, match="no non-mated probe"):
        got = F.retrieval_metrics(x, labels, fpir_vals=(0.1,), cmc_top_k=(), precision_top_k=(), map_top_k=())
    assert torch.isnan(got["dir@fpir/0.1"])


def test_bad_fpir_is_named() -> None:
    with pytest.raises(ValueError, match="`fpir_vals` must contain numbers in \\[0, 1\\]"):
        F.retrieval_metrics(torch.randn(6, 2), torch.arange(6) % 2, fpir_vals=(1.5,))
