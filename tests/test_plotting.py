"""Plots (Agg backend): the figures and axes returned, the curve values against the slow reference, errors."""

from __future__ import annotations

import sys
from typing import Any

import matplotlib
import pytest
import reference
import torch
from sklearn.datasets import load_digits

from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.metrics import EmbeddingMetrics
from torchmetrics_retrieval.plotting import cmc_curve, plot_cmc_curve, plot_curve, plot_worst_queries

matplotlib.use("Agg")
import matplotlib.pyplot as plt


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    yield
    plt.close("all")


def _data(n: int = 30, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (n, 3), generator=g).float(), torch.randint(0, 4, (n,), generator=g)


@pytest.mark.parametrize("mode", ["min_k_n", "standard"])
@pytest.mark.parametrize("action", ["skip", "pos"])
def test_curves_match_the_reference(mode: str, action: str) -> None:
    x, labels = _data()
    labels[0] = 9  # a lone query
    _, result = retrieval_metrics(x, labels, cmc_top_k=(6,), return_per_query=True, empty_target_action=action)
    assert result is not None
    rankings = reference.leave_one_out(x, labels)
    for curve, fn in (("cmc", reference.cmc), ("precision", lambda r, k: reference.precision(r, k, mode))):
        ks, values = cmc_curve(result, curve, precision_mode=mode, empty_target_action=action)  # type: ignore[arg-type]
        assert ks.tolist() == [1, 2, 3, 4, 5, 6]
        expected = [reference.mean_over([fn(r, k) for r in rankings], rankings, action) for k in range(1, 7)]
        assert values.tolist() == pytest.approx(expected, abs=1e-6)


def test_metric_plot_follows_torchmetrics_convention() -> None:
    x, labels = _data()
    metric = EmbeddingMetrics(mrr=True)
    metric.update(x, labels)
    fig, ax = metric.plot()
    assert isinstance(fig, plt.Figure)
    assert [line.get_label() for line in ax.get_lines()] == ["cmc/1", "cmc/5", "precision/5", "map/5", "mrr"]
    steps = [metric.compute(), metric.compute()]
    _fig2, ax2 = plt.subplots()
    out_fig, out_ax = metric.plot(steps, ax=ax2)
    assert out_fig is None and out_ax is ax2
    assert {line.get_label() for line in ax2.get_lines()} >= {"cmc/1", "mrr"}


def test_metric_curves_and_worst_queries_grid() -> None:
    digits = load_digits()
    x = torch.tensor(digits.data[:120], dtype=torch.float32)
    labels = torch.tensor(digits.target[:120])
    metric = EmbeddingMetrics(cmc_top_k=(1, 8), precision_top_k=(4,))
    order = torch.arange(119, -1, -1)
    metric.update(x[order], labels[order], indexes=order + 1000)  # dataset indexes 1000..1119
    _, ax = metric.plot_curve("cmc")
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == list(range(1, 9)) and ax.get_ylabel() == "CMC@k"
    assert float(line.get_ydata()[0]) == pytest.approx(float(metric.compute()["cmc/1"]))
    _, ax = metric.plot_curve("precision")
    assert ax.get_ylabel() == "precision@k"

    drawn: list[int] = []

    def draw(ax: Any, item: int) -> None:
        drawn.append(item)
        ax.imshow(digits.images[item - 1000], cmap="gray_r")

    _fig, axes = metric.plot_worst_queries("cmc/1", 3, n_neighbours=4, draw_item=draw)
    assert axes.shape == (3, 5) and len(drawn) == 15
    assert all(1000 <= item < 1120 for item in drawn)
    assert all(len(ax.images) == 1 for ax in axes.flat)
    worst = metric.sample_indexes[metric.worst_queries("cmc/1", 3)].tolist()  # type: ignore[index]
    assert [drawn[5 * row] for row in range(3)] == worst
    assert axes[0, 0].get_title().startswith(f"query {worst[0]}")


def test_worst_queries_without_drawer_and_few_neighbours() -> None:
    x = torch.tensor([[0.0], [0.3], [5.0]])
    _, result = retrieval_metrics(x, torch.tensor([0, 0, 1]), empty_target_action="neg", return_per_query=True)
    assert result is not None
    _fig, axes = plot_worst_queries(result, "cmc/1", 10, n_neighbours=5)
    assert axes.shape == (3, 3)  # 3 queries, each with its 2 other samples
    assert axes[0, 0].texts[0].get_text() == "2"  # the lone query (value 0 under "neg") comes first
    with pytest.raises(ValueError, match="`key`"):
        plot_worst_queries(result, "recall/1")
    with pytest.raises(ValueError, match="`n_neighbours`"):
        plot_worst_queries(result, "cmc/1", n_neighbours=0)


