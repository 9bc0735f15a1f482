"""Matplotlib figures for retrieval results: metric values, CMC / precision@k curves, the worst queries, and
forest plots of several models' metrics with their confidence intervals.

matplotlib is an optional dependency (the ``plot`` extra); it is imported inside the functions, and a
missing install raises an ``ImportError`` that says how to get it. Every function returns
``(figure, axes)`` like torchmetrics' ``plot`` methods; the figure is None when an axis was given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import torch
from torch import Tensor

from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional._checks import check_choice, check_positive_int
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional.reduction import EmptyTargetAction, apply_empty_target_action, masked_mean

__all__ = [
    "cmc_curve",
    "log_figure",
    "plot_cmc_curve",
    "plot_curve",
    "plot_forest",
    "plot_worst_queries",
    "require_matplotlib",
]

Curve = Literal["cmc", "precision"]


def require_matplotlib() -> ModuleType:
    """Return ``matplotlib.pyplot``, or raise an ``ImportError`` naming the ``plot`` extra."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "Plotting needs matplotlib, which is not installed: `pip install 'torchmetrics-retrieval[plot]'` "
            "(or `pip install matplotlib`)."
        ) from err
    return plt


def _figure_and_axis(ax: Any) -> tuple[Any, Any]:
    plt = require_matplotlib()
    return plt.subplots() if ax is None else (None, ax)


