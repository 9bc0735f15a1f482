"""Exact k-nearest-neighbour search, block by block, with exclusions and a deterministic tie order.

Two public entry points:

* :func:`distance_blocks` tiles the ``(Q, G)`` query x gallery distance matrix in memory-bounded
  blocks, with the excluded pairs (the query itself, the same sequence, another search group) marked.
* :func:`knn` returns the ``K`` nearest eligible gallery items of every query, nearest first, ties
  ordered by gallery position, identical for every backend and chunk size.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional import _compiled_buffer
from torchmetrics_retrieval.functional._checks import (
    check_choice,
    check_embeddings,
    check_positive_int,
    check_same_length,
    describe,
)
from torchmetrics_retrieval.functional._compiled_order import mixed_runs, order_runs, sort_by_key
from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._stream_topk import (
    BlockMemory,
    addmm_keys,
    buffer_width,
    sample_size,
    sample_thresholds,
    stream_topk,
    stream_topk_symmetric,
)
from torchmetrics_retrieval.functional._symmetric_sweep import SymmetricSweep

__all__ = [
    "BACKENDS",
    "DISTANCES",
    "Distance",
    "DistanceBlock",
    "KNNBackend",
    "KNNResult",
    "distance_blocks",
    "knn",
    "knn_chunks",
]

Distance = Literal["euclidean", "sqeuclidean", "cosine", "dot"]
#: ``(query positions (R,), gallery positions (R, n)) -> (R, n) bool``: which retrieved items are relevant.
RelevanceFn = Callable[[Tensor, Tensor], Tensor]
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
    gallery = query if gallery is query else check_embeddings("gallery", gallery)
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


def _prepare(x: Tensor, distance: str, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor | None]:
    """Rows in ``dtype`` (default: the compute dtype; unit rows for cosine) and their squared norms (L2 only)."""
    x = x.to(dtype or _compute_dtype(x))
    if distance == "cosine":
        return torch.nn.functional.normalize(x, dim=1), None
    if distance in ("euclidean", "sqeuclidean"):
        return x, (x * x).sum(dim=1)
    return x, None


def _stage_rows(x64: Tensor, sq64: Tensor, distance: str) -> tuple[Tensor, Tensor | None]:
    """Float32 rows of a stage-1 search and their squared norms (L2 only), each entry the rounding of its
    float64 value: cosine rows are normalised in float64, the norms are the canonical ones. So every
    stage input is within one rounding of its exact value, as :func:`_key_tolerance` assumes."""
    if distance == "cosine":
        return (x64 / sq64.sqrt()[:, None]).to(torch.float32), None
    return x64.to(torch.float32), sq64.to(torch.float32) if distance in ("euclidean", "sqeuclidean") else None


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


def _exact_block(q64: Tensor, q_sq: Tensor, g64: Tensor, g_sq: Tensor, distance: str) -> Tensor:
    """Canonical float64 distances of a block (the formula :func:`knn` reports)."""

    def direct_sq(close: tuple[Tensor, ...]) -> Tensor:
        diff = q64[close[0]] - g64[close[1]]
        return (diff * diff).sum(dim=1)

    return _distances_from_dots(q64 @ g64.T, q_sq[:, None], g_sq[None, :], distance, direct_sq)


def _iter_blocks(
    query: Tensor, gallery: Tensor, distance: str, exclusions: _Exclusions, chunk_size: int | None, exact: bool
) -> Iterator[DistanceBlock]:
    rows, cols = _block_sides(query.shape[0], gallery.shape[0], chunk_size, bytes_per_pair=32 if exact else 16)
    if exact:
        query64, gallery64 = query.to(torch.float64), gallery.to(torch.float64)
        query_sq64, gallery_sq64 = _self_dots(query64), _self_dots(gallery64)
    else:
        gallery_prepared, gallery_sq = _prepare(gallery, distance)
    for q0 in range(0, query.shape[0], rows):
        q_slice = slice(q0, min(q0 + rows, query.shape[0]))
        if not exact:
            q, q_sq = _prepare(query[q_slice], distance)
        for g0 in range(0, gallery.shape[0], cols):
            g_slice = slice(g0, min(g0 + cols, gallery.shape[0]))
            if exact:
                d = _exact_block(
                    query64[q_slice], query_sq64[q_slice], gallery64[g_slice], gallery_sq64[g_slice], distance
                ).to(query.dtype)
            else:
                g_sq = None if gallery_sq is None else gallery_sq[g_slice]
                with ieee_float32_matmul():  # not inside a yield: the consumer runs with its own settings
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
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    exclusions = _check_exclusions("self_index", self_index, sequence_ids, search_groups, query, gallery)
    # Validation runs now; the blocks are computed lazily.
    return _iter_blocks(query, gallery, distance, exclusions, chunk_size, exact)


# ----------------------------------------------------------------------------------------------------------------------
# knn: problem set-up
# ----------------------------------------------------------------------------------------------------------------------

#: Stage-1 candidates per query: ``K + min(MAX_MARGIN, max(MIN_MARGIN, K // MARGIN_DIVISOR))``. A thin margin
#: keeps stage 1 cheap; the rows it leaves without a certificate (0-0.15% of the queries on the benchmark's
#: clustered data) are searched again alone, with twice the candidates.
MIN_MARGIN = 2
MARGIN_DIVISOR = 32
MAX_MARGIN = 64
#: Margin on the worst-case float32 rounding bound of the stage-1 keys (see ``_key_tolerance``).
TOLERANCE_FACTOR = 1.5
#: Rows and columns of a stage-1 block of the torch backend (measured with benchmarks/bench_knn.py).
STAGE1_ROWS = 512
STAGE1_COLUMNS = 4096
#: Without compiled scans, ``auto`` uses the symmetric torch stage from this many samples and up to this
#: many candidates per query.
AUTO_TORCH_MIN_N = 60_000
AUTO_TORCH_MAX_KP = 48
#: Largest candidate buffer (bytes) of the symmetric search, which holds every query's candidates at once.
SYMMETRIC_BUFFER_BYTES = 768 * 2**20
#: Largest number of candidate pairs recomputed canonically at once (stage 2).
STAGE2_PAIRS = 2**20
#: The faiss stage's first round takes a range search below estimated thresholds from this many candidates
#: per query and galleries of at least ``RANGE_GALLERY_PER_KP * kp`` items (measured: see benchmarks/README.md).
RANGE_MIN_KP = 64
RANGE_GALLERY_PER_KP = 16
#: Faiss GPU indexes cannot return more neighbours than this.
FAISS_GPU_MAX_K = 2048


def _candidates_per_query(k: int, n_gallery: int) -> int:
    """Stage-1 candidates per query for ``k`` neighbours: ``k`` plus the margin."""
    return min(n_gallery, k + min(MAX_MARGIN, max(MIN_MARGIN, k // MARGIN_DIVISOR)))


def _symmetric_buffer_fits(n: int, kp: int) -> bool:
    return n * buffer_width(kp) * 8 <= SYMMETRIC_BUFFER_BYTES


def symmetric_search_fits(n: int, k: int) -> bool:
    """Whether a set of ``n`` samples searched against itself for ``k`` neighbours takes the symmetric torch
    stage in one pass (its candidate buffer for every sample fits ``SYMMETRIC_BUFFER_BYTES``)."""
    return _symmetric_buffer_fits(n, _candidates_per_query(k, n))


class _Problem(NamedTuple):
    """A validated kNN problem with the per-row data every stage needs."""

    query: Tensor  # (Q, D) as given
    gallery: Tensor  # (G, D) as given
    distance: str
    exclusions: _Exclusions
    n_eligible: Tensor  # (Q,) int64: eligible gallery items of each query
    query64: Tensor  # (Q, D) float64 (canonical stage)
    gallery64: Tensor  # (G, D) float64
    query_sq64: Tensor  # (Q,) canonical <q, q>
    gallery_sq64: Tensor  # (G,) canonical <g, g>
    symmetric: bool  # the set against itself with symmetric exclusions: each distance serves both sides

    def stage_query(self, rows: Tensor) -> Tensor:
        """The float32 stage-1 rows of the queries ``rows`` (see :func:`_stage_rows`)."""
        return _stage_rows(self.query64[rows], self.query_sq64[rows], self.distance)[0]

    def stage_gallery(self) -> tuple[Tensor, Tensor | None]:
        """The float32 stage-1 gallery rows and squared norms (L2 only)."""
        return _stage_rows(self.gallery64, self.gallery_sq64, self.distance)


def _take_rows(exclusions: _Exclusions, rows: Tensor) -> _Exclusions:
    """The exclusions of a subset of the queries."""
    seq, groups = exclusions.sequence_ids, exclusions.search_groups
    return _Exclusions(
        self_index=None if exclusions.self_index is None else exclusions.self_index[rows],
        sequence_ids=None if seq is None else (seq[0][rows], seq[1]),
        search_groups=None if groups is None else (groups[0][rows], groups[1]),
    )


def _dense_ids(query_side: Tensor, gallery_side: Tensor) -> tuple[Tensor, Tensor, int]:
    """Both sides of an id pair mapped to 0..U-1 (same id, same number), and U."""
    unique, inverse = torch.unique(torch.cat([query_side, gallery_side]), return_inverse=True)
    n_query = query_side.shape[0]
    return inverse[:n_query], inverse[n_query:], unique.numel()


def _same_id_count(query_ids: Tensor, gallery_ids: Tensor, n_ids: int) -> Tensor:
    """For each query, the number of gallery items with the same dense id."""
    return torch.bincount(gallery_ids, minlength=n_ids)[query_ids]


def _count_eligible(exclusions: _Exclusions, n_query: int, n_gallery: int, device: torch.device) -> Tensor:
    """Number of eligible gallery items of each query, ``(Q,)`` int64, without any ``(Q, G)`` matrix."""
    count = torch.full((n_query,), n_gallery, dtype=torch.long, device=device)
    group_q = group_g = seq_q = seq_g = None
    if exclusions.search_groups is not None:
        group_q, group_g, n_groups = _dense_ids(*exclusions.search_groups)
        count = _same_id_count(group_q, group_g, n_groups)
    if exclusions.sequence_ids is not None:
        seq_q, seq_g, n_seq = _dense_ids(*exclusions.sequence_ids)
        if group_q is not None and group_g is not None:  # same sequence *and* same group
            count = count - _same_id_count(group_q * n_seq + seq_q, group_g * n_seq + seq_g, n_groups * n_seq)
        else:
            count = count - _same_id_count(seq_q, seq_g, n_seq)
    if exclusions.self_index is not None:
        own = exclusions.self_index
        present = own >= 0
        safe = own.clamp(min=0)
        if seq_q is not None and seq_g is not None:
            present &= seq_g[safe] != seq_q
        if group_q is not None and group_g is not None:
            present &= group_g[safe] == group_q
        count = count - present.long()
    return count


def _canonical_dots(rows: Tensor, cols: Tensor, query64: Tensor, gallery64: Tensor) -> Tensor:
    """``<query64[rows[i]], gallery64[cols[i]]>`` in float64, each pair computed on its own.

    A sampled dense-dense product (one dot product per listed pair, no gathered copies): the value of a
    pair does not depend on which other pairs are computed with it, so it is the same for every backend,
    chunk size and query order. (Measured: faster than a compiled per-pair loop, both limited by fetching
    the rows of random items.) The pairs are grouped by the side with more rows, so that the rows fetched
    at random come from the smaller side, which stays in cache: at 2036 queries against 100k items,
    0.05 s instead of 0.08 s for 490k pairs. Both groupings give the same values bit for bit: the kernel
    sums the elementwise products of the two rows in the same order either way.
    """
    n_pairs = rows.numel()
    if n_pairs == 0:
        return torch.zeros(0, dtype=torch.float64, device=query64.device)
    if gallery64.shape[0] > query64.shape[0]:
        rows, cols, query64, gallery64 = cols, rows, gallery64, query64
    # CSR needs the pairs grouped by row (columns within a row may come in any order; each value is its
    # own dot product). Pairs from ``nonzero`` are already row-major: sort only when they are not.
    in_order = bool((rows[1:] >= rows[:-1]).all())
    if in_order:
        order = torch.arange(n_pairs, device=rows.device)
    else:  # (int32 keys sort in half the time of int64 ones)
        order = torch.sort(rows.int() if query64.shape[0] < 2**31 else rows, stable=True).indices
    r, c = (rows, cols) if in_order else (rows[order], cols[order])
    crow = torch.zeros(query64.shape[0] + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=query64.shape[0]), 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        pattern = torch.sparse_csr_tensor(
            crow,
            c,
            torch.zeros(n_pairs, dtype=torch.float64, device=rows.device),
            size=(query64.shape[0], gallery64.shape[0]),
            check_invariants=False,
        )
        values = torch.sparse.sampled_addmm(pattern, query64, gallery64.T, beta=0.0).values()
    if in_order:
        return values
    out = torch.empty_like(values)
    out[order] = values
    return out


def _self_dots(x64: Tensor) -> Tensor:
    """``<x_i, x_i>`` by the same kernel as :func:`_canonical_dots` (so exact duplicates get distance 0)."""
    idx = torch.arange(x64.shape[0], device=x64.device)
    return _canonical_dots(idx, idx, x64, x64)


def _make_problem(query: Tensor, gallery: Tensor, distance: str, exclusions: _Exclusions, same_set: bool) -> _Problem:
    query64 = query.to(torch.float64)
    gallery64 = query64 if same_set else gallery.to(torch.float64)
    query_sq64 = _self_dots(query64)
    gallery_sq64 = query_sq64 if same_set else _self_dots(gallery64)
    if distance == "cosine":
        for name, sq in (("query", query_sq64), ("gallery", gallery_sq64)):
            if bool((sq == 0).any()):
                raise ValueError(
                    f"`{name}` must have no all-zero row with distance='cosine', got {int((sq == 0).sum())}."
                )
    n_eligible = _count_eligible(exclusions, query.shape[0], gallery.shape[0], query.device)
    own = exclusions.self_index
    symmetric = same_set and (own is None or bool((own == torch.arange(own.numel(), device=own.device)).all()))
    return _Problem(
        query, gallery, distance, exclusions, n_eligible, query64, gallery64, query_sq64, gallery_sq64, symmetric
    )


# ----------------------------------------------------------------------------------------------------------------------
# knn: stage 1, approximate candidates by a float32 ranking key
# ----------------------------------------------------------------------------------------------------------------------
#
# The key of a pair ranks like the distance: ``|g|^2 - 2<q,g>`` (L2; |q|^2 is constant per query), ``-<q,g>``
# (dot) and ``-<q/|q|, g/|g|>`` (cosine). A stage returns, per query, ``kp`` candidates (gallery
# positions, ok = a real eligible item) and a floor per query: every eligible item that is not a
# candidate has a key >= the floor. The floor is the largest candidate key when the stage found ``kp``
# candidates by exact selection, +inf when it found every eligible item, and the estimated threshold
# of the torch stage when that estimate turned out too low (fewer than ``kp`` candidates).


class _Candidates(NamedTuple):
    indices: Tensor  # (R, kp) int64
    ok: Tensor  # (R, kp) bool
    floor: Tensor  # (R,) float: no non-candidate has a smaller key
    keys: Tensor  # (R, kp) float: the stage-1 keys (meaningful where ok)
    rounding: int  # the keys' rounding bound in units of u * scale (see ``_key_tolerance``)

    def take(self, rows: Tensor) -> _Candidates:
        """The candidates of a subset of the rows."""
        return self._replace(indices=self.indices[rows], ok=self.ok[rows], floor=self.floor[rows], keys=self.keys[rows])


def _rounding_terms(dim: int, threshold_in_product: bool = False) -> int:
    """Rounding bound of a stage's float32 keys in units of ``u * scale`` (``u = 2**-24``, see
    :func:`_key_tolerance`): ``D + 6``, or ``2 D + 8`` when the query's threshold is a term of the product."""
    return 2 * dim + 8 if threshold_in_product else dim + 6


