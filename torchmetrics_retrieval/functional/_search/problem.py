"""A search problem, checked and prepared once: the rows in float64, their canonical squared norms, each
query's number of eligible items; and what a stage-1 search returns for it (:class:`Candidates`).

Stage 1 ranks pairs by a float32 *key* that orders like the distance: ``|g|^2 - 2<q,g>`` (L2; ``|q|^2`` is
constant per query), ``-<q,g>`` (dot) and ``-<q/|q|, g/|g|>`` (cosine). A stage returns, per query, ``kp``
candidates (gallery positions; ``ok`` marks a real eligible item) and a *floor*: every eligible item that is
not a candidate has a key >= the floor. The floor is the largest candidate key when the stage selected ``kp``
candidates exactly, +inf when it found every eligible item, and the estimated threshold of a stage whose
estimate turned out too low (fewer than ``kp`` candidates).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.half_rows import (
    HALF_DTYPES,
    BlockRows,
    StageRows,
    half_rows,
    values_dtype,
)
from torchmetrics_retrieval.functional._search.keys import Float64Rows, Rows64, self_dots, stage_rows
from torchmetrics_retrieval.functional._search.types import Exclusions

__all__ = ["Candidates", "GalleryCache", "Problem", "make_problem", "rounding_terms"]


class GalleryCache:
    """What problems of the same gallery share (the queries differ): its canonical squared norms and, with
    ``keep_rows``, its stage-1 rows once a problem has made them (a float32 copy of the gallery, held as long as
    the cache is).

    A blocked search keeps one per block of its gallery: the norms of every block, the rows when one block holds the
    whole gallery (the rows of several blocks would be a copy of all of them)."""

    def __init__(self, keep_rows: bool) -> None:
        self.keep_rows = keep_rows
        self.sq64: Tensor | None = None
        self.stage: tuple[Tensor, Tensor | None] | None = None


class Problem(NamedTuple):
    """A validated kNN problem with the per-row data every stage needs."""

    query: Tensor  # (Q, D) as given
    gallery: Tensor  # (G, D) as given
    distance: str
    exclusions: Exclusions
    n_eligible: Tensor  # (Q,) int64: eligible gallery items of each query
    query64: Rows64  # (Q, D) float64 (canonical stage), or read on demand
    gallery64: Rows64  # (G, D) float64
    query_sq64: Tensor  # (Q,) canonical <q, q>
    gallery_sq64: Tensor  # (G,) canonical <g, g>
    symmetric: bool  # the set against itself with symmetric exclusions: each distance serves both sides
    dtype: torch.dtype  # of the distances returned; they are rounded to it before ties go by position
    split: int | None = None  # bipartite: rows [0, split) are searched against the rest and the rest against them
    # (Q,) in ``dtype``: a query wants only the items whose distance is at most its cap (+inf: every item), e.g.
    # its K-th distance among the items a sharded search has already seen (searched with exact distances)
    caps: Tensor | None = None
    gallery_cache: GalleryCache | None = None  # shared with the other problems of the same gallery

    @property
    def compiled(self) -> bool:
        """Whether the search of the whole problem takes the compiled kernels (``plan.use_compiled``)."""
        return plan.use_compiled(self.query.device, self.query.shape[0], self.gallery.shape[0])

    def stage_query(self, rows: Tensor) -> Tensor:
        """The float32 stage-1 rows of the queries ``rows`` (see :func:`stage_rows`)."""
        query64 = self.query64
        if isinstance(query64, Float64Rows):  # no float64 temporary of the rows: ``stage_rows`` reads them per block
            return stage_rows(Float64Rows(query64.x[rows]), self.query_sq64[rows], self.distance, self.compiled)[0]
        return stage_rows(query64[rows], self.query_sq64[rows], self.distance, self.compiled)[0]

    def stage_query_rows(self, rows: Tensor) -> StageRows:
        """The stage-1 rows of the queries ``rows`` for the torch stage: made per block from half-precision rows
        (:class:`~.half_rows.BlockRows`), else :meth:`stage_query`."""
        if half_rows(self.query64):
            assert isinstance(self.query64, Float64Rows)
            return BlockRows(self.query64, self.query_sq64, self.distance, self.compiled, rows)
        return self.stage_query(rows)

    def stage_gallery_rows(self) -> tuple[StageRows, Tensor | None]:
        """The stage-1 gallery rows and float32 squared norms (L2 only) for the torch stage: made per block from
        half-precision rows (no float32 copy of the gallery), else :meth:`stage_gallery`."""
        if half_rows(self.gallery64):
            assert isinstance(self.gallery64, Float64Rows)
            l2 = self.distance in ("euclidean", "sqeuclidean")
            rows = BlockRows(self.gallery64, self.gallery_sq64, self.distance, self.compiled)
            return rows, self.gallery_sq64.to(torch.float32) if l2 else None
        return self.stage_gallery()

    def stage_gallery(self) -> tuple[Tensor, Tensor | None]:
        """The float32 stage-1 gallery rows and squared norms (L2 only); from the gallery cache when it holds them
        (the same values: they depend on the gallery alone)."""
        cache = self.gallery_cache
        if cache is not None and cache.stage is not None:
            return cache.stage
        stage = stage_rows(self.gallery64, self.gallery_sq64, self.distance, self.compiled)
        if cache is not None and cache.keep_rows:
            cache.stage = stage
        return stage


def make_problem(
    query: Tensor,
    gallery: Tensor,
    distance: str,
    exclusions: Exclusions,
    same_set: bool,
    names: tuple[str, str] = ("query", "gallery"),
    split: int | None = None,
    lazy64: bool = False,
    gallery_cache: GalleryCache | None = None,
    dtype: torch.dtype | None = None,
) -> Problem:
    """Prepare a problem from checked inputs (``same_set``: ``gallery`` is ``query``, searched against itself).

    ``split`` (with ``same_set``) makes it *bipartite*: the rows before ``split`` and the rows from ``split`` on
    are two sets, each searched against the other only (the ``sides`` rule excludes the same side), so that a
    symmetric stage computes the rectangle between them once and serves both sets from it.

    ``lazy64``: the float64 rows are read on demand (:class:`~.keys.Float64Rows`) instead of copied, for a
    float32 set too large to hold twice more (the values are the same). Half-precision rows (float16, bfloat16)
    are always read on demand: the canonical stage upcasts only the candidates' rows, and the torch stage makes
    its float32 rows block by block (:meth:`Problem.stage_gallery_rows`).

    ``dtype``: of the distances the problem reports (ties go by position after rounding to it); by default
    ``half_rows.values_dtype`` (float32 for half-precision rows, else the query's dtype).

    ``gallery_cache`` (a separate gallery): the gallery's norms and stage rows shared with the other problems of
    the same gallery (e.g. the searches of several query chunks and their full-ranking counts), computed once.

    The values that only the float64 norms reveal are checked here, where the norms are computed once:
    no row may be too large for float32 keys, nor all-zero with ``distance="cosine"``. ``names`` are the
    arguments that the user gave as the query and the gallery, for the error messages.
    """
    lazy = (lazy64 or query.dtype in HALF_DTYPES or gallery.dtype in HALF_DTYPES) and query.dtype != torch.float64
    as64 = Float64Rows if lazy else (lambda x: x.to(torch.float64))
    query64: Rows64 = as64(query)
    gallery64: Rows64 = query64 if same_set else as64(gallery)
    query_sq64 = self_dots(query64)
    assert gallery_cache is None or not same_set, "a gallery cache serves a separate gallery"
    if same_set:
        gallery_sq64 = query_sq64
    elif gallery_cache is not None and gallery_cache.sq64 is not None:
        gallery_sq64 = gallery_cache.sq64
    else:
        gallery_sq64 = self_dots(gallery64)
        if gallery_cache is not None:
            gallery_cache.sq64 = gallery_sq64
    sides: tuple[tuple[str, Tensor], ...]
    if same_set and split is not None:  # the two sets of a bipartite search, each under its own name
        sides = ((names[0], query_sq64[:split]), (names[1], query_sq64[split:]))
    elif same_set:
        sides = ((names[0], query_sq64),)
    else:
        sides = ((names[0], query_sq64), (names[1], gallery_sq64))
    for name, sq in sides:
        largest = float(sq.max()) if sq.numel() else 0.0
        if largest > plan.MAX_SQUARED_NORM:
            raise ValueError(
                f"`{name}` must have row norms below 1e18 (float32 search), got a row of norm {largest**0.5:.3g}; "
                "rescale the embeddings."
            )
        if distance == "cosine" and bool((sq == 0).any()):
            raise ValueError(f"`{name}` must have no all-zero row with distance='cosine', got {int((sq == 0).sum())}.")
    if split is not None:
        side = (torch.arange(query.shape[0], device=query.device) >= split).long()
        exclusions = exclusions._replace(sides=(side, side))
    n_eligible = exclusions.count_eligible(query.shape[0], gallery.shape[0], query.device)
    own = exclusions.self_index
    symmetric = same_set and (own is None or bool((own == torch.arange(own.numel(), device=own.device)).all()))
    return Problem(
        query, gallery, distance, exclusions, n_eligible, query64, gallery64, query_sq64, gallery_sq64, symmetric,
        values_dtype(query) if dtype is None else dtype, split, gallery_cache=gallery_cache,
    )  # fmt: skip


class Candidates(NamedTuple):
    indices: Tensor  # (R, kp) int64
    ok: Tensor  # (R, kp) bool
    floor: Tensor  # (R,) float: no non-candidate has a smaller key
    keys: Tensor  # (R, kp) float: the stage-1 keys (meaningful where ok)
    rounding: int  # the keys' rounding bound in units of u * scale (see ``certify.key_tolerance``)
    # (R,) float64: what a bfloat16 pass adds to that bound (``low_precision.extra_tolerance``); None: float32 keys
    extra: Tensor | None = None

    def take(self, rows: Tensor | slice) -> Candidates:
        """The candidates of a subset of the rows."""
        extra = None if self.extra is None else self.extra[rows]
        return self._replace(
            indices=self.indices[rows], ok=self.ok[rows], floor=self.floor[rows], keys=self.keys[rows], extra=extra
        )


def rounding_terms(dim: int, threshold_in_product: bool = False) -> int:
    """Rounding bound of a stage's float32 keys in units of ``u * scale`` (``u = 2**-24``, see
    ``certify.key_tolerance``): ``D + 6``, or ``2 D + 8`` when the query's threshold is a term of the product."""
    return 2 * dim + 8 if threshold_in_product else dim + 6
