"""Exact k-nearest-neighbour search, block by block, with exclusions and a deterministic tie order.

Two public entry points:

* :func:`distance_blocks` tiles the ``(Q, G)`` query x gallery distance matrix in memory-bounded
  blocks, with the excluded pairs (the query itself, the same sequence, another search group) marked.
* :func:`knn` returns the ``K`` nearest eligible gallery items of every query, nearest first, ties
  ordered by gallery position, identical for every backend and chunk size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_choice,
    check_embeddings,
    check_positive_int,
    check_same_length,
    describe,
)

__all__ = ["BACKENDS", "DISTANCES", "Distance", "DistanceBlock", "KNNBackend", "KNNResult", "distance_blocks", "knn"]

Distance = Literal["euclidean", "sqeuclidean", "cosine", "dot"]
KNNBackend = Literal["auto", "torch", "faiss"]
DISTANCES: tuple[str, ...] = ("euclidean", "sqeuclidean", "cosine", "dot")
BACKENDS: tuple[str, ...] = ("auto", "torch", "faiss")

#: Memory budget of one block of the distance matrix (plus its mask and temporaries), in bytes.
BLOCK_BYTES = 128 * 2**20
#: Preferred number of gallery columns of a block (cache-friendly, large enough for a fast matmul).
BLOCK_COLUMNS = 4096


class KNNResult(NamedTuple):
    """Neighbours of every query, nearest first; ties ordered by gallery position.

    distances: (Q, K) in the chosen distance, +inf where ``valid`` is False.
    indices: (Q, K) int64 gallery positions; 0 where ``valid`` is False (never -1).
    valid: (Q, K) bool; False only where a query has fewer than K eligible gallery items.
    """

    distances: Tensor
    indices: Tensor
    valid: Tensor


class DistanceBlock(NamedTuple):
    """One block of the query x gallery distance matrix (see ``distance_blocks``)."""

    query_slice: slice
    gallery_slice: slice
    distances: Tensor  # (rows, cols), the chosen distance; +inf where not eligible
    eligible: Tensor | None  # (rows, cols) bool, or None when every pair of the block is eligible


class _Exclusions(NamedTuple):
    """Validated exclusion rules, all on the query's device."""

    self_index: Tensor | None  # (Q,) int64, -1 where the query is not in the gallery
    sequence_ids: tuple[Tensor, Tensor] | None
    search_groups: tuple[Tensor, Tensor] | None


# ----------------------------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------------------------


def _check_ids(name: str, value: object, n_rows: int, rows_name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D torch.Tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(value)}.")
    if value.is_floating_point() or value.is_complex():
        raise TypeError(f"`{name}` must have an integer or bool dtype, got {describe(value)}.")
    check_same_length(name, value, n_rows, rows_name)
    return value


def _check_pair(name: str, value: object, n_query: int, n_gallery: int, device: torch.device) -> tuple[Tensor, Tensor]:
    if not (isinstance(value, tuple) and len(value) == 2):
        raise TypeError(f"`{name}` must be a (query_side, gallery_side) pair of tensors, got {describe(value)}.")
    query_side = _check_ids(f"{name}[0]", value[0], n_query, "query").to(device)
    gallery_side = _check_ids(f"{name}[1]", value[1], n_gallery, "gallery").to(device)
    return query_side, gallery_side


def _check_self_index(name: str, value: object, n_query: int, n_gallery: int, device: torch.device) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a bool or an int64 tensor of shape (Q,), got {describe(value)}.")
    if value.dtype != torch.int64:
        raise TypeError(f"`{name}` must have dtype torch.int64, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D of shape (Q,), got {describe(value)}.")
    check_same_length(name, value, n_query, "query")
    if value.numel() and (int(value.min()) < -1 or int(value.max()) >= n_gallery):
        raise ValueError(
            f"`{name}` must hold gallery positions in [0, {n_gallery}) or -1, "
            f"got values in [{int(value.min())}, {int(value.max())}]."
        )
    return value.to(device)


