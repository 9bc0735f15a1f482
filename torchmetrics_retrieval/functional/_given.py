"""Neighbour lists given by the user (``retrieval_metrics(..., neighbours=...)``): an approximate index's ``(Q, w)``
table of gallery positions, turned into the :class:`KNNResult` that the ranking kernels read in place of our search.

A slot that holds no new gallery item of the query's gallery is *empty*: ``-1`` (faiss's "no result"), a repeat of
an id earlier in the row (it counts once, at its first rank), an item the exclusion rules leave out of the query's
gallery (the query itself, its own sequence, another search group, same label and camera) or a sample that is not a
gallery item. An empty slot keeps its rank and holds nothing relevant, and the ranks past the list are empty too: a
metric is what a user of that index sees, up to its cut-off, while n(q) (and R) stay the exact counts
(docs/definitions.md, "Given neighbour lists").
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import describe
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._search.half_rows import values_dtype
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.functional._sets import QueryGallery

__all__ = ["check_given_options", "check_table", "given_neighbours"]

#: Options that rank beyond any list (the full ranking, or the nearest item's distance); refused with a list.
FULL_RANKING_OPTIONS = ("map_full", "minp", "fpir_vals")


def check_given_options(options: RetrievalOptions) -> None:
    """Refuse the options that need the full ranking, which a neighbour list does not give."""
    asked = [name for name in FULL_RANKING_OPTIONS if getattr(options, name)]
    if asked:
        given = "approximate_index" if options.approximate_index is not None else "neighbours"
        raise ValueError(
            f"`{given}` gives ranked lists, not the full ranking that {asked} need; leave them out or evaluate "
            f"them without `{given}`."
        )


def check_table(value: object, n_query: int, n_positions: int, what: str) -> Tensor:
    """A ``(Q, w)`` integer tensor of positions in ``[-1, n_positions)``."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"`neighbours` must be a (Q, k) integer torch.Tensor (torch.from_numpy converts faiss's), "
            f"got {describe(value)}."
        )
    if value.ndim != 2:
        raise ValueError(f"`neighbours` must be 2-D of shape (Q, k), got {describe(value)}.")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"`neighbours` must have an integer dtype, got {describe(value)}.")
    if value.shape[0] != n_query or value.shape[1] == 0:
        raise ValueError(f"`neighbours` must have {n_query} rows (one per query) and a column, got {describe(value)}.")
    if value.numel() and (int(value.min()) < -1 or int(value.max()) >= n_positions):
        raise ValueError(
            f"`neighbours` must hold {what} in [-1, {n_positions}) (-1: no result), "
            f"got values in [{int(value.min())}, {int(value.max())}]."
        )
    return value.long()


#: Pairs whose distance is computed at once: their float64 rows take 2 x 16k x D x 8 bytes (32 MiB at D = 128).
PAIR_BLOCK = 2**14


def pair_distances(query: Tensor, gallery: Tensor, rows: Tensor, cols: Tensor, distance: str) -> Tensor:
    """Float64 distances of the pairs ``(query[rows[i]], gallery[cols[i]])``, block by block of pairs."""
    out = torch.empty(rows.numel(), dtype=torch.float64, device=query.device)
    for start in range(0, rows.numel(), PAIR_BLOCK):
        q = query[rows[start : start + PAIR_BLOCK]].to(torch.float64)
        g = gallery[cols[start : start + PAIR_BLOCK]].to(torch.float64)
        if distance in ("euclidean", "sqeuclidean"):
            value = ((q - g) ** 2).sum(dim=1)
            value = value.sqrt() if distance == "euclidean" else value
        elif distance == "dot":
            value = -(q * g).sum(dim=1)
        else:
            value = 1.0 - (q * g).sum(dim=1) / (q.norm(dim=1) * g.norm(dim=1))
        out[start : start + PAIR_BLOCK] = value
    return out


def given_neighbours(
    qg: QueryGallery, table: object, n_input: int, depth: int, distance: str, distances: Tensor | None = None
) -> KNNResult:
    """The checked list ``table`` of every query of ``qg`` as a :class:`KNNResult` of ``max(depth, w)`` columns,
    ``valid`` False in its empty slots (see the module), +inf distance there.

    ``n_input``: the rows of the input set that the positions index (the whole set when ``gallery`` was None,
    the gallery otherwise); ``distance``: of the distances reported, computed in float64 per pair (for the
    report, not the ranking, which is the list's), or ``distances`` ``(Q, w)`` when the index gave them.
    """
    n_query, device = qg.query.shape[0], qg.query.device
    table = check_table(table, n_query, n_input, "positions of the input set").to(device)
    # input positions -> gallery items (-1: not a gallery item); the identity for a separate gallery
    to_gallery = torch.full((n_input,), -1, dtype=torch.long, device=device)
    to_gallery[qg.gallery_positions] = torch.arange(qg.gallery_positions.numel(), device=device)
    items = torch.where(table >= 0, to_gallery[table.clamp(min=0)], -1)
    # a repeat is empty: sort each row stably, and keep an id where it differs from its predecessor in the sort
    ordered, order = torch.sort(items, dim=1, stable=True)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    keep = torch.empty_like(first).scatter_(1, order, first)
    valid = keep & (items >= 0)
    valid &= qg.exclusions().fill_excluded_(torch.ones_like(valid), slice(None), items.clamp(min=0), False)
    width = max(depth, table.shape[1])
    indices = torch.zeros(n_query, width, dtype=torch.long, device=device)
    indices[:, : table.shape[1]] = torch.where(valid, items, 0)
    valid = torch.nn.functional.pad(valid, (0, width - table.shape[1]), value=False)
    dtype = values_dtype(qg.query)
    reported = torch.full((n_query, width), float("inf"), dtype=dtype, device=device)
    rows, cols = torch.nonzero(valid, as_tuple=True)
    if distances is not None:
        reported[rows, cols] = distances.to(device, dtype)[rows, cols]
    else:
        pairs = pair_distances(qg.query, qg.gallery, rows, indices[rows, cols], distance)
        reported[rows, cols] = pairs.to(dtype)
    return KNNResult(reported, indices, valid)