def _mask_excluded_(exclusions: _Exclusions, keys: Tensor, rows: slice, cols: slice | Tensor) -> None:
    """Set the keys of the excluded pairs of the block ``(rows, cols)`` to +inf, in place.

    ``cols`` is a slice of gallery positions, or an index tensor of them (the sample pre-pass).
    """
    if exclusions.sequence_ids is not None:
        same = exclusions.sequence_ids[0][rows, None] == exclusions.sequence_ids[1][None, cols]
        keys.masked_fill_(same, float("inf"))
    if exclusions.search_groups is not None:
        other = exclusions.search_groups[0][rows, None] != exclusions.search_groups[1][None, cols]
        keys.masked_fill_(other, float("inf"))
    if exclusions.self_index is not None:
        own = exclusions.self_index[rows]
        if isinstance(cols, Tensor):
            keys.masked_fill_(own[:, None] == cols[None, :], float("inf"))
            return
        hit = torch.nonzero((own >= cols.start) & (own < cols.stop)).flatten()
        keys[hit, own[hit] - cols.start] = float("inf")


class _SymmetricKeys:
    """Symmetric keys of a set against itself from one ``(N, D + 2)`` copy of its rows ``[x, h, 1]``: half the
    squared L2 distance ``h_i + h_j - <x_i, x_j> = <[-x_i, 1, h_i], [x_j, h_j, 1]>`` (``h = |x|^2 / 2``; the
    left rows are made for one row block at a time), or ``-<x_i, x_j>`` (dot, cosine, from ``x`` alone).
    Each block is valid until the next (:class:`BlockMemory`).

    The product sums ``D + 2`` terms of total size ``(|x_i| + |x_j|)^2 / 2``, as in ``_key_tolerance``'s
    symmetric case; the keys of (i, j) and (j, i) may differ by rounding, each within that bound.
    """

    def __init__(self, x: Tensor, half_sq: Tensor | None) -> None:
        self.dim = x.shape[1]
        self.rows = x if half_sq is None else torch.cat([x, half_sq[:, None], torch.ones_like(x[:, :1])], dim=1)
        self.memory = BlockMemory()
        self.left: tuple[slice | None, Tensor | None] = (None, None)  # the left rows of the last row block

    @property
    def x(self) -> Tensor:
        """The rows ``x`` (a view)."""
        return self.rows[:, : self.dim]

    def _left_rows(self, rows: slice) -> Tensor:
        cached_rows, left = self.left
        if left is None or cached_rows != rows:
            right = self.rows[rows]
            if self.rows.shape[1] == self.dim:
                left = -right
            else:  # [-x, 1, h] from [x, h, 1]
                left = torch.cat([-right[:, : self.dim], right[:, [self.dim + 1, self.dim]]], dim=1)
            self.left = (rows, left)
        return left

    def __call__(self, rows: slice, cols: slice | Tensor) -> Tensor:
        left, right = self._left_rows(rows), self.rows[cols]
        return torch.mm(left, right.T, out=self.memory(left.shape[0], right.shape[0], left))