def test_plot_curve_on_a_given_axis_and_bad_curve() -> None:
    _fig, ax = plt.subplots()
    out = plot_curve(torch.tensor([0.1, 0.2]), torch.tensor([0.5, 0.25]), ax=ax, label="model", xlabel="FMR")
    assert out == (None, ax) and ax.get_xlabel() == "FMR" and ax.get_legend() is not None
    x, labels = _data()
    _, result = retrieval_metrics(x, labels, return_per_query=True)
    assert result is not None
    with pytest.raises(ValueError, match="`curve`"):
        plot_cmc_curve(result, curve="det")  # type: ignore[arg-type]


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    x, labels = _data()
    metric = EmbeddingMetrics()
    metric.update(x, labels)
    with pytest.raises(ImportError, match=r"torchmetrics-retrieval\[plot\]"):
        metric.plot()
    with pytest.raises(ImportError, match="plot"):
        metric.plot_curve()


def test_forest_plot_draws_each_model_value_and_interval() -> None:
    from torchmetrics_retrieval.plotting import plot_forest

    a = {"cmc/1": torch.tensor(0.5), "cmc/1/ci_low": torch.tensor(0.4), "cmc/1/ci_high": torch.tensor(0.7)}
    a |= {"map": torch.tensor(0.3), "map/ci_low": torch.tensor(0.25), "map/ci_high": torch.tensor(0.32)}
    b = {key: value + 0.1 for key, value in a.items()}
    _, ax = plot_forest({"a": a, "b": b})
    assert [label.get_text() for label in ax.get_yticklabels()] == ["map", "cmc/1"]  # first key on top
    points = [line.get_xdata() for line in ax.get_lines() if line.get_marker() == "o"]
    assert [list(map(float, xs)) for xs in points] == [pytest.approx([0.5, 0.3]), pytest.approx([0.6, 0.4])]
    bars = [collection for collection in ax.collections]  # one LineCollection of interval bars per model
    segments = [[(float(s[0][0]), float(s[1][0])) for s in bar.get_segments()] for bar in bars]
    assert segments[0] == [pytest.approx((0.4, 0.7)), pytest.approx((0.25, 0.32))]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    with pytest.raises(ValueError, match="`results` must hold every key and its interval"):
        plot_forest({"a": a, "c": {"cmc/1": torch.tensor(0.5)}})
    with pytest.raises(ValueError, match="`results` must hold at least one"):
        plot_forest({})


def test_embedding_metrics_plot_of_a_result_with_intervals_is_a_forest_plot() -> None:
    metric = EmbeddingMetrics(cmc_top_k=(1,), precision_top_k=(), map_top_k=(), confidence_level=0.9, n_bootstrap=50)
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(40) % 4
    metric.update(torch.randn(40, 3, generator=g) + labels[:, None], labels)
    value = metric.compute()
    _, ax = metric.plot(value)
    assert [label.get_text() for label in ax.get_yticklabels()] == ["cmc/1"]
    (points,) = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert float(points.get_xdata()[0]) == pytest.approx(float(value["cmc/1"]))


def test_det_plot_marks_the_eer_and_min_dcf_operating_points() -> None:
    from torchmetrics_retrieval import FNMRAtFMR

    # the pairs of docs/definitions.md: EER at t = 3 (FMR 6/16, FNMR 2/4), min_dcf/0.5 at t = 4 (6/16, 0)
    metric = FNMRAtFMR(fmr_vals=(0.2,), eer=True, min_dcf_p_target=(0.5,))
    metric.update(torch.tensor([[0.0], [2.0], [3.0], [7.0], [10.0]]), torch.tensor([0, 0, 1, 1, 2]))
    _, ax = metric.plot_curve(fmr_grid=(0.1, 0.5, 1.0))
    marks = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    assert marks["eer"] == [[6 / 16, 2 / 4]]
    assert marks["min_dcf/0.5"] == [[6 / 16, 0.0]]
    assert "fnmr@fmr" in marks


def test_log_figure_to_real_lightning_loggers(tmp_path: Any) -> None:
    """CSVLogger (Lightning's default): a PNG under its log_dir; TensorBoardLogger: an image in its event file."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchmetrics_retrieval.plotting import log_figure

    fig, _ = plot_curve(torch.arange(1, 4), torch.tensor([0.5, 0.75, 1.0]))
    csv = CSVLogger(str(tmp_path / "csv"))
    path = log_figure(csv, "val/cmc", fig, step=7)
    assert path is not None and path.endswith("val_cmc-7.png")
    with open(path, "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    assert csv._experiment is None  # the CSV writer was not created (it would start the metrics file again)

    board = TensorBoardLogger(str(tmp_path / "tb"))
    assert log_figure(board, "val/cmc", fig, step=7) is None
    board.experiment.flush()
    events = EventAccumulator(board.log_dir)
    events.Reload()
    (image,) = events.Images("val/cmc")
    assert image.step == 7 and image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"

    with pytest.raises(TypeError, match=r"`logger` must be a Lightning logger with `experiment\.add_figure` or a"):
        log_figure(object(), "val/cmc", fig)
    plt.close(fig)
