"""Exact k-nearest-neighbour search: the public face of the engine in :mod:`._search`.

* :func:`knn` returns the ``K`` nearest eligible gallery items of every query, nearest first, ties ordered by
  gallery position, identical for every backend and chunk size; :func:`knn_chunks` the same, query chunk
  by query chunk.
* :func:`distance_blocks` tiles the ``(Q, G)`` query x gallery distance matrix in memory-bounded blocks, with
  the excluded pairs (the query itself, the same sequence, another search group) marked.

This module checks the arguments (naming them as these functions do) and builds the problem; the engine
behind it takes only checked problems. Definitions: docs/definitions.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_choice,
    check_embeddings,
    check_id_pair,
    check_ids,
    check_positive_int,
    check_positive_int_or_none,
    check_self_index,
    describe,
)
from torchmetrics_retrieval.functional._search.blocks import iter_blocks
from torchmetrics_retrieval.functional._search.low_precision import SEARCH_PRECISIONS, SearchPrecision
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import (
    BACKENDS,
    DISTANCES,
    Distance,
    DistanceBlock,
    Exclusions,
    KNNBackend,
    KNNResult,
    RelevanceFn,
)

__all__ = [
    "BACKENDS",
    "DISTANCES",
    "SEARCH_PRECISIONS",
    "Distance",
    "DistanceBlock",
    "KNNBackend",
    "KNNResult",
    "SearchPrecision",
    "distance_blocks",
    "knn",
    "knn_chunks",
]


def _check_exclusions(
    self_name: str,
    self_index: object,
    sequence_ids: object,
    search_groups: object,
    query: Tensor,
    gallery: Tensor,
    one_set: bool = False,
) -> Exclusions:
    """The checked rules; ``one_set``: ids come as one tensor for the set searched against itself."""
    n_query, n_gallery, device = query.shape[0], gallery.shape[0], query.device
    own = None if self_index is None else check_self_index(self_name, self_index, n_query, n_gallery).to(device)
    seq = _check_id_rule("sequence_ids", sequence_ids, n_query, n_gallery, device, one_set)
    groups = _check_id_rule("search_groups", search_groups, n_query, n_gallery, device, one_set)
    return Exclusions(self_index=own, sequence_ids=seq, search_groups=groups)


def _check_id_rule(
    name: str, value: object, n_query: int, n_gallery: int, device: torch.device, one_set: bool
) -> tuple[Tensor, Tensor] | None:
    if value is None or not one_set:
        return check_id_pair(name, value, n_query, n_gallery, device)
    if isinstance(value, tuple):
        raise TypeError(f"`{name}` must be one tensor of shape (Q,) when `gallery` is None, got a tuple.")
    ids = check_ids(name, value, n_query, "query").to(device)
    return ids, ids


def _check_query_gallery(query: object, gallery: object) -> tuple[Tensor, Tensor]:
    query = check_embeddings("query", query)
    gallery = query if gallery is query else check_embeddings("gallery", gallery)
    if gallery.shape[1] != query.shape[1]:
        raise ValueError(f"`gallery` must have {query.shape[1]} columns like `query`, got {describe(gallery)}.")
    if gallery.device != query.device:
        raise ValueError(f"`gallery` must be on the device of `query` ({query.device}), got {gallery.device}.")
    return query, gallery


# ----------------------------------------------------------------------------------------------------------------------


def distance_blocks(
    query: Tensor,
    gallery: Tensor,
    *,
    distance: Distance = "euclidean",
    self_index: Tensor | None = None,
    sequence_ids: tuple[Tensor, Tensor] | None = None,
    search_groups: tuple[Tensor, Tensor] | None = None,
    chunk_size: int | None = None,
    exact: bool = False,
) -> Iterator[DistanceBlock]:
    """Tile the ``(Q, G)`` query x gallery distance matrix in memory-bounded blocks.

    Every pair ``(q, g)`` lies in exactly one block. Blocks are sized so that one block (its distances,
    its mask and the temporaries) stays within ``BLOCK_BYTES``; ``chunk_size`` caps both sides of a block.
    Distances are computed on the tensors' device in float32 (float64 inputs in float64) by matmul
    expansion: ``euclidean`` ``sqrt(max(|q|^2 + |g|^2 - 2<q,g>, 0))``, ``sqeuclidean`` the same without the
    square root, ``cosine`` ``1 - <q/|q|, g/|g|>``, ``dot`` ``-<q,g>``. These are fast, not canonical.
    With ``exact=True`` they are the canonical distances that :func:`knn` reports (float64, cast to the
    query dtype), so rankings built from the blocks order ties exactly as :func:`knn` does; about twice
    the cost.

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
        exact: canonical distances (see above).

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
    check_positive_int_or_none("chunk_size", chunk_size)
    check_bool("exact", exact)
    exclusions = _check_exclusions("self_index", self_index, sequence_ids, search_groups, query, gallery)
    # Validation runs now; the blocks are computed lazily.
    return iter_blocks(query, gallery, distance, exclusions, chunk_size, exact)