class _TorchStage:
    """Stage 1 on the tensors' device: blocked ``addmm`` keys and a streaming threshold selection.

    A set searched against itself (``gallery=None``) takes the symmetric path for the first round: every
    distance block serves its row queries and, transposed, its column queries (half the matrix products),
    in one pass when every query's candidates fit in memory and group by group (:class:`SymmetricSweep`)
    when they do not. Later rounds (a few uncertified queries, more candidates) search their rows against
    the whole gallery.
    """

    def __init__(self, problem: _Problem, chunk_size: int | None) -> None:
        self.problem = problem
        gallery, gallery_sq = problem.stage_gallery()
        self.bias = gallery_sq if gallery_sq is not None else torch.zeros_like(gallery[:, 0])
        self.alpha = -2.0 if gallery_sq is not None else -1.0
        self.rows = min(STAGE1_ROWS, chunk_size or STAGE1_ROWS)
        self.cols = max(1, min(STAGE1_COLUMNS, chunk_size or STAGE1_COLUMNS, gallery.shape[0]))
        self.symmetric = problem.symmetric
        if self.symmetric:  # one copy of the rows serves the symmetric keys and, as a view, the other rounds
            self.symmetric_keys = _SymmetricKeys(gallery, None if gallery_sq is None else gallery_sq / 2)
            gallery = self.symmetric_keys.x
        self.gallery = gallery
        self._all_rows: _Candidates | None = None
        self._sweep: SymmetricSweep | None = None

    def __call__(self, rows: Tensor, kp: int, first_round: bool) -> _Candidates:
        """Candidates of ``rows``; the first round starts from estimated thresholds (cheaper, may fall short)."""
        n_query = self.problem.query.shape[0]
        if first_round and self.symmetric and _symmetric_buffer_fits(n_query, kp):
            if self._all_rows is None:
                self._all_rows = self._search_symmetric(kp)
            return self._all_rows.take(rows)
        if first_round and self.symmetric and _compiled_buffer.available(rows.device, n_query, n_query):
            found = self._sweep_take(rows, kp)
            if found is not None:
                return found
        return self._search(rows, kp, estimate=first_round)

    def _candidates(self, found: tuple[Tensor, Tensor, Tensor]) -> _Candidates:
        keys, positions, floor = found
        return _Candidates(positions, keys < float("inf"), floor, keys, _rounding_terms(self.gallery.shape[1]))

    def _from_symmetric(self, found: tuple[Tensor, Tensor, Tensor], rows: Tensor | slice) -> _Candidates:
        """Candidates from symmetric keys, which for L2 become ``|g|^2 - 2<q, g> = 2 * key - |q|^2``."""
        keys, positions, floor = found
        if self.alpha == -2.0:
            floor = 2.0 * floor - self.bias[rows]
            keys = 2.0 * keys - self.bias[rows, None]
        return self._candidates((keys, positions, floor))

    def _search_symmetric(self, kp: int) -> _Candidates:
        mask = functools.partial(_mask_excluded_, self.problem.exclusions)
        n = self.gallery.shape[0]
        found = stream_topk_symmetric(
            self.symmetric_keys, n, kp, mask, rows_per_chunk=self.rows, cols_per_block=self.cols, estimate=True
        )
        return self._from_symmetric(found, slice(None))

    def _sweep_take(self, rows: Tensor, kp: int) -> _Candidates | None:
        """The candidates of consecutive ``rows`` from the symmetric sweep (None: not the sweep's next rows)."""
        start = int(rows[0])
        if not bool((rows == torch.arange(start, start + rows.numel(), device=rows.device)).all()):
            return None
        if self._sweep is None:
            mask = functools.partial(_mask_excluded_, self.problem.exclusions)
            n = self.gallery.shape[0]
            self._sweep = SymmetricSweep(
                self.symmetric_keys, n, kp, mask, rows_per_chunk=self.rows, cols_per_block=self.cols
            )
        found = self._sweep.take(start, start + rows.numel())
        return None if found is None else self._from_symmetric(found, rows)

    def _search(self, rows: Tensor, kp: int, estimate: bool) -> _Candidates:
        problem = self.problem
        query = self.gallery[rows] if self.symmetric else problem.stage_query(rows)
        mask = functools.partial(_mask_excluded_, _take_rows(problem.exclusions, rows))
        found = stream_topk(
            query,
            self.gallery,
            self.bias,
            self.alpha,
            kp,
            mask,
            rows_per_chunk=self.rows,
            cols_per_block=self.cols,
            estimate=estimate,
        )
        return self._candidates(found)


