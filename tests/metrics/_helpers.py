"""Data, batch feeding and a slow reference of ``EmbeddingMetrics`` shared by the metric tests."""

from __future__ import annotations

import itertools
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import reference
import torch
from torch import Tensor

#: Every ranking metric, several cutoffs each (one kNN pass must serve them all).
ALL_RANKING: dict[str, Any] = {
    "cmc_top_k": (1, 3),
    "precision_top_k": (2, 5),
    "map_top_k": (3,),
    "recall_top_k": (2,),
    "ndcg_top_k": (4,),
    "map_at_r": True,
    "r_precision": True,
    "mrr": True,
    "map_full": True,
    "minp": True,
}


def make_data(n: int = 40, d: int = 3, n_labels: int = 5, seed: int = 0) -> dict[str, Tensor]:
    """Small-integer embeddings (exact distances, many ties), labels and every optional per-sample field."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embeddings": torch.randint(0, 4, (n, d), generator=g).float(),
        "labels": torch.randint(0, n_labels, (n,), generator=g),
        "is_query": torch.rand(n, generator=g) < 0.7,
        "is_gallery": torch.rand(n, generator=g) < 0.8,
        "sequence_ids": torch.randint(0, 8, (n,), generator=g),
        "search_groups": torch.randint(0, 2, (n,), generator=g),
        "categories": torch.randint(0, 3, (n,), generator=g),
        "camera_ids": torch.randint(0, 3, (n,), generator=g),
    }


def pick(data: dict[str, Tensor], names: Sequence[str]) -> dict[str, Tensor]:
    return {name: data[name] for name in ("embeddings", "labels", *names)}


def split_points(n: int, mode: str, seed: int = 0) -> list[tuple[int, int]]:
    """Batch boundaries: ``"one"`` batch, ``"single"`` rows, ``"random"`` sizes (zero-row batches included)."""
    if mode == "one":
        return [(0, n)]
    if mode == "single":
        return [(i, i + 1) for i in range(n)]
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randint(0, n + 1, (max(1, n // 4),), generator=g).tolist())
    bounds = [0, *cuts, n]
    return list(itertools.pairwise(bounds))


def feed(metric: Any, data: dict[str, Tensor], mode: str = "one", seed: int = 0) -> Any:
    n = data["embeddings"].shape[0]
    for start, end in split_points(n, mode, seed):
        metric.update(**{name: value[start:end] for name, value in data.items()})
    return metric


def _per_query(r: reference.QueryRanking, options: dict[str, Any]) -> dict[str, float]:
    mode = options.get("precision_mode", "min_k_n")
    values: dict[str, float] = {}
    kernels: dict[str, Callable[[reference.QueryRanking, int], float]] = {
        "cmc": reference.cmc,
        "precision": lambda r, k: reference.precision(r, k, mode),
        "recall": reference.recall,
        "map": reference.map_at_k,
        "ndcg": reference.ndcg,
    }
    for name, kernel in kernels.items():
        for k in options.get(
            f"{name}_top_k", (1, 5) if name == "cmc" else (5,) if name in ("precision", "map") else ()
        ):
            values[f"{name}/{k}"] = kernel(r, k)
    if options.get("map_at_r"):
        values["map_at_r"] = reference.map_at_r(r)
    if options.get("r_precision"):
        values["r_precision"] = reference.r_precision(r)
    if options.get("mrr"):
        values["mrr"] = reference.reciprocal_rank(r)
    if options.get("map_full"):
        values["map"] = reference.average_precision(r)
    if options.get("minp"):
        ranks = [i + 1 for i, relevant in enumerate(r.relevant) if relevant]
        values["minp"] = len(ranks) / ranks[-1] if ranks else 0.0
    return values


def slow_metrics(
    embeddings: Tensor,
    labels: Tensor,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: Tensor | None = None,
    search_groups: Tensor | None = None,
    categories: Tensor | None = None,
    camera_ids: Tensor | None = None,
    per_class: bool = False,
    **options: Any,
) -> dict[str, float]:
    """docs/definitions.md with Python loops: explicit galleries, full sorts, per-group averages."""
    n = embeddings.shape[0]
    queries = [i for i in range(n) if is_query is None or bool(is_query[i])]
    gallery = [i for i in range(n) if is_gallery is None or bool(is_gallery[i])]
    self_index = [gallery.index(i) if i in gallery else -1 for i in queries]
    q, g = torch.tensor(queries), torch.tensor(gallery)
    rankings = reference.rankings(
        embeddings[q],
        labels[q],
        embeddings[g],
        labels[g],
        self_index=self_index,
        sequence_ids=None if sequence_ids is None else (sequence_ids[q], sequence_ids[g]),
        search_groups=None if search_groups is None else (search_groups[q], search_groups[g]),
        camera_ids=None if camera_ids is None else (camera_ids[q], camera_ids[g]),
        distance=options.get("distance", "euclidean"),
    )
    per_query = [_per_query(r, options) for r in rankings]
    action = options.get("empty_target_action", "skip")

    def mean(rows: list[int]) -> dict[str, float]:
        return {
            key: reference.mean_over([per_query[i][key] for i in rows], [rankings[i] for i in rows], action)
            for key in per_query[0]
        }

    result = mean(list(range(len(queries))))
    groups: list[tuple[str, Callable[[int], object]]] = []
    if per_class:
        groups.append(("class", lambda i: int(labels[queries[i]])))
    if categories is not None:
        groups.append(("category", lambda i: int(categories[queries[i]])))
    for kind, group_of in groups:
        members: dict[object, list[int]] = defaultdict(list)
        for i in range(len(queries)):
            members[group_of(i)].append(i)
        for group, rows in members.items():
            if action == "skip" and all(rankings[i].n_relevant == 0 for i in rows):
                continue
            for key, value in mean(rows).items():
                result[f"{key}/class/{group}" if kind == "class" else f"{group}/{key}"] = value
    return result


def outcome(metric: Any) -> Any:
    """``metric.compute()``, or ``{"error": message}`` of the ValueError it raised: what a rank returns, so that the
    ranks' outcomes (values or the same error everywhere) can be compared."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a rank without update() gets torchmetrics' warning
            return metric.compute()
    except ValueError as err:
        return {"error": str(err)}