# ----------------------------------------------------------------------------------------------------------------------


def _self_index(exclude_self: object, query: Tensor, gallery: Tensor | None) -> Tensor | None:
    """Gallery position of each query (or None) from ``exclude_self``."""
    if exclude_self is None:
        exclude_self = gallery is None
    if isinstance(exclude_self, bool):
        if not exclude_self:
            return None
        if gallery is not None and gallery.shape[0] != query.shape[0]:
            raise ValueError(
                "`exclude_self=True` means query i is gallery item i, so `gallery` must have "
                f"{query.shape[0]} rows like `query`, got {describe(gallery)}."
            )
        return torch.arange(query.shape[0], device=query.device)
    if isinstance(exclude_self, Tensor):
        return exclude_self
    raise TypeError(
        f"`exclude_self` must be None, a bool or an int64 tensor of shape (Q,), got {describe(exclude_self)}."
    )


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
    exact_distances: bool = True,
    search_precision: SearchPrecision = "auto",
) -> KNNResult:
    r"""Exact k nearest eligible gallery items of every query, nearest first, ties by gallery position.

    The gallery of query q is every gallery item except: q itself (by position, never by comparing
    vectors: a duplicate of q is a real neighbour at distance 0), items with the same sequence id as q,
    and items of another search group than q. Items are ranked by distance ascending, equal distances by
    gallery position ascending. The result is identical for every backend and chunk size.

    Distances (float64 per pair, then cast to the query's dtype): ``euclidean`` :math:`\|q-g\|_2`,
    ``sqeuclidean`` :math:`\|q-g\|_2^2`, ``cosine`` :math:`1 - \langle q,g\rangle / (\|q\|\|g\|)`, ``dot``
    :math:`-\langle q,g\rangle`.

    How: stage 1 finds ``K + margin`` candidates per query with float32 keys (torch: blocked ``addmm`` with
    a running per-row threshold, first estimated from a sample, scanned by compiled code on the CPU; faiss:
    a flat index, with a range search below estimated thresholds for large K); stage 2 recomputes
    their distances canonically in float64 and sorts them; a certificate (the K-th distance is below what
    any non-candidate can reach, given a rigorous float32 rounding bound) proves the answer exact, and the
    rows without a certificate (near-ties at the boundary, or an estimate that fell short) are searched
    again with twice as many candidates. Memory is bounded: the embeddings, float64 copies of them, the
    result and a few blocks.

    Args:
        query: ``(Q, D)`` floating, finite.
        gallery: ``(G, D)`` floating, finite, same device; None means the queries themselves.
        k: int >= 1. The result has ``K = min(k, G)`` columns, trimmed to the largest number of eligible
            items of any query.
        distance: ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"`` or ``"dot"``.
        exclude_self: None (True iff ``gallery`` is None); True: query i is gallery item i and is
            excluded from its own gallery; False; or an int64 tensor ``(Q,)`` with the gallery position of
            each query (-1: not in the gallery).
        sequence_ids: integer ids; items of the query's sequence are excluded. One ``(Q,)`` tensor when
            ``gallery`` is None, else a ``(query_side (Q,), gallery_side (G,))`` pair.
        search_groups: integer ids; only items of the query's group are searched. Same form as
            ``sequence_ids``.
        backend: ``"auto"`` (the fastest in our benchmark: on the CPU with compiled scans, torch for a set
            searched against itself, where each distance block is computed once, and for large K; torch for
            search groups and off the CPU; faiss otherwise),
            ``"torch"`` or ``"faiss"`` (CPU, or GPU with faiss-gpu; falls back to torch with a warning for
            search groups or CUDA tensors without faiss-gpu).
        chunk_size: int >= 1, caps the query rows and gallery columns of a block (testing, memory).
        exact_distances: True: every returned distance is the canonical float64 one (identical for every
            backend). False: the neighbours and their order are the same, but only near-tied candidates
            get the float64 recomputation; the others report the distance of their float32 search key,
            within its rounding bound of the canonical one. Faster with large K when only the neighbours
            are needed.
        search_precision: ``"auto"``, ``"float32"`` or ``"bfloat16"``: the precision of stage 1's products
            (torch stage). bfloat16 candidates are certified against a wider rounding bound, so the result is
            identical; ``"auto"`` takes bfloat16 where it measures faster (CPUs with AMX or AVX512-BF16,
            GPUs with bfloat16 tensor cores). A bfloat16 search whose bound leaves too many queries undecided
            continues in float32.

    Returns:
        :class:`KNNResult` ``(distances (Q, K), indices (Q, K) int64, valid (Q, K) bool)``; where a query
        has fewer than K eligible items the missing slots hold distance +inf, index 0, valid False.

    Raises:
        TypeError, ValueError: naming the argument, for malformed inputs.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [1.0], [3.0]])
        >>> result = knn(x, k=2)
        >>> result.indices.tolist()
        [[1, 2], [2, 0], [1, 0], [1, 2]]
        >>> result.distances.tolist()
        [[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [2.0, 2.0]]
    """
    search = _checked_search(
        query, gallery, k, distance, exclude_self, sequence_ids, search_groups, backend, chunk_size, exact_distances,
        search_precision,
    )  # fmt: skip
    return search(torch.arange(search.problem.query.shape[0], device=search.problem.query.device))


