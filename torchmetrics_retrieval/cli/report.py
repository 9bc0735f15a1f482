"""``--report DIR``: the metrics as JSON, every query's values as a table, and the plots of one evaluation.

Files: ``metrics.json`` (values, inputs, options), ``per_query.csv`` (or ``.parquet``), ``cmc.png`` and
``precision.png`` (CMC@k and precision@k for k up to the largest cutoff), ``det.png`` (the DET curve with the
EER and minDCF points, when a pair metric was asked for), ``explained_variance.png`` (with ``pcf``) and
``worst_queries.png`` (with ``--images``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.cli.inputs import Inputs, UsageError
from torchmetrics_retrieval.functional._options import RetrievalOptions, option_fields
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute

__all__ = ["counted_values", "write_report"]


def counted_values(result: RetrievalResult, key: str, options: RetrievalOptions) -> tuple[Tensor, Tensor]:
    """``(query positions, values)`` of the queries that count for ``key`` (after ``empty_target_action``)."""
    values, counted = _apply_empty_target_action_compute(
        result.values[key][:, None], result.n_relevant, options.empty_target_action
    )
    return result.query_positions[counted], values.flatten()


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def _write_metrics(folder: Path, metrics: dict[str, Tensor], inputs: Inputs, options: RetrievalOptions) -> None:
    chosen = {
        name: _json_value(getattr(options, name))
        for name, spec in option_fields().items()
        if name != "progress" and getattr(options, name) != spec.default
    }
    document = {
        "metrics": {key: None if math.isnan(float(v)) else float(v) for key, v in metrics.items()},
        "inputs": {
            "samples": inputs.embeddings.shape[0],
            "dimension": inputs.embeddings.shape[1],
            "gallery": None if inputs.gallery is None else inputs.gallery.shape[0],
            "fields": sorted(inputs.fields),
        },
        "options": chosen,
    }
    (folder / "metrics.json").write_text(json.dumps(document, indent=2) + "\n")


def _write_per_query(folder: Path, result: RetrievalResult, per_query_format: str) -> str:
    columns: dict[str, np.ndarray] = {"query": result.query_positions.cpu().numpy()}
    if result.query_labels.ndim == 1:
        columns["label"] = result.query_labels.cpu().numpy()
    if result.query_categories is not None:
        columns["category"] = result.query_categories.cpu().numpy()
    columns["n_relevant"] = result.n_relevant.cpu().numpy()
    columns["counted"] = result.counted.cpu().numpy()
    columns.update({key: value.cpu().double().numpy() for key, value in result.values.items()})
    if per_query_format == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as error:
            raise UsageError("--per-query-format parquet needs pyarrow: pip install pyarrow") from error
        pq.write_table(pa.table(columns), folder / "per_query.parquet")
        return "per_query.parquet"
    with (folder / "per_query.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(zip(*(column.tolist() for column in columns.values()), strict=True))
    return "per_query.csv"


def _save(fig: Any, path: Path) -> str:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def _det_plot(folder: Path, inputs: Inputs, options: RetrievalOptions) -> str:
    """The DET curve over every pair (the same pairs and rules as the metrics) with the EER / minDCF points."""
    from torchmetrics_retrieval.functional._evaluate import _normalized
    from torchmetrics_retrieval.functional._pairs.rates import RateRequest
    from torchmetrics_retrieval.functional._sets import split_query_gallery
    from torchmetrics_retrieval.functional.verification import DEFAULT_FMR_GRID, _pair_statistics, pair_curve
    from torchmetrics_retrieval.plotting import plot_curve

    qg = split_query_gallery(inputs.embeddings, inputs.labels, inputs.gallery, inputs.gallery_labels, **inputs.fields)
    qg = _normalized(qg) if options.normalize else qg
    grid = tuple(sorted(set(DEFAULT_FMR_GRID) | set(options.fmr_vals)))
    rules = (options.distance, options.label_comparison_fn, options.chunk_size)
    curve = pair_curve(qg, grid, *rules)
    fig, ax = plot_curve(torch.tensor(grid), curve.fnmr, label="DET curve", xlabel="FMR (false match rate)")
    ax.set_ylabel("FNMR (false non-match rate)")
    ax.set_xscale("log")
    if options.fmr_vals:
        marked = [float(curve.fnmr[grid.index(f)]) for f in options.fmr_vals]
        ax.scatter(list(options.fmr_vals), marked, color="tab:red", zorder=3, label="fnmr@fmr")
    request = RateRequest(options.eer, options.min_dcf_p_target, options.dcf_costs)
    if request.eer or request.p_targets:
        for key, (fmr, fnmr) in _pair_statistics(qg, (), request, *rules).points.items():
            ax.scatter([float(fmr)], [float(fnmr)], marker="D", zorder=3, label=key)
    ax.legend()
    return _save(fig, folder / "det.png")


def _variance_plot(folder: Path, inputs: Inputs, options: RetrievalOptions) -> str:
    from torchmetrics_retrieval.metrics import PCF

    everything = inputs.embeddings if inputs.gallery is None else torch.cat([inputs.embeddings, inputs.gallery])
    if options.normalize:
        everything = torch.nn.functional.normalize(everything, dim=1)
    metric = PCF(pcf_variance=options.pcf_variance)
    metric.update(everything)
    fig, _ = metric.plot_curve()
    return _save(fig, folder / "explained_variance.png")


def _worst_queries_plot(folder: Path, result: RetrievalResult, images: Tensor, key: str) -> str:
    from torchmetrics_retrieval.plotting import plot_worst_queries

    pictures = images.cpu().numpy()

    def draw(ax: Any, item: int) -> None:
        ax.imshow(pictures[item], cmap="gray" if pictures.ndim == 3 else None)

    fig, _ = plot_worst_queries(result, key, 6, n_neighbours=6, draw_item=draw)
    return _save(fig, folder / "worst_queries.png")


def write_report(
    folder: Path,
    metrics: dict[str, Tensor],
    result: RetrievalResult | None,
    inputs: Inputs,
    options: RetrievalOptions,
    *,
    images: Tensor | None = None,
    worst_key: str | None = None,
    per_query_format: str = "csv",
) -> list[str]:
    """Write the report into ``folder`` (created if needed) and return the names of the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever the user's display
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--report cannot create {folder}: {error.strerror}") from error
    _write_metrics(folder, metrics, inputs, options)
    written = ["metrics.json"]
    if result is not None and result.values:
        from torchmetrics_retrieval.plotting import plot_cmc_curve

        written.append(_write_per_query(folder, result, per_query_format))
        if result.indices.shape[1] and bool(result.counted.any()):
            for curve in ("cmc", "precision"):
                fig, _ = plot_cmc_curve(
                    result, curve=curve, precision_mode=options.precision_mode,
                    empty_target_action=options.empty_target_action,
                )  # fmt: skip
                written.append(_save(fig, folder / f"{curve}.png"))
        if images is not None:
            key = worst_key or next(iter(result.values))
            written.append(_worst_queries_plot(folder, result, images, key))
    if options.needs_pairs:
        written.append(_det_plot(folder, inputs, options))
    if options.pcf_variance:
        written.append(_variance_plot(folder, inputs, options))
    return written
