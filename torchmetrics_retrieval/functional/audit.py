r"""Audit of an approximate nearest-neighbour index against the exact neighbours of our engine.

A user's index (faiss IVF, HNSW, PQ, ScaNN, ...) returns a ``(Q, w)`` table of gallery positions, ``-1`` where it
found nothing. :func:`audit_neighbours` searches the exact ``k`` nearest eligible items with :func:`~.search.knn`
(leave-one-out when ``gallery`` is None: query ``i`` is gallery item ``i`` and is not its own neighbour) and scores
the first ``k`` columns of the table, query by query. With :math:`A_q` the set of distinct ids in the row (``-1``
left out), :math:`E_q` the exact top ``k`` (:math:`|E_q| = \min(k, |G(q)|)`, the eligible items of q):

* ``recall@{k}`` :math:`= |A_q \cap E_q| / |E_q|`: faiss's ``knn_intersection_measure`` (a repeated id counts
  once; with every query having at least ``k`` eligible items the denominator is ``k``, as in faiss);
* ``recall_1@{k}``: 1 if the exact nearest item (ties by gallery position, as :func:`knn` orders them) is in the
  row, faiss's "1-recall@k";
* ``tie_recall@{k}`` :math:`= |\{a \in A_q \text{ eligible}: d(q, a) \le d_k(q)\}| / |E_q|` with :math:`d_k(q)` the
  exact k-th distance: an item as near as the k-th neighbour is correct, so an index that returns the other
  copy of a duplicated item is not penalised (distances are the canonical float64 ones of :func:`knn`);
* ``duplicate_rate``: the slots repeating an id already in the row, over ``k``; ``missing_rate``: the ``-1`` slots,
  over ``k``.

A query with no eligible item (nothing to find) scores 1 on the three recalls. An id the exclusion rules leave out
of the query's gallery (the query itself in leave-one-out, its own sequence) is never correct: an index built on
the whole set returns the query itself first, so search it for ``k + 1`` and drop the query's own id (not the first
column, which may be its duplicate), or pass ``exclude_self=False`` to audit it as it is.

Cost: the exact search, plus a sort and a ``searchsorted`` of the ``(Q, k)`` table and the canonical distances of
the returned items that are not among the exact top k (no loop over queries, no ``(Q, G)`` matrix).
"""

from __future__ import annotations

from typing import Literal, TypedDict, overload

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_bool, check_positive_int
from torchmetrics_retrieval.functional._given import check_table
from torchmetrics_retrieval.functional._options import Unpack
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.functional.search import Distance, KNNBackend, _checked_search

__all__ = ["audit_neighbours"]


def _check_k(k: object, width: int) -> int:
    if k is None:
        return width
    k = check_positive_int("k", k)
    if k > width:
        raise ValueError(f"`k` must be at most the {width} columns of `neighbours`, got {k}.")
    return k


def audit_values(search: Search, exact: KNNResult, neighbours: Tensor, k: int) -> dict[str, Tensor]:
    """Per-query float64 values of the audit (keys as in :func:`audit_neighbours`) of checked ``(Q, k)``
    ``neighbours`` against ``exact``, the result of ``search`` for every query of its problem."""
    problem = search.problem
    n_query, device = neighbours.shape[0], neighbours.device
    rows = torch.arange(n_query, device=device)
    found = neighbours.sort(dim=1).values  # a sorted row: a repeat sits next to its first occurrence
    missing = found < 0
    first = torch.ones_like(missing)
    first[:, 1:] = found[:, 1:] != found[:, :-1]
    distinct = first & ~missing
    n_exact = exact.valid.sum(dim=1)
    # membership of each distinct id in the exact set, by binary search in the sorted exact row (-2 never matches)
    if exact.indices.shape[1]:
        exact_sorted = torch.where(exact.valid, exact.indices, -2).sort(dim=1).values
        at = torch.searchsorted(exact_sorted, found).clamp_(max=exact_sorted.shape[1] - 1)
        member = distinct & (exact_sorted.gather(1, at) == found)
        nearest = exact.valid[:, 0] & (neighbours == exact.indices[:, :1]).any(dim=1)
    else:
        member = torch.zeros_like(distinct)
        nearest = torch.zeros_like(n_exact, dtype=torch.bool)
    # items as near as the exact k-th one, in canonical float64 distances (the k-th one's recomputed alike); an
    # item of the exact top k is one, so only the others are computed (few, for a useful index)
    eligible = distinct & problem.exclusions.fill_excluded_(
        torch.ones_like(distinct), slice(None), found.clamp(min=0), False
    )
    pair_rows, pair_cols = torch.nonzero(eligible & ~member, as_tuple=True)
    has_kth = torch.nonzero(n_exact > 0).flatten()
    kth_items = exact.indices[has_kth, (n_exact[has_kth] - 1)]
    both = canonical_distances(
        problem, rows, torch.cat([pair_rows, has_kth]), torch.cat([found[pair_rows, pair_cols], kth_items])
    )
    kth = torch.full((n_query,), float("-inf"), dtype=torch.float64, device=device)
    kth[has_kth] = both[pair_rows.numel() :]
    near = member.clone()
    near[pair_rows, pair_cols] = both[: pair_rows.numel()] <= kth[pair_rows]
    nothing = n_exact == 0  # no eligible item: nothing to find, every recall is 1
    denominator = n_exact.clamp(min=1).to(torch.float64)

    def recall(hits: Tensor) -> Tensor:
        return torch.where(nothing, 1.0, hits.sum(dim=1).to(torch.float64) / denominator)

    n_slots = (~missing).sum(dim=1)
    return {
        f"recall@{k}": recall(member),
        f"recall_1@{k}": torch.where(nothing, 1.0, nearest.to(torch.float64)),
        f"tie_recall@{k}": recall(near).clamp(max=1.0),
        "duplicate_rate": (n_slots - distinct.sum(dim=1)).to(torch.float64) / k,
        "missing_rate": missing.sum(dim=1).to(torch.float64) / k,
    }