def plot_curve(
    x: Tensor,
    y: Tensor,
    *,
    ax: Any = None,
    label: str | None = None,
    xlabel: str = "",
    ylabel: str = "",
    ylim: tuple[float, float] | None = (0.0, 1.0),
    marker: str | None = None,
) -> tuple[Any, Any]:
    """Draw one curve ``y(x)`` on ``ax`` (or on a new figure); the building block of every curve plot.

    Args:
        x: ``(P,)`` tensor of the horizontal coordinates (any device).
        y: ``(P,)`` tensor of the vertical coordinates.
        ax: a matplotlib axis, or None for a new figure.
        label: legend entry of the curve.
        xlabel: title of the horizontal axis.
        ylabel: title of the vertical axis.
        ylim: y range (None: matplotlib's choice).
        marker: matplotlib marker (None: a plain line).

    Returns:
        ``(figure or None, axis)``.
    """
    fig, ax = _figure_and_axis(ax)
    ax.plot(x.detach().cpu().numpy(), y.detach().cpu().numpy(), marker=marker, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(True, alpha=0.3)
    if label is not None:
        ax.legend()
    return fig, ax


def cmc_curve(
    result: RetrievalResult,
    curve: Curve = "cmc",
    *,
    precision_mode: ranking.PrecisionMode = "min_k_n",
    empty_target_action: EmptyTargetAction = "skip",
) -> tuple[Tensor, Tensor]:
    """CMC@k or precision@k for every k = 1 .. K from per-query results (K: the columns retrieved).

    Queries count as in the metrics: lone queries follow ``empty_target_action``.

    Returns:
        ``(ks, values)``: ``(K,)`` int64 cutoffs and ``(K,)`` mean values.

    Example:
        >>> from torchmetrics_retrieval.functional import retrieval_metrics
        >>> x, labels = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]]), torch.tensor([0, 0, 1, 1, 1])
        >>> _, result = retrieval_metrics(
        ...     x, labels, cmc_top_k=(3,), precision_top_k=(), map_top_k=(), return_per_query=True
        ... )
        >>> ks, values = cmc_curve(result)
        >>> ks.tolist(), [round(v, 4) for v in values.tolist()]
        ([1, 2, 3], [0.4, 0.8, 1.0])
    """
    check_choice("curve", curve, ("cmc", "precision"))
    is_relevant, n_relevant = result.is_relevant, result.n_relevant
    ks = tuple(range(1, is_relevant.shape[1] + 1))
    if curve == "cmc":
        table = ranking.cmc_at_k(is_relevant, n_relevant, ks)
    else:
        n_candidates = result.valid.sum(dim=1)  # min(K, |G(q)|); min(k, .) equals min(k, |G(q)|) for k <= K
        table = ranking.precision_at_k(is_relevant, n_relevant, ks, mode=precision_mode, n_candidates=n_candidates)
    table, counted = apply_empty_target_action(table, n_relevant, empty_target_action)
    return torch.tensor(ks), masked_mean(table, counted, name=f"{curve} curve")


def plot_cmc_curve(
    result: RetrievalResult,
    *,
    curve: Curve = "cmc",
    precision_mode: ranking.PrecisionMode = "min_k_n",
    empty_target_action: EmptyTargetAction = "skip",
    ax: Any = None,
    label: str | None = None,
) -> tuple[Any, Any]:
    """Plot the CMC curve (``curve="cmc"``) or the precision@k curve (``"precision"``) of per-query results.

    Args:
        result: ``EmbeddingMetrics.per_query`` or the second output of
            ``retrieval_metrics(..., return_per_query=True)``.
        curve: ``"cmc"`` or ``"precision"``.
        precision_mode: as in the metrics (use the metric's own option).
        empty_target_action: as in the metrics (use the metric's own option).
        ax: a matplotlib axis, or None for a new figure.
        label: legend entry (e.g. the model's name, to compare models on one axis).

    Returns:
        ``(figure or None, axis)``.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> from torchmetrics_retrieval.functional import retrieval_metrics
        >>> x, labels = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]]), torch.tensor([0, 0, 1, 1, 1])
        >>> _, result = retrieval_metrics(x, labels, cmc_top_k=(3,), return_per_query=True)
        >>> fig, ax = plot_cmc_curve(result)
        >>> ax.get_ylabel()
        'CMC@k'
    """
    ks, values = cmc_curve(result, curve, precision_mode=precision_mode, empty_target_action=empty_target_action)
    return plot_curve(
        ks,
        values,
        ax=ax,
        label=label,
        xlabel="k",
        ylabel="CMC@k" if curve == "cmc" else "precision@k",
        marker="o" if ks.numel() <= 30 else None,
    )


def _query_rows(result: RetrievalResult, positions: Tensor) -> list[int]:
    """Row of each query position inside the per-query tensors."""
    return [int(torch.nonzero(result.query_positions == p)[0]) for p in positions.tolist()]


def _clear_ticks(ax: Any) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def _draw(ax: Any, item: int, draw_item: Callable[[Any, int], None] | None) -> None:
    if draw_item is None:
        ax.text(0.5, 0.5, str(item), ha="center", va="center", transform=ax.transAxes)
    else:
        draw_item(ax, item)
    _clear_ticks(ax)


def _frame(ax: Any, color: str) -> None:
    for spine in ax.spines.values():
        spine.set_edgecolor(color)
        spine.set_linewidth(3)


def plot_worst_queries(
    result: RetrievalResult,
    metric: str,
    n: int = 5,
    *,
    n_neighbours: int = 5,
    draw_item: Callable[[Any, int], None] | None = None,
    item_ids: Tensor | None = None,
) -> tuple[Any, Any]:
    """A grid: one row per worst query for ``metric`` (lowest value first), the query then its nearest items.

    Retrieved items are framed green when relevant, red otherwise, and titled with their distance.

    Args:
        result: per-query results (``EmbeddingMetrics.per_query``).
        metric: a per-query key of ``result.values`` (e.g. ``"cmc/1"``).
        n: number of queries (fewer if fewer queries count).
        n_neighbours: retrieved items shown per query (at most the number retrieved).
        draw_item: ``draw_item(ax, item)`` draws one item on an axis (e.g. ``ax.imshow(images[item])``);
            None writes the item's id.
        item_ids: ``(N,)`` id given to ``draw_item`` for each position of the input set (e.g.
            ``EmbeddingMetrics.sample_indexes``); None: the position itself.

    Returns:
        ``(figure, axes)`` with ``axes`` a ``(rows, 1 + n_neighbours)`` array.

    Raises:
        ValueError: for an unknown ``metric``, ``n < 1``, or when no query counts.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> from torchmetrics_retrieval.functional import retrieval_metrics
        >>> x, labels = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]]), torch.tensor([0, 0, 1, 1, 1])
        >>> _, result = retrieval_metrics(x, labels, cmc_top_k=(3,), return_per_query=True)
        >>> fig, axes = plot_worst_queries(result, "cmc/3", 2, n_neighbours=3)
        >>> axes.shape
        (2, 4)
    """
    plt = require_matplotlib()
    check_positive_int("n_neighbours", n_neighbours)
    positions = result.worst_queries(metric, n)
    if positions.numel() == 0:
        raise ValueError(f"`metric` {metric!r} has no counted query to show, got {result.counted.numel()} queries.")
    columns = 1 + min(n_neighbours, result.indices.shape[1])

    def item_id(position: int) -> int:
        return position if item_ids is None else int(item_ids[position])

    fig, axes = plt.subplots(
        positions.numel(), columns, figsize=(1.6 * columns, 1.8 * positions.numel()), squeeze=False
    )
    for row, (position, q) in enumerate(zip(positions.tolist(), _query_rows(result, positions), strict=True)):
        _draw(axes[row, 0], item_id(position), draw_item)
        axes[row, 0].set_title(f"query {item_id(position)}\n{metric}={float(result.values[metric][q]):.3g}", fontsize=8)
        _frame(axes[row, 0], "black")
        for col in range(1, columns):
            ax = axes[row, col]
            if not bool(result.valid[q, col - 1]):
                ax.axis("off")
                continue
            _draw(ax, item_id(int(result.indices[q, col - 1])), draw_item)
            ax.set_title(f"{float(result.distances[q, col - 1]):.3g}", fontsize=8)
            _frame(ax, "tab:green" if bool(result.is_relevant[q, col - 1]) else "tab:red")
    fig.tight_layout()
    return fig, axes


def plot_forest(
    results: dict[str, dict[str, Tensor]], keys: list[str] | None = None, *, ax: Any = None
) -> tuple[Any, Any]:
    """A forest plot: one row per metric key, one point per model with its confidence interval as a bar.

    Args:
        results: model name -> a result of ``retrieval_metrics`` / ``compute()`` with ``confidence_level`` set
            (the keys ``{key}``, ``{key}/ci_low``, ``{key}/ci_high``).
        keys: the metric keys to show, top to bottom (default: every key of the first result that has an
            interval, in its order).
        ax: a matplotlib axis, or None for a new figure.

    Returns:
        ``(figure or None, axis)``.

    Raises:
        ValueError: for no model, or a key without its value or interval in some model's result.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> a = {"map": torch.tensor(0.41), "map/ci_low": torch.tensor(0.39), "map/ci_high": torch.tensor(0.43)}
        >>> b = {"map": torch.tensor(0.45), "map/ci_low": torch.tensor(0.42), "map/ci_high": torch.tensor(0.47)}
        >>> fig, ax = plot_forest({"model a": a, "model b": b})
        >>> [label.get_text() for label in ax.get_yticklabels()]
        ['map']
    """
    if not results:
        raise ValueError("`results` must hold at least one model's metrics, got an empty dict.")
    first = next(iter(results.values()))
    if keys is None:
        keys = [key for key in first if f"{key}/ci_low" in first and f"{key}/ci_high" in first]
    for name, result in results.items():
        missing = [k for key in keys for k in (key, f"{key}/ci_low", f"{key}/ci_high") if k not in result]
        if missing:
            raise ValueError(
                f"`results` must hold every key and its interval for every model, got no {missing[:3]} for model "
                f"{name!r} (set confidence_level to get intervals)."
            )
    fig, ax = _figure_and_axis(ax)
    n_models = len(results)
    for m, (name, result) in enumerate(results.items()):
        rows = [len(keys) - 1 - i + (n_models - 1 - 2 * m) * 0.3 / max(n_models - 1, 1) for i in range(len(keys))]
        values = [float(result[key]) for key in keys]
        low = [value - float(result[f"{key}/ci_low"]) for key, value in zip(keys, values, strict=True)]
        high = [float(result[f"{key}/ci_high"]) - value for key, value in zip(keys, values, strict=True)]
        ax.errorbar(values, rows, xerr=[low, high], fmt="o", capsize=3, label=name or None)
    ax.set_yticks(range(len(keys)), list(reversed(keys)))
    ax.grid(True, axis="x", alpha=0.3)
    if any(results):
        ax.legend()
    return fig, ax


def log_figure(logger: Any, name: str, figure: Any, step: int | None = None) -> str | None:
    """Send a matplotlib figure to a Lightning logger: TensorBoard's ``add_figure``, else a PNG in its ``log_dir``.

    The plotting functions and every metric's ``plot`` return ``(figure, axes)``; this is the one call that
    puts such a figure where the run's other results are. Loggers whose ``experiment`` has ``add_figure``
    (``TensorBoardLogger``) receive the figure itself; other loggers with a ``log_dir`` (``CSVLogger``, the
    default) get ``{log_dir}/figures/{name}[-{step}].png``, with the ``/`` of a metric key turned into ``_``.

    Args:
        logger: a Lightning logger (``trainer.logger`` or ``self.logger`` in a ``LightningModule``).
        name: the figure's tag, e.g. ``"val/cmc"``.
        figure: a matplotlib figure.
        step: the global step, kept in the tag's history (TensorBoard) or in the file name.

    Returns:
        The PNG's path, or None when the figure went to ``add_figure``.

    Raises:
        TypeError: for a logger with neither ``experiment.add_figure`` nor ``log_dir``.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import tempfile
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> fig, ax = plot_curve(torch.arange(1, 4), torch.tensor([0.5, 0.75, 1.0]), label="CMC")
        >>> logger = CSVLogger(tempfile.mkdtemp())
        >>> log_figure(logger, "val/cmc", fig, step=3).endswith("figures/val_cmc-3.png")
        True
    """
    # A CSV logger's ``experiment`` is not touched: creating it again would start a new metrics file.
    add_figure = None if _is_csv_logger(logger) else getattr(getattr(logger, "experiment", None), "add_figure", None)
    if callable(add_figure):
        add_figure(name, figure, global_step=step)
        return None
    log_dir = getattr(logger, "log_dir", None)
    if log_dir is None:
        raise TypeError(
            f"`logger` must be a Lightning logger with `experiment.add_figure` or a `log_dir`, got "
            f"{type(logger).__name__}."
        )
    folder = os.path.join(log_dir, "figures")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name.replace("/", "_") + ("" if step is None else f"-{step}") + ".png")
    figure.savefig(path)
    return path


def _is_csv_logger(logger: Any) -> bool:
    """Whether ``logger`` is Lightning's ``CSVLogger`` (of ``lightning.pytorch`` or ``lightning.fabric``)."""
    try:
        from lightning.fabric.loggers import CSVLogger
    except ImportError:  # Lightning is optional
        return False
    return isinstance(logger, CSVLogger)
