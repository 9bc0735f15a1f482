"""A slow, obviously-correct reference of docs/definitions.md, written with plain Python loops.

It shares no code with the package: distances are computed pair by pair in float64, each query's
gallery is built and sorted explicitly, and every metric is its textbook formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def pair_distance(q: Tensor, g: Tensor, distance: str) -> float:
    q64, g64 = q.double(), g.double()
    if distance == "euclidean":
        return math.sqrt(float(((q64 - g64) ** 2).sum()))
    if distance == "sqeuclidean":
        return float(((q64 - g64) ** 2).sum())
    if distance == "cosine":
        # 1 - <q, g> / sqrt(<q, q> <g, g>): exactly 0 for parallel rows (normalising first can leave 2e-16)
        return 1.0 - float(q64 @ g64) / math.sqrt(float(q64 @ q64) * float(g64 @ g64))
    if distance == "dot":
        return -float(q64 @ g64)
    raise ValueError(distance)


def labels_match(a: Tensor, b: Tensor, fn: Callable[[Tensor, Tensor], Tensor] | None) -> bool:
    if fn is not None:
        return bool(fn(a[None, None], b[None, None]).reshape(-1)[0])
    return bool(torch.equal(a, b))


@dataclass
class QueryRanking:
    """The full ranking of one query: gallery positions, distances, relevance, in rank order."""

    positions: list[int]
    distances: list[float]
    relevant: list[bool]

    @property
    def n_relevant(self) -> int:
        return sum(self.relevant)


def rankings(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor,
    gallery_labels: Tensor,
    *,
    self_index: Sequence[int] | None = None,
    sequence_ids: tuple[Tensor, Tensor] | None = None,
    search_groups: tuple[Tensor, Tensor] | None = None,
    distance: str = "euclidean",
    label_comparison_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    camera_ids: tuple[Tensor, Tensor] | None = None,
) -> list[QueryRanking]:
    """Full ranking of every query: G(q) sorted by (distance rounded to the query dtype, position). With
    ``camera_ids``, an item with the query's label (compared as a whole) and camera is left out."""
    result = []
    for q in range(query.shape[0]):
        items = []
        for g in range(gallery.shape[0]):
            if self_index is not None and self_index[q] == g:
                continue
            if sequence_ids is not None and sequence_ids[0][q] == sequence_ids[1][g]:
                continue
            if search_groups is not None and search_groups[0][q] != search_groups[1][g]:
                continue
            same_camera = camera_ids is not None and camera_ids[0][q] == camera_ids[1][g]
            if same_camera and torch.equal(query_labels[q], gallery_labels[g]):
                continue
            d = float(torch.tensor(pair_distance(query[q], gallery[g], distance), dtype=query.dtype))
            items.append((d, g, labels_match(query_labels[q], gallery_labels[g], label_comparison_fn)))
        items.sort(key=lambda item: (item[0], item[1]))
        result.append(QueryRanking([i[1] for i in items], [i[0] for i in items], [i[2] for i in items]))
    return result


def leave_one_out(x: Tensor, labels: Tensor, **kwargs: object) -> list[QueryRanking]:
    return rankings(x, labels, x, labels, self_index=list(range(x.shape[0])), **kwargs)  # type: ignore[arg-type]


def whole_set(
    x: Tensor,
    labels: Tensor,
    *,
    is_query: Sequence[bool] | None = None,
    is_gallery: Sequence[bool] | None = None,
    sequence_ids: Tensor | None = None,
    search_groups: Tensor | None = None,
    camera_ids: Tensor | None = None,
    **kwargs: object,
) -> list[QueryRanking]:
    """Rankings of one set's queries against its gallery items (``gallery=None``), positions in the set.

    A sample that is both a query and a gallery item is left out of its own gallery by position; the
    per-sample ids are split into their query and gallery sides.
    """
    queries = [i for i in range(x.shape[0]) if is_query is None or is_query[i]]
    items = [j for j in range(x.shape[0]) if is_gallery is None or is_gallery[j]]
    own = [items.index(i) if i in items else -1 for i in queries]

    def sides(ids: Tensor | None) -> tuple[Tensor, Tensor] | None:
        return None if ids is None else (ids[queries], ids[items])

    result = rankings(
        x[queries],
        labels[queries],
        x[items],
        labels[items],
        self_index=own,
        sequence_ids=sides(sequence_ids),
        search_groups=sides(search_groups),
        camera_ids=sides(camera_ids),
        **kwargs,  # type: ignore[arg-type]
    )
    # gallery positions -> set positions: ``items`` is increasing, so the tie order by position is unchanged
    return [QueryRanking([items[g] for g in r.positions], r.distances, r.relevant) for r in result]


# ---- per-query metric values, literally as in docs/definitions.md -------------------------------------------------


def _precision_at(rel: list[bool], i: int) -> float:
    return sum(rel[:i]) / i


def cmc(r: QueryRanking, k: int) -> float:
    return float(any(r.relevant[:k]))


def precision(r: QueryRanking, k: int, mode: str = "min_k_n") -> float:
    denominator = min(k, r.n_relevant) if mode == "min_k_n" else min(k, len(r.relevant))
    return sum(r.relevant[:k]) / denominator if denominator else 0.0


def recall(r: QueryRanking, k: int) -> float:
    return sum(r.relevant[:k]) / r.n_relevant if r.n_relevant else 0.0


def map_at_k(r: QueryRanking, k: int) -> float:
    hits = sum(r.relevant[:k])
    if hits == 0:
        return 0.0
    return sum(_precision_at(r.relevant, i + 1) for i in range(min(k, len(r.relevant))) if r.relevant[i]) / hits


def average_precision(r: QueryRanking) -> float:
    if r.n_relevant == 0:
        return 0.0
    return sum(_precision_at(r.relevant, i + 1) for i in range(len(r.relevant)) if r.relevant[i]) / r.n_relevant


def map_at_r(r: QueryRanking) -> float:
    big_r = r.n_relevant
    if big_r == 0:
        return 0.0
    return sum(_precision_at(r.relevant, i + 1) for i in range(big_r) if r.relevant[i]) / big_r


def r_precision(r: QueryRanking) -> float:
    return sum(r.relevant[: r.n_relevant]) / r.n_relevant if r.n_relevant else 0.0


def reciprocal_rank(r: QueryRanking) -> float:
    for i, rel in enumerate(r.relevant):
        if rel:
            return 1.0 / (i + 1)
    return 0.0


def ndcg(r: QueryRanking, k: int) -> float:
    gain = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(r.relevant))) if r.relevant[i])
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, r.n_relevant)))
    return gain / ideal if ideal else 0.0


def mean_over(values: list[float], rankings_: list[QueryRanking], action: str = "skip") -> float:
    """Average of per-query values under ``empty_target_action``."""
    kept = []
    for value, r in zip(values, rankings_, strict=True):
        if r.n_relevant == 0:
            if action == "skip":
                continue
            value = 0.0 if action == "neg" else 1.0
        kept.append(value)
    return sum(kept) / len(kept) if kept else float("nan")