def _faiss_module() -> Any:
    try:
        import faiss  # optional dependency, imported lazily
    except ImportError as error:  # pragma: no cover - faiss-cpu is a dependency
        raise ImportError("backend='faiss' needs faiss: `pip install faiss-cpu` (or faiss-gpu).") from error
    return faiss


class _FaissStage:
    """Stage 1 with a faiss flat inner-product index (exact search in float32) on augmented rows.

    The index holds ``g' = [2g, -|g|^2, 1]`` (L2) or ``[g, 1]`` (dot, cosine) and a query is sent as
    ``q' = [q, 1, t]`` or ``[q, t]``, so that ``<q', g'> = t - key(q, g)``: with ``t = 0`` a top-k search
    by inner product ranks by key, and a range search ``<q', g'> > 0`` keeps exactly the items whose key
    is below a per-query threshold ``t``. The first round of a large search (``kp >= RANGE_MIN_KP``, CPU)
    takes that range search with thresholds estimated from a gallery sample: one fused product-and-compare
    pass in faiss, instead of a top-k selection that is expensive for large K. Later rounds, and rows the
    sample shows crowded at their threshold, take the top-k search.

    Faiss cannot exclude items during the search: the top-k search fetches ``kp`` plus the largest number
    of excluded items of any query, and the excluded items are dropped from both answers.
    """

    def __init__(self, problem: _Problem, *, use_gpu: bool) -> None:
        faiss = _faiss_module()
        self.problem = problem
        gallery, gallery_sq = problem.stage_gallery()
        self.l2 = gallery_sq is not None
        self.gallery, self.bias = gallery, gallery_sq if gallery_sq is not None else torch.zeros_like(gallery[:, 0])
        self.alpha = -2.0 if self.l2 else -1.0
        ones = torch.ones_like(gallery[:, :1])
        augmented = torch.cat([2.0 * gallery, -self.bias[:, None], ones] if self.l2 else [gallery, ones], dim=1)
        index = faiss.IndexFlatIP(augmented.shape[1])
        index.add(augmented.detach().cpu().contiguous().numpy())
        self.index = faiss.index_cpu_to_all_gpus(index) if use_gpu else index
        self.use_range = not use_gpu
        self.n_excluded = problem.gallery.shape[0] - problem.n_eligible

    def _augmented(self, query: Tensor, thresholds: Tensor | None = None) -> Any:
        """Prepared float32 query rows as the augmented numpy rows ``[q, 1, t]`` / ``[q, t]`` (default t = 0)."""
        t = torch.zeros_like(query[:, :1]) if thresholds is None else thresholds[:, None].to(query.dtype)
        parts = [query, torch.ones_like(t), t] if self.l2 else [query, t]
        return torch.cat(parts, dim=1).detach().cpu().contiguous().numpy()

    def __call__(self, rows: Tensor, kp: int, first_round: bool) -> _Candidates:
        n_gallery = self.problem.gallery.shape[0]
        large = kp >= RANGE_MIN_KP and n_gallery >= RANGE_GALLERY_PER_KP * kp
        if first_round and self.use_range and large and sample_size(n_gallery, kp) < n_gallery:
            return self._range(rows, kp)
        return self._top(rows, kp)

    def _top(self, rows: Tensor, kp: int) -> _Candidates:
        """Exact float32 top-k selection: the largest candidate key is the floor of a full row."""
        problem = self.problem
        n_fetch = min(problem.gallery.shape[0], kp + int(self.n_excluded[rows].max()))
        query = problem.stage_query(rows)
        values_np, labels_np = self.index.search(self._augmented(query), n_fetch)
        device = rows.device
        labels = torch.from_numpy(labels_np).to(device)
        keys = -torch.from_numpy(values_np).to(device, torch.float64)
        found = labels >= 0
        labels = labels.clamp(min=0)
        keys = keys.masked_fill(~found | ~_pair_eligible(_take_rows(problem.exclusions, rows), labels), float("inf"))
        top = torch.topk(keys, min(kp, n_fetch), dim=1, largest=False)
        ok = top.values < float("inf")
        # A row with fewer than kp candidates has them all (faiss fetched past every excluded item).
        floor = torch.where(ok.all(dim=1), top.values[:, -1], float("inf"))
        return _Candidates(labels.gather(1, top.indices), ok, floor, top.values, _rounding_terms(query.shape[1]))

    def _range(self, rows: Tensor, kp: int) -> _Candidates:
        """Candidates below estimated per-query thresholds ``tau``.

        Every row keeps its best ``kp`` plus as many as it may have excluded items (dropped afterwards).
        A non-candidate either failed the range test (key >= ``tau``, up to the float32 rounding the
        certificate allows for) or passed it with a key >= the last kept one: the floor is that key for
        a row with more passing items than it keeps, else ``tau``. Crowded rows get no candidates and
        floor -inf: they are searched again.
        """
        problem, device = self.problem, rows.device
        query = problem.stage_query(rows)
        exclusions = _take_rows(problem.exclusions, rows)
        key_fn = addmm_keys(query, self.gallery, self.bias, self.alpha)
        mask = functools.partial(_mask_excluded_, exclusions)
        tau, crowded = sample_thresholds(rows.numel(), problem.gallery.shape[0], key_fn, kp, mask, STAGE1_ROWS, True)
        crowded |= torch.isinf(tau)  # no threshold: fewer than ``rank`` eligible sample items
        tau = tau.masked_fill(crowded, torch.finfo(tau.dtype).min)  # nothing passes, floor ~ -inf
        lims_np, values_np, labels_np = self.index.range_search(self._augmented(query, tau), 0.0)
        lims = torch.from_numpy(lims_np.astype("int64")).to(device)
        counts = lims.diff()
        # Dense (rows, most passing) inner products t - key, -inf padded; the best are the largest.
        n_keep = kp + int(self.n_excluded[rows].max())
        width = max(n_keep, int(counts.max()))
        row_start = torch.arange(rows.numel(), device=device) * width - lims[:-1]
        flat = torch.arange(int(lims[-1]), device=device) + row_start.repeat_interleave(counts)
        dense = torch.full((rows.numel(), width), -float("inf"), device=device)
        dense.view(-1)[flat] = torch.from_numpy(values_np).to(device)
        top = torch.topk(dense, n_keep, dim=1, sorted=False)
        found = top.indices < counts[:, None]
        padded = torch.cat([torch.from_numpy(labels_np).to(device), torch.zeros(1, dtype=torch.long, device=device)])
        items = padded[(lims[:-1, None] + top.indices).clamp(max=int(lims[-1]))].masked_fill_(~found, 0)
        ok = found & _pair_eligible(exclusions, items)
        tau64 = tau.to(torch.float64)
        floor = torch.where(counts > n_keep, tau64 - top.values.amin(dim=1).to(torch.float64), tau64)
        keys = tau64[:, None] - top.values.to(torch.float64)
        return _Candidates(items, ok, floor, keys, _rounding_terms(query.shape[1], threshold_in_product=True))


