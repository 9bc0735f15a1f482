"""``--compare OTHER``: a second model's embeddings of the same samples, compared query by query.

Both models are evaluated with the same labels, rules and options; for every per-query key the paired
comparison of :func:`~torchmetrics_retrieval.functional.compare_models` gives the difference (other - first),
its bootstrap interval and a two-sided p-value.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from torchmetrics_retrieval.cli.inputs import Inputs
from torchmetrics_retrieval.cli.report import counted_values
from torchmetrics_retrieval.functional._evaluate import _normalized
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult, per_query
from torchmetrics_retrieval.functional._sets import split_query_gallery
from torchmetrics_retrieval.functional.comparison import ComparisonTest, compare_models

__all__ = ["compare", "print_comparison"]


def _per_query(inputs: Inputs, options: RetrievalOptions) -> RetrievalResult:
    qg = split_query_gallery(inputs.embeddings, inputs.labels, inputs.gallery, inputs.gallery_labels, **inputs.fields)
    return per_query(_normalized(qg) if options.normalize else qg, options, keep_neighbours=False)


def compare(
    first: Inputs, other: Inputs, options: RetrievalOptions, test: ComparisonTest, level: float, seed: int
) -> dict[str, dict[str, float]]:
    """``{key: {mean_a, mean_b, difference, ci_low, ci_high, p_value}}`` for every per-query key of the options."""
    result_a, result_b = _per_query(first, options), _per_query(other, options)
    table: dict[str, dict[str, float]] = {}
    for key in result_a.values:
        pair_a, pair_b = counted_values(result_a, key, options), counted_values(result_b, key, options)
        if pair_a[0].numel() < 2:
            continue  # fewer than two counted queries: nothing to compare
        found: dict[str, Tensor] = compare_models(pair_a, pair_b, test=test, confidence_level=level, seed=seed)
        table[key] = {name: float(value) for name, value in found.items()}
    return table


def print_comparison(table: dict[str, dict[str, Any]], names: tuple[str, str], test: str, level: float) -> None:
    """The comparison as a table on stdout."""
    width = max([len("metric"), *map(len, table)])
    print(f"Paired comparison ({test}, {level:.0%} interval of the difference {names[1]} - {names[0]}):")
    print(f"{'metric'.ljust(width)}  {'first':>7}  {'other':>7}  {'diff':>8}  {'interval':>19}  {'p-value':>8}")
    for key, row in table.items():
        interval = f"[{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]"
        print(
            f"{key.ljust(width)}  {row['mean_a']:7.4f}  {row['mean_b']:7.4f}  {row['difference']:+8.4f}  "
            f"{interval:>19}  {row['p_value']:8.2g}"
        )
