"""``progress=True``: tqdm bars on stderr for the long passes, the same values, nothing without it."""

from __future__ import annotations

import pytest
import torch

import torchmetrics_retrieval.functional as F
from torchmetrics_retrieval import EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.functional import _progress

OPTIONS = {"cmc_top_k": (1,), "map_full": True, "fmr_vals": (0.1,), "eer": True}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(300, 8, generator=generator), torch.randint(0, 6, (300,), generator=generator)


def test_bars_of_every_pass_and_the_same_values(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr(_progress, "DELAY_SECONDS", 0.0)  # show even these short passes
    x, y = _data()
    quiet = F.retrieval_metrics(x, y, **OPTIONS)
    assert capsys.readouterr().err == ""
    shown = F.retrieval_metrics(x, y, **OPTIONS, progress=True)
    err = capsys.readouterr().err
    for bar in ("full ranking", "pairs, histograms", "pairs, exact values"):
        assert bar in err, bar
    assert "kNN search" not in err  # full ``map`` ranks every relevant item: no search
    assert "90.0k/90.0k" in err  # every ordered pair read
    F.retrieval_metrics(x, y, **{**OPTIONS, "map_full": False}, progress=True)
    assert "300/300" in capsys.readouterr().err  # every query searched
    assert quiet.keys() == shown.keys() and all(torch.equal(quiet[k], shown[k]) for k in quiet)


def test_metric_classes_take_progress(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr(_progress, "DELAY_SECONDS", 0.0)
    x, y = _data()
    metric = EmbeddingMetrics(cmc_top_k=(1,), progress=True)
    metric.update(x, y)
    metric.compute()
    assert "kNN search" in capsys.readouterr().err
    pairs = FNMRAtFMR(eer=True, progress=True)
    pairs.update(x, y)
    pairs.compute()
    assert "pairs, histograms" in capsys.readouterr().err
    metric = EmbeddingMetrics(cmc_top_k=(1,))  # the default: silent, as Lightning users expect
    metric.update(x, y)
    metric.compute()
    assert capsys.readouterr().err == ""


def test_short_passes_show_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    x, y = _data()
    F.retrieval_metrics(x, y, cmc_top_k=(1,), progress=True)  # well under DELAY_SECONDS
    assert capsys.readouterr().err == ""


def test_progress_must_be_a_bool() -> None:
    x, y = _data()
    with pytest.raises(TypeError, match="`progress` must be a bool, got"):
        F.retrieval_metrics(x, y, progress="yes")