def _pair_eligible(exclusions: _Exclusions, indices: Tensor) -> Tensor:
    """Eligibility of the pairs (row r, gallery item ``indices[r, j]``), ``(R, n)`` bool."""
    eligible = torch.ones_like(indices, dtype=torch.bool)
    if exclusions.self_index is not None:
        eligible &= indices != exclusions.self_index[:, None]
    if exclusions.sequence_ids is not None:
        eligible &= exclusions.sequence_ids[1][indices] != exclusions.sequence_ids[0][:, None]
    if exclusions.search_groups is not None:
        eligible &= exclusions.search_groups[1][indices] == exclusions.search_groups[0][:, None]
    return eligible


# ----------------------------------------------------------------------------------------------------------------------
# knn: stage 2, canonical distances, tie order and the exactness certificate
# ----------------------------------------------------------------------------------------------------------------------


def _distances_from_dots(
    dots: Tensor, q_sq: Tensor, g_sq: Tensor, distance: str, direct_sq: Callable[[tuple[Tensor, ...]], Tensor]
) -> Tensor:
    """The canonical float64 distance from canonical inner products (pairs or a block, broadcast).

    ``dot``: ``-<q,g>``; ``cosine``: ``1 - <q,g> / sqrt(<q,q><g,g>)``; ``sqeuclidean``:
    ``<q,q> + <g,g> - 2<q,g>`` (clamped at 0), or ``direct_sq`` (``sum((q - g)^2)`` of the entries at the
    given indices) where that expansion cancels badly (near-duplicates); ``euclidean``: its square root.
    Exact duplicates get exactly 0.
    """
    if distance == "dot":
        return -dots
    if distance == "cosine":
        return 1.0 - dots / torch.sqrt(q_sq * g_sq)
    scale = q_sq + g_sq
    squared = (scale - 2.0 * dots).clamp_(min=0.0)
    close = torch.nonzero(squared < scale * 2.0**-10, as_tuple=True)
    if close[0].numel():
        squared[close] = direct_sq(close)
    return squared.sqrt_() if distance == "euclidean" else squared