def knn_chunks(
    query: Tensor,
    gallery: Tensor | None = None,
    k: int = 1,
    *,
    rows_per_chunk: int,
    distance: Distance = "euclidean",
    exclude_self: bool | Tensor | None = None,
    sequence_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    search_groups: Tensor | tuple[Tensor, Tensor] | None = None,
    backend: KNNBackend = "auto",
    chunk_size: int | None = None,
    exact_distances: bool = True,
    relevance: RelevanceFn | None = None,
    search_precision: SearchPrecision = "auto",
) -> Iterator[tuple[Tensor, KNNResult]]:
    """:func:`knn`, query chunk by query chunk: yields ``(query positions, their KNNResult)`` for
    consecutive chunks of ``rows_per_chunk`` queries, each identical to those rows of :func:`knn`'s result.

    For consumers that reduce each chunk (metrics) and never need the whole ``(Q, K)`` table; the inputs
    are checked and the gallery prepared once, before the first chunk. Arguments as in :func:`knn`, and:

    ``relevance`` (only with ``exact_distances=False``): ``fn(query positions (R,), gallery positions
    (R, n)) -> (R, n) bool``, which retrieved items are relevant. For metrics that depend on the relevance
    at each rank only: near-tied candidates that are all relevant or all irrelevant may then keep their
    float32 order instead of the exact one (saving their float64 recomputation), so the indices may differ
    from :func:`knn`'s within such a stretch, while the relevance of every rank is exactly :func:`knn`'s.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [1.0], [3.0]])
        >>> [(rows.tolist(), found.indices.tolist()) for rows, found in knn_chunks(x, k=1, rows_per_chunk=3)]
        [([0, 1, 2], [[1], [2], [1]]), ([3], [[1]])]
    """
    rows_per_chunk = check_positive_int("rows_per_chunk", rows_per_chunk)
    if relevance is not None and not callable(relevance):
        raise TypeError(f"`relevance` must be None or a callable, got {describe(relevance)}.")
    if relevance is not None and exact_distances is not False:
        raise ValueError(f"`relevance` needs exact_distances=False, got exact_distances={exact_distances!r}.")
    search = _checked_search(
        query, gallery, k, distance, exclude_self, sequence_ids, search_groups, backend, chunk_size, exact_distances,
        search_precision,
    )._replace(relevance=relevance)  # fmt: skip
    queries = torch.arange(search.problem.query.shape[0], device=search.problem.query.device)
    return ((rows, search(rows)) for rows in queries.split(rows_per_chunk))


def _checked_search(
    query: Tensor,
    gallery: Tensor | None,
    k: int,
    distance: str,
    exclude_self: bool | Tensor | None,
    sequence_ids: Tensor | tuple[Tensor, Tensor] | None,
    search_groups: Tensor | tuple[Tensor, Tensor] | None,
    backend: str,
    chunk_size: int | None,
    exact_distances: bool,
    search_precision: str = "auto",
) -> Search:
    """Check the arguments of :func:`knn` (as it documents them) and prepare the search."""
    k = check_positive_int("k", k)
    check_choice("distance", distance, DISTANCES)
    check_choice("backend", backend, BACKENDS)
    check_choice("search_precision", search_precision, SEARCH_PRECISIONS)
    check_positive_int_or_none("chunk_size", chunk_size)
    check_bool("exact_distances", exact_distances)
    same_set = gallery is None
    query, gallery_ = _check_query_gallery(query, query if gallery is None else gallery)
    exclusions = _check_exclusions(
        "exclude_self",
        _self_index(exclude_self, query, gallery),
        sequence_ids,
        search_groups,
        query,
        gallery_,
        one_set=same_set,
    )
    # the documented dtype of knn's distances is the query's, half precision included
    problem = make_problem(query, gallery_, distance, exclusions, same_set, dtype=query.dtype)
    return Search.prepare(
        problem, k, backend=backend, chunk_size=chunk_size, exact_distances=exact_distances, precision=search_precision
    )