def _check_exclusions(
    self_name: str,
    self_index: object,
    sequence_ids: object,
    search_groups: object,
    query: Tensor,
    gallery: Tensor,
) -> _Exclusions:
    n_query, n_gallery, device = query.shape[0], gallery.shape[0], query.device
    seq = None if sequence_ids is None else _check_pair("sequence_ids", sequence_ids, n_query, n_gallery, device)
    groups = None if search_groups is None else _check_pair("search_groups", search_groups, n_query, n_gallery, device)
    own = None if self_index is None else _check_self_index(self_name, self_index, n_query, n_gallery, device)
    return _Exclusions(self_index=own, sequence_ids=seq, search_groups=groups)


def _check_query_gallery(query: object, gallery: object) -> tuple[Tensor, Tensor]:
    query = check_embeddings("query", query)
    gallery = check_embeddings("gallery", gallery)
    if gallery.shape[1] != query.shape[1]:
        raise ValueError(f"`gallery` must have {query.shape[1]} columns like `query`, got {describe(gallery)}.")
    if gallery.device != query.device:
        raise ValueError(f"`gallery` must be on the device of `query` ({query.device}), got {gallery.device}.")
    return query, gallery


# ----------------------------------------------------------------------------------------------------------------------
# blocks
# ----------------------------------------------------------------------------------------------------------------------