def _canonical_distances(problem: _Problem, rows: Tensor, pair_rows: Tensor, pair_cols: Tensor) -> Tensor:
    """Float64 distances of the pairs ``(rows[pair_rows[i]], pair_cols[i])``, computed pair by pair."""
    query64 = problem.query64[rows]
    dots = _canonical_dots(pair_rows, pair_cols, query64, problem.gallery64)

    def direct_sq(close: tuple[Tensor, ...]) -> Tensor:
        diff = query64[pair_rows[close[0]]] - problem.gallery64[pair_cols[close[0]]]
        return (diff * diff).sum(dim=1)

    q_sq, g_sq = problem.query_sq64[rows][pair_rows], problem.gallery_sq64[pair_cols]
    return _distances_from_dots(dots, q_sq, g_sq, problem.distance, direct_sq)


def _key_tolerance(problem: _Problem, rows: Tensor, rounding: int) -> Tensor:
    """A rigorous bound on |stage-1 key - exact key| of every pair of these queries, ``(R,)`` float64.

    With ``u = 2**-24`` (float32 unit roundoff), a float32 sum of n products errs by at most
    ``n u sum|a_i b_i|`` in any summation order, with or without fused multiply-adds; every stage input
    (a row entry, a squared norm, a unit row for cosine) is within ``u`` relative of its exact value
    (:func:`_stage_rows`). ``rounding`` counts the stage's terms in units of ``u * scale``, with ``scale``
    ``S = (|q| + max |g|)^2`` (L2), ``|q| max |g|`` (dot) or 1 (cosine), ``D`` the dimension:

    * torch, one side: ``addmm(|g|^2, q, g^T, alpha=-2)`` sums D + 1 terms of total size
      ``|g|^2 + 2 |q||g| <= S``: ``(D + 1) u S``, plus ``u S`` for each of the rounded norm, the rounded
      rows and the result: ``D + 4``;
    * torch, symmetric: ``2 <[-x, 1, |x|^2/2], [y, |y|^2/2, 1]> - |x|^2`` sums D + 2 terms of total size
      ``S / 2``, doubled: ``(D + 2) u S``, plus the norms, rows and two roundings: ``D + 6``;
    * faiss top-k: ``<[2g, -|g|^2, 1], [q, 1, 0]>`` as the one-sided torch sum, plus the float32 rounding of
      the float64 key: ``D + 5``;
    * faiss range search: the query's threshold ``t`` (``|t| <= S``) is a term of the product
      ``<[2g, -|g|^2, 1], [q, 1, t]>``, which doubles the sum's size: ``2 D + 8``.

    :func:`_rounding_terms` rounds these up to ``D + 6`` and ``2 D + 8``; ``TOLERANCE_FACTOR`` adds a margin
    (which also covers the float64 rounding of the canonical values, about ``2**-29`` times smaller).
    """
    unit = 2.0**-24 * rounding * TOLERANCE_FACTOR
    q_norm, g_norm = problem.query_sq64[rows].sqrt(), problem.gallery_sq64.max().sqrt()
    if problem.distance == "cosine":
        return torch.full_like(q_norm, unit)
    if problem.distance == "dot":
        return unit * q_norm * g_norm
    return unit * (q_norm + g_norm) ** 2


def _key_to_distance(problem: _Problem, rows: Tensor, keys: Tensor) -> Tensor:
    """The distance of a key (a monotone map), float64; ``keys`` is ``(R,)`` or ``(R, n)``."""
    keys = keys.to(torch.float64)
    if problem.distance == "dot":
        return keys
    if problem.distance == "cosine":
        return 1.0 + keys
    squared = keys + problem.query_sq64[rows].view(-1, *([1] * (keys.dim() - 1)))
    return squared.clamp(min=0.0).sqrt() if problem.distance == "euclidean" else squared


def _near_duplicate_limit(problem: _Problem, rows: Tensor, tolerance: Tensor) -> Tensor:
    """``(R,)`` float64: keys at most this are near duplicates of the query, whose distance a key cannot
    tell from 0 (L2: ``key + |q|^2 <= 2 tol``); -inf for the other distances."""
    if problem.distance in ("euclidean", "sqeuclidean"):
        return 2.0 * tolerance - problem.query_sq64[rows]
    return torch.full_like(tolerance, -float("inf"))


def _near_ties(keys: Tensor, gap: Tensor) -> Tensor:
    """``(R, n)`` bool: entries whose key is within ``gap[r]`` of another key of their row."""
    ordered, order = torch.sort(keys, dim=1)
    close = ordered.diff(dim=1) <= gap[:, None].to(keys.dtype)
    near = torch.zeros_like(keys, dtype=torch.bool)
    near[:, 1:] |= close
    near[:, :-1] |= close
    return torch.empty_like(near).scatter_(1, order, near)


class _Ranked(NamedTuple):
    distances: Tensor  # (R, K) in the query's dtype
    indices: Tensor  # (R, K) int64
    valid: Tensor  # (R, K) bool
    certified: Tensor  # (R,) bool: provably the exact answer


def _order_by_distance_then_position(distances: Tensor, positions: Tensor) -> Tensor:
    """Per row, the permutation sorting by (distance, position): one sort on a combined int64 key.

    Float32 distances are mapped to order-preserving int32 bits (+inf sorts last) and combined with the
    position; other dtypes take two stable sorts.
    """
    if distances.dtype == torch.float32 and positions.numel() and int(positions.max()) < 2**31:
        bits = distances.contiguous().view(torch.int32).to(torch.int64)
        ordered = torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # monotone in the float value
        return torch.argsort(ordered * 2**32 + positions, dim=1)
    by_position = torch.argsort(positions, dim=1, stable=True)
    return by_position.gather(1, torch.argsort(distances.gather(1, by_position), dim=1, stable=True))


