"""Exact k-nearest-neighbour search (INTERFACE STUB: being implemented; signatures are fixed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple

from torch import Tensor

Distance = Literal["euclidean", "sqeuclidean", "cosine", "dot"]
KNNBackend = Literal["auto", "torch", "faiss"]
DISTANCES: tuple[str, ...] = ("euclidean", "sqeuclidean", "cosine", "dot")
BACKENDS: tuple[str, ...] = ("auto", "torch", "faiss")


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
    raise NotImplementedError