def _compute_dtype(x: Tensor) -> torch.dtype:
    """Float32 at least: half-precision inputs are computed in float32, float64 stays float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _block_sides(n_query: int, n_gallery: int, chunk_size: int | None, bytes_per_pair: int = 16) -> tuple[int, int]:
    """Rows and columns of a block: ``rows * cols * bytes_per_pair <= BLOCK_BYTES``, both capped by ``chunk_size``."""
    cols = min(n_gallery, BLOCK_COLUMNS)
    rows = max(1, min(n_query, BLOCK_BYTES // (bytes_per_pair * max(cols, 1))))
    if chunk_size is not None:
        rows, cols = min(rows, chunk_size), min(cols, chunk_size)
    return rows, max(cols, 1)


def _prepare(x: Tensor, distance: str) -> tuple[Tensor, Tensor | None]:
    """Rows in the compute dtype (unit rows for cosine) and their squared norms (Euclidean distances only)."""
    x = x.to(_compute_dtype(x))
    if distance == "cosine":
        return torch.nn.functional.normalize(x, dim=1), None
    if distance in ("euclidean", "sqeuclidean"):
        return x, (x * x).sum(dim=1)
    return x, None


def _block_distances(q: Tensor, q_sq: Tensor | None, g: Tensor, g_sq: Tensor | None, distance: str) -> Tensor:
    """Distances of prepared rows by matmul expansion, ``(rows, cols)``."""
    if distance in ("cosine", "dot"):
        scores = q @ g.T
        return 1.0 - scores if distance == "cosine" else scores.neg_()
    assert q_sq is not None and g_sq is not None
    d = torch.addmm(q_sq[:, None] + g_sq[None, :], q, g.T, alpha=-2.0).clamp_(min=0.0)
    return d.sqrt_() if distance == "euclidean" else d


def _eligible(rows: slice, cols: slice, exclusions: _Exclusions, device: torch.device) -> Tensor | None:
    """Boolean ``(rows, cols)`` mask of the eligible pairs of a block, or None when all are eligible."""
    mask: Tensor | None = None
    if exclusions.sequence_ids is not None:
        mask = exclusions.sequence_ids[0][rows, None] != exclusions.sequence_ids[1][None, cols]
    if exclusions.search_groups is not None:
        same_group = exclusions.search_groups[0][rows, None] == exclusions.search_groups[1][None, cols]
        mask = same_group if mask is None else mask & same_group
    if exclusions.self_index is not None:
        own = exclusions.self_index[rows]
        n_cols = cols.stop - cols.start
        inside = (own >= cols.start) & (own < cols.stop)
        if bool(inside.any()):
            if mask is None:
                mask = torch.ones(own.numel(), n_cols, dtype=torch.bool, device=device)
            hit = torch.nonzero(inside).flatten()
            mask[hit, own[hit] - cols.start] = False
    if mask is not None and bool(mask.all()):
        return None
    return mask


def _iter_blocks(
    query: Tensor, gallery: Tensor, distance: str, exclusions: _Exclusions, chunk_size: int | None
) -> Iterator[DistanceBlock]:
    rows, cols = _block_sides(query.shape[0], gallery.shape[0], chunk_size)
    gallery_prepared, gallery_sq = _prepare(gallery, distance)
    for q0 in range(0, query.shape[0], rows):
        q_slice = slice(q0, min(q0 + rows, query.shape[0]))
        q, q_sq = _prepare(query[q_slice], distance)
        for g0 in range(0, gallery.shape[0], cols):
            g_slice = slice(g0, min(g0 + cols, gallery.shape[0]))
            g_sq = None if gallery_sq is None else gallery_sq[g_slice]
            d = _block_distances(q, q_sq, gallery_prepared[g_slice], g_sq, distance)
            eligible = _eligible(q_slice, g_slice, exclusions, query.device)
            if eligible is not None:
                d.masked_fill_(~eligible, float("inf"))
            yield DistanceBlock(q_slice, g_slice, d, eligible)


def distance_blocks(
    query: Tensor,
    gallery: Tensor,
    *,
    distance: Distance = "euclidean",
    self_index: Tensor | None = None,
    sequence_ids: tuple[Tensor, Tensor] | None = None,
    search_groups: tuple[Tensor, Tensor] | None = None,
    chunk_size: int | None = None,
) -> Iterator[DistanceBlock]:
    """Tile the ``(Q, G)`` query x gallery distance matrix in memory-bounded blocks.

    Every pair ``(q, g)`` lies in exactly one block. Blocks are sized so that one block (its distances,
    its mask and the temporaries) stays within ``BLOCK_BYTES``; ``chunk_size`` caps both sides of a block.
    Distances are computed on the tensors' device in float32 (float64 inputs in float64) by matmul
    expansion: ``euclidean`` ``sqrt(max(|q|^2 + |g|^2 - 2<q,g>, 0))``, ``sqeuclidean`` the same without the
    square root, ``cosine`` ``1 - <q/|q|, g/|g|>``, ``dot`` ``-<q,g>``. These are fast, not canonical:
    :func:`knn` recomputes the distances it returns exactly.

    A pair is excluded (distance ``+inf``, ``eligible`` False) when ``g`` is the query itself
    (``self_index[q] == g``), when both have the same sequence id, or when they are in different search
    groups. ``eligible`` is None when no pair of the block is excluded.

    Args:
        query: ``(Q, D)`` floating, finite.
        gallery: ``(G, D)`` floating, finite, on the device of ``query``.
        distance: one of ``DISTANCES``.
        self_index: ``(Q,)`` int64: the gallery position of each query, -1 when it is not in the gallery.
        sequence_ids: ``(query_side (Q,), gallery_side (G,))`` integer ids.
        search_groups: ``(query_side (Q,), gallery_side (G,))`` integer ids.
        chunk_size: int >= 1, the largest side of a block.

    Yields:
        :class:`DistanceBlock` ``(query_slice, gallery_slice, distances, eligible)``, row blocks outer.

    Example:
        >>> q = torch.tensor([[0.0], [1.0]])
        >>> blocks = list(distance_blocks(q, q, self_index=torch.tensor([0, 1]), chunk_size=1))
        >>> [(b.query_slice.start, b.gallery_slice.start, b.distances.tolist()) for b in blocks]
        [(0, 0, [[inf]]), (0, 1, [[1.0]]), (1, 0, [[1.0]]), (1, 1, [[inf]])]
    """
    query, gallery = _check_query_gallery(query, gallery)
    check_choice("distance", distance, DISTANCES)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    exclusions = _check_exclusions("self_index", self_index, sequence_ids, search_groups, query, gallery)
    # Validation runs now; the blocks are computed lazily.
    return _iter_blocks(query, gallery, distance, exclusions, chunk_size)


def knn(
    query: Tensor,
    gallery: Tensor | None = None,
    k: int = 1,
    *,
    distance: Distance = "euclidean",
    exclude_self: bool | Tensor | None = None,
    sequence_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    search_groups: Tensor | tuple[Tensor, Tensor] | None = None,
    backend: KNNBackend = "auto",
    chunk_size: int | None = None,
) -> KNNResult:
    raise NotImplementedError