def _rank(
    problem: _Problem,
    rows: Tensor,
    candidates: _Candidates,
    k: int,
    exact_distances: bool,
    relevance: RelevanceFn | None = None,
) -> _Ranked:
    """Distances of the candidates, stable order by (distance, gallery position), certificate.

    With ``exact_distances`` every candidate's distance is recomputed canonically in float64. Without,
    only the candidates whose key lies within two rounding bounds of another candidate's key are (near
    ties); the others keep the distance of their stage-1 key. The order is the same: a candidate whose
    key is further than two bounds from every other key is further than zero from them in exact
    distance too, on the same side (and far more than a float32 step apart after rounding). Near
    duplicates are recomputed too, so that a duplicate's distance is exactly 0.
    """
    indices, ok, floor, keys, rounding = candidates
    tolerance = _key_tolerance(problem, rows, rounding)
    if not exact_distances and _compiled_buffer.available(ok.device, problem.query.shape[0], problem.gallery.shape[0]):
        return _rank_compiled(problem, rows, candidates, k, tolerance, relevance)
    if exact_distances:
        recompute = ok
    else:
        near = _near_ties(keys.masked_fill(~ok, float("inf")), 2.0 * tolerance)
        recompute = ok & (near | (keys <= _near_duplicate_limit(problem, rows, tolerance)[:, None]))
    pair_rows, slots = torch.nonzero(recompute, as_tuple=True)
    dtype = problem.query.dtype
    if exact_distances:
        values = torch.full(ok.shape, float("inf"), dtype=dtype, device=ok.device)
    else:
        values = _key_to_distance(problem, rows, keys).to(dtype).masked_fill_(~ok, float("inf"))
    values[pair_rows, slots] = _canonical_distances(problem, rows, pair_rows, indices[pair_rows, slots]).to(dtype)
    order = _order_by_distance_then_position(values, torch.where(ok, indices, problem.gallery.shape[0]))[:, :k]
    valid = ok.gather(1, order)
    distances = values.gather(1, order).masked_fill_(~valid, float("inf"))
    chosen = indices.gather(1, order).masked_fill_(~valid, 0)
    last = order[:, -1:]
    certified = _certified(
        problem, rows, ok, floor, tolerance, k, distances, keys.gather(1, last), recompute.gather(1, last)
    )
    return _Ranked(distances, chosen, valid, certified)


def _certified(
    problem: _Problem,
    rows: Tensor,
    ok: Tensor,
    floor: Tensor,
    tolerance: Tensor,
    k: int,
    distances: Tensor,
    last_key: Tensor,
    last_recomputed: Tensor,
) -> Tensor:
    """``(R,)`` bool: the ranked rows that are provably the exact answer.

    Every eligible non-candidate has a key >= the floor, so an exact distance >= ``bound``; the answer is
    exact when the K-th distance is below it (or nothing is left). A K-th distance taken from a key
    (``last_recomputed`` False) is only known up to the key's rounding bound: its upper end must be below.
    """
    n_found = ok.sum(dim=1)
    covered = n_found >= problem.n_eligible[rows]
    dtype = distances.dtype
    bound = _key_to_distance(problem, rows, floor.to(torch.float64) - tolerance).to(dtype)
    upper = _key_to_distance(problem, rows, last_key.reshape(-1).to(torch.float64) + tolerance).to(dtype)
    upper = torch.where(last_recomputed.reshape(-1), distances[:, -1], upper)
    return covered | ((n_found >= k) & (upper < bound))


def _rank_compiled(
    problem: _Problem,
    rows: Tensor,
    candidates: _Candidates,
    k: int,
    tolerance: Tensor,
    relevance: RelevanceFn | None,
) -> _Ranked:
    """:func:`_rank` without exact distances, ordered by the compiled kernels of ``_compiled_order``.

    With ``relevance``, a run of near ties whose items are all relevant or all irrelevant keeps its key
    order: any order of it gives every rank the same relevance, so only mixed runs are recomputed.
    """
    indices, ok, floor, keys, _ = candidates
    keys32 = keys.to(torch.float32).masked_fill(~ok, float("inf"))
    near_limit = _near_duplicate_limit(problem, rows, tolerance)
    keys32, items, near = sort_by_key(keys32, indices.masked_fill(~ok, 0), 2.0 * tolerance, near_limit)
    ok = keys32 < float("inf")
    near &= ok
    if relevance is not None:
        near = mixed_runs(near, relevance(rows, items))
    dtype = problem.query.dtype
    values = torch.zeros(keys32.shape, dtype=dtype)
    pair_rows, slots = torch.nonzero(near, as_tuple=True)
    values[pair_rows, slots] = _canonical_distances(problem, rows, pair_rows, items[pair_rows, slots]).to(dtype)
    order = order_runs(values, items, near)[:, :k]
    valid, recomputed = ok.gather(1, order), near.gather(1, order)
    key_k = keys32.gather(1, order).to(torch.float64)
    distances = torch.where(recomputed, values.gather(1, order), _key_to_distance(problem, rows, key_k).to(dtype))
    distances.masked_fill_(~valid, float("inf"))
    chosen = items.gather(1, order).masked_fill_(~valid, 0)
    certified = _certified(problem, rows, ok, floor, tolerance, k, distances, key_k[:, -1], recomputed[:, -1])
    return _Ranked(distances, chosen, valid, certified)


# ----------------------------------------------------------------------------------------------------------------------
# knn: public entry point
# ----------------------------------------------------------------------------------------------------------------------

#: Largest squared norm accepted (float32 keys must not overflow).
MAX_SQUARED_NORM = 1e36
#: Candidate pairs held at once by one round (bounds the memory of stages 1 and 2).
ROUND_PAIRS = 2**21


def _as_pair(name: str, value: Tensor | tuple[Tensor, Tensor] | None, has_gallery: bool) -> object:
    if value is None or has_gallery:
        return value
    if isinstance(value, tuple):
        raise TypeError(f"`{name}` must be one tensor of shape (Q,) when `gallery` is None, got a tuple.")
    return (value, value)


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


def _check_magnitude(name: str, x: Tensor) -> None:
    largest = float((x.to(torch.float64) ** 2).sum(dim=1).max())
    if largest > MAX_SQUARED_NORM:
        raise ValueError(
            f"`{name}` must have row norms below 1e18 (float32 search), got a row of norm {largest**0.5:.3g}; "
            "rescale the embeddings."
        )