class AuditArguments(TypedDict, total=False):
    """The options of :func:`audit_neighbours` as keyword arguments: the type of ``**options`` in its overloads, so
    that mypy refuses a misspelt option there too."""

    k: int | None
    distance: Distance
    exclude_self: bool | Tensor | None
    sequence_ids: Tensor | tuple[Tensor, Tensor] | None
    search_groups: Tensor | tuple[Tensor, Tensor] | None
    backend: KNNBackend
    chunk_size: int | None


@overload
def audit_neighbours(
    query: Tensor,
    gallery: Tensor | None = ...,
    *,
    neighbours: Tensor,
    return_per_query: Literal[False] = ...,
    **options: Unpack[AuditArguments],
) -> dict[str, Tensor]: ...


@overload
def audit_neighbours(
    query: Tensor,
    gallery: Tensor | None = ...,
    *,
    neighbours: Tensor,
    return_per_query: Literal[True],
    **options: Unpack[AuditArguments],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]: ...


def audit_neighbours(
    query: Tensor,
    gallery: Tensor | None = None,
    *,
    neighbours: Tensor,
    k: int | None = None,
    distance: Distance = "euclidean",
    exclude_self: bool | Tensor | None = None,
    sequence_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    search_groups: Tensor | tuple[Tensor, Tensor] | None = None,
    backend: KNNBackend = "auto",
    chunk_size: int | None = None,
    return_per_query: bool = False,
) -> dict[str, Tensor] | tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Score an approximate index's neighbour lists against the exact neighbours (definitions: the module).

    Args:
        query: ``(Q, D)`` floating, finite.
        gallery: ``(G, D)``, or None: the queries themselves, leave-one-out (see ``exclude_self``).
        neighbours: ``(Q, w)`` integer tensor of gallery positions from the index, nearest first, ``-1``: no
            result (``torch.from_numpy(I)`` of a faiss search).
        k: the cut-off, at most ``w`` (None: ``w``); the first ``k`` columns are scored.
        distance: of the exact search, as in :func:`~torchmetrics_retrieval.functional.knn` (use the distance the
            index ranks by: ``"sqeuclidean"`` or ``"euclidean"`` for ``IndexFlatL2``, ``"dot"`` for inner product).
        exclude_self: None (True iff ``gallery`` is None), a bool or the gallery position of each query, as in
            :func:`~torchmetrics_retrieval.functional.knn`.
        sequence_ids: items of the query's sequence are left out, as in :func:`~torchmetrics_retrieval.functional.knn`.
        search_groups: only items of the query's group are searched, as in
            :func:`~torchmetrics_retrieval.functional.knn`.
        backend: backend of the exact search.
        chunk_size: caps the blocks of the exact search.
        return_per_query: also return the ``(Q,)`` value of every key for each query.

    Returns:
        ``{key: 0-dim float64 tensor}``, the means over queries of ``recall@{k}``, ``recall_1@{k}``,
        ``tie_recall@{k}``, ``duplicate_rate`` and ``missing_rate``; with ``return_per_query`` also the
        ``{key: (Q,) float64}`` per-query values.

    Raises:
        TypeError, ValueError: naming the argument, for malformed inputs.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [3.0], [3.0]])
        >>> approx = torch.tensor([[1, 3], [0, -1], [2, 1], [2, 2]])  # leave-one-out, k = 2
        >>> metrics, per_query = audit_neighbours(x, neighbours=approx, return_per_query=True)
        >>> # exact: [1, 2], [0, 2], [3, 1], [2, 1]; item 3 is as far from query 0 as item 2; row 2 holds query 2
        >>> per_query["recall@2"].tolist(), per_query["tie_recall@2"].tolist()
        ([0.5, 0.5, 0.5, 0.5], [1.0, 0.5, 0.5, 0.5])
        >>> {key: float(value) for key, value in metrics.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'recall@2': 0.5, 'recall_1@2': 0.75, 'tie_recall@2': 0.625, 'duplicate_rate': 0.125,
         'missing_rate': 0.125}
    """
    check_bool("return_per_query", return_per_query)
    width = neighbours.shape[1] if isinstance(neighbours, Tensor) and neighbours.ndim == 2 else 1
    k_ = _check_k(k, max(width, 1))
    search = _checked_search(
        query, gallery, k_, distance, exclude_self, sequence_ids, search_groups, backend, chunk_size, True
    )
    problem = search.problem
    table = check_table(neighbours, problem.query.shape[0], problem.gallery.shape[0], "gallery positions")
    table = table.to(problem.query.device)[:, :k_]
    exact = search(torch.arange(problem.query.shape[0], device=problem.query.device))
    per_query = audit_values(search, exact, table, k_)
    metrics = {key: value.mean() for key, value in per_query.items()}
    return (metrics, per_query) if return_per_query else metrics