def _resolve_backend(backend: str, problem: _Problem, kp: int) -> str:
    if backend == "auto":
        # Measured on 2 CPU cores, one thread each (whole knn calls against a bare faiss IndexFlatL2 search,
        # D = 128, clustered data; benchmarks/README.md). With the compiled scans, the torch stage wins for
        # a set searched against itself (each distance block computed once: 0.95x vs 1.02x at N = 30k,
        # K = 19; 1.14x vs 1.29x at K = 299) and for large K against a gallery (1.30x vs 1.39x at K = 299),
        # and faiss for small K against a gallery (1.06x vs 1.22x). Without them (no numba), the torch
        # scans only win for large leave-one-out searches with few candidates. Search groups and tensors
        # off the CPU always take the torch stage.
        cpu = problem.query.device.type == "cpu"
        if not cpu or problem.exclusions.search_groups is not None:
            return "torch"
        if _compiled_buffer.available(problem.query.device, problem.query.shape[0], problem.gallery.shape[0]):
            return "torch" if problem.symmetric or kp >= RANGE_MIN_KP else "faiss"
        large_symmetric = problem.symmetric and problem.query.shape[0] >= AUTO_TORCH_MIN_N and kp <= AUTO_TORCH_MAX_KP
        return "torch" if large_symmetric else "faiss"
    if backend == "torch":
        return "torch"
    if problem.exclusions.search_groups is not None:
        warnings.warn(
            "backend='faiss' cannot restrict a search to search groups: using the torch backend.", stacklevel=3
        )
        return "torch"
    if problem.query.device.type != "cpu":
        faiss = _faiss_module()
        if not (faiss.get_num_gpus() > 0 and kp <= FAISS_GPU_MAX_K):
            warnings.warn(
                f"backend='faiss' on {problem.query.device} needs faiss-gpu and at most {FAISS_GPU_MAX_K} candidates: "
                "using the torch backend.",
                stacklevel=3,
            )
            return "torch"
        return "faiss-gpu"
    return "faiss"


def _empty_result(n_query: int, dtype: torch.dtype, device: torch.device) -> KNNResult:
    return KNNResult(
        torch.zeros((n_query, 0), dtype=dtype, device=device),
        torch.zeros((n_query, 0), dtype=torch.long, device=device),
        torch.zeros((n_query, 0), dtype=torch.bool, device=device),
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
    search = _Search.create(
        query, gallery, k, distance, exclude_self, sequence_ids, search_groups, backend, chunk_size, exact_distances
    )
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
    search = _Search.create(
        query, gallery, k, distance, exclude_self, sequence_ids, search_groups, backend, chunk_size, exact_distances
    )._replace(relevance=relevance)
    queries = torch.arange(search.problem.query.shape[0], device=search.problem.query.device)
    return ((rows, search(rows)) for rows in queries.split(rows_per_chunk))


class _Search(NamedTuple):
    """A checked kNN search, ready to answer any subset of its queries."""

    problem: _Problem
    stage: _TorchStage | _FaissStage | None  # None: no query has an eligible item (K = 0)
    k: int
    kp: int
    chunk_size: int | None
    exact_distances: bool
    relevance: RelevanceFn | None = None

    @classmethod
    def create(
        cls,
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
    ) -> _Search:
        """Check the arguments (as :func:`knn` documents them) and prepare the gallery and the stage."""
        k = check_positive_int("k", k)
        check_choice("distance", distance, DISTANCES)
        check_choice("backend", backend, BACKENDS)
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size)
        if not isinstance(exact_distances, bool):
            raise TypeError(f"`exact_distances` must be a bool, got {describe(exact_distances)}.")
        same_set = gallery is None
        query, gallery_ = _check_query_gallery(query, query if gallery is None else gallery)
        has_gallery = not same_set
        exclusions = _check_exclusions(
            "exclude_self",
            _self_index(exclude_self, query, gallery),
            _as_pair("sequence_ids", sequence_ids, has_gallery),
            _as_pair("search_groups", search_groups, has_gallery),
            query,
            gallery_,
        )
        _check_magnitude("query", query)
        if has_gallery:
            _check_magnitude("gallery", gallery_)
        problem = _make_problem(query, gallery_, distance, exclusions, same_set)
        n_gallery = gallery_.shape[0]
        k = min(k, n_gallery, int(problem.n_eligible.max()))
        kp = _candidates_per_query(k, n_gallery)
        if k == 0:
            return cls(problem, None, 0, 0, chunk_size, exact_distances)
        engine = _resolve_backend(backend, problem, kp)
        stage = (
            _TorchStage(problem, chunk_size)
            if engine == "torch"
            else _FaissStage(problem, use_gpu=engine == "faiss-gpu")
        )
        return cls(problem, stage, k, kp, chunk_size, exact_distances)

    def __call__(self, queries: Tensor) -> KNNResult:
        """The result of the queries at the positions ``queries``."""
        if self.stage is None:
            return _empty_result(queries.numel(), self.problem.query.dtype, self.problem.query.device)
        return _search_rounds(self, self.stage, queries)


@ieee_float32_matmul()  # the certificate's rounding bound assumes IEEE float32 products
def _search_rounds(search: _Search, stage: _TorchStage | _FaissStage, queries: Tensor) -> KNNResult:
    """Rounds of stage 1 + stage 2 over the uncertified ``queries``, doubling the candidates each round."""
    problem, k, kp, chunk_size = search.problem, search.k, search.kp, search.chunk_size
    n_gallery, device = problem.gallery.shape[0], problem.query.device
    distances = torch.empty((queries.numel(), k), dtype=problem.query.dtype, device=device)
    indices = torch.empty((queries.numel(), k), dtype=torch.long, device=device)
    valid = torch.empty((queries.numel(), k), dtype=torch.bool, device=device)
    pending = torch.arange(queries.numel(), device=device)  # positions within ``queries``
    first_round = True
    while pending.numel():
        group_rows = max(1, min(ROUND_PAIRS // kp, chunk_size or queries.numel()))
        failed = []
        for start in range(0, pending.numel(), group_rows):
            rows = pending[start : start + group_rows]
            positions = queries[rows]
            candidates = stage(positions, kp, first_round)
            ranked = _rank(problem, positions, candidates, k, search.exact_distances, search.relevance)
            done = rows[ranked.certified]
            distances[done] = ranked.distances[ranked.certified]
            indices[done] = ranked.indices[ranked.certified]
            valid[done] = ranked.valid[ranked.certified]
            failed.append(rows[~ranked.certified])
        pending = torch.cat(failed)
        kp = min(n_gallery, 2 * kp)
        first_round = False
    return KNNResult(distances, indices, valid)
