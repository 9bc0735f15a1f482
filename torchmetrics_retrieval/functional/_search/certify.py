"""Stage 2: the candidates' canonical distances, their order by (distance, gallery position), and the
certificate that proves a query's answer exact.

Every eligible non-candidate has a stage-1 key >= its query's floor, and a key is within a rigorous rounding
bound (:func:`key_tolerance`) of the exact key: so its exact distance is at least what the floor minus the
bound maps to. A query whose K-th distance is below that is *certified*; the others (near-ties at the
boundary, an estimated threshold that fell short) are searched again with more candidates by ``rounds``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.compiled.order import mixed_runs, order_runs, ranked_columns, sort_by_key
from torchmetrics_retrieval.functional._search.keys import Float64Rows, canonical_dots, distances_from_dots, order_key
from torchmetrics_retrieval.functional._search.problem import Candidates, Problem
from torchmetrics_retrieval.functional._search.types import RelevanceFn, consecutive_start

__all__ = [
    "Ranked",
    "candidate_tolerance",
    "canonical_distances",
    "cap_keys",
    "key_tolerance",
    "order_by_distance_then_position",
    "rank",
]


#: Pairs whose canonical distances :func:`canonical_distances` computes at once (about 20 MiB of working arrays).
PAIR_BLOCK = 2**18


def canonical_distances(problem: Problem, rows: Tensor, pair_rows: Tensor, pair_cols: Tensor) -> Tensor:
    """Float64 distances of the pairs ``(rows[pair_rows[i]], pair_cols[i])``, computed pair by pair."""
    # the rows themselves, never a copy of many: rows read on demand, or consecutive rows (every row of the problem,
    # or a part of a round) read in place
    whole = isinstance(problem.query64, Float64Rows) or consecutive_start(rows) is not None
    query64, at = (problem.query64, rows[pair_rows]) if whole else (problem.query64[rows], pair_rows)
    q_sq = problem.query_sq64[rows]

    def direct_sq(at: Tensor, cols: Tensor, close: tuple[Tensor, ...]) -> Tensor:
        diff = query64[at[close[0]]] - problem.gallery64[cols[close[0]]]
        return (diff * diff).sum(dim=1)

    # block by block of pairs: the indices, the sampled product and the squared norms of a block take a few MiB,
    # whatever the number of candidates (a pair's value does not depend on the pairs computed with it)
    out = torch.empty(pair_rows.numel(), dtype=torch.float64, device=pair_rows.device)
    for start in range(0, pair_rows.numel(), PAIR_BLOCK):
        block = slice(start, start + PAIR_BLOCK)
        block_at, block_cols = at[block], pair_cols[block]
        dots = canonical_dots(block_at, block_cols, query64, problem.gallery64)
        squares = (q_sq[pair_rows[block]], problem.gallery_sq64[block_cols])
        close_pairs = functools.partial(direct_sq, block_at, block_cols)
        out[block] = distances_from_dots(dots, *squares, problem.distance, close_pairs)
    return out


def key_tolerance(problem: Problem, rows: Tensor | slice, rounding: int) -> Tensor:
    """A rigorous bound on |stage-1 key - exact key| of every pair of these queries, ``(R,)`` float64.

    With ``u = 2**-24`` (float32 unit roundoff), a float32 sum of n products errs by at most
    ``n u sum|a_i b_i|`` in any summation order, with or without fused multiply-adds; every stage input
    (a row entry, a squared norm, a unit row for cosine) is within ``u`` relative of its exact value
    (``keys.stage_rows``). ``rounding`` counts the stage's terms in units of ``u * scale``, with ``scale``
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

    ``problem.rounding_terms`` rounds these up to ``D + 6`` and ``2 D + 8``; ``plan.TOLERANCE_FACTOR`` adds a margin
    (which also covers the float64 rounding of the canonical values, about ``2**-29`` times smaller).
    """
    unit = 2.0**-24 * rounding * plan.TOLERANCE_FACTOR
    q_norm, g_norm = ieee_sqrt(problem.query_sq64[rows]), ieee_sqrt(problem.gallery_sq64.max())
    if problem.distance == "cosine":
        return torch.full_like(q_norm, unit)
    if problem.distance == "dot":
        return unit * q_norm * g_norm
    return unit * (q_norm + g_norm) ** 2


def candidate_tolerance(problem: Problem, rows: Tensor | slice, candidates: Candidates) -> Tensor:
    """``(R,)`` float64 bound on |stage-1 key - exact key| of the candidates' keys: :func:`key_tolerance`, widened by
    a bfloat16 pass's rounding (``low_precision``: ``(1 + 2**-6)`` times the float32 bound plus its own terms)."""
    tolerance = key_tolerance(problem, rows, candidates.rounding)
    if candidates.extra is None:
        return tolerance
    return tolerance * (1.0 + 2.0**-6) + candidates.extra.to(tolerance)


def _key_to_distance(problem: Problem, rows: Tensor, keys: Tensor) -> Tensor:
    """The distance of a key (a monotone map), float64; ``keys`` is ``(R,)`` or ``(R, n)``."""
    keys = keys.to(torch.float64)
    if problem.distance == "dot":
        return keys
    if problem.distance == "cosine":
        return 1.0 + keys
    squared = keys + problem.query_sq64[rows].view(-1, *([1] * (keys.dim() - 1)))
    return ieee_sqrt(squared.clamp(min=0.0)) if problem.distance == "euclidean" else squared


def cap_keys(problem: Problem, rows: Tensor | slice, rounding: int) -> Tensor:
    """``(R,)`` float64 one-sided keys (+inf: no cap) that a stage may take as first thresholds of queries with
    ``problem.caps``: every item whose distance, rounded to ``problem.dtype``, is at most the query's cap has a
    stage key more than one rounding bound below it, so a floor at it certifies (see ``_certified``)."""
    assert problem.caps is not None
    caps = problem.caps[rows]
    # an item whose distance rounds to the cap lies below the next value of the caps' dtype
    upper = torch.nextafter(caps, caps.new_tensor(float("inf"))).to(torch.float64)
    if problem.distance == "dot":
        keys = upper
    elif problem.distance == "cosine":
        keys = upper - 1.0
    else:
        squared = upper * upper if problem.distance == "euclidean" else upper
        keys = squared - problem.query_sq64[rows]
    tolerance = key_tolerance(problem, rows, rounding)
    return keys + 2.0 * tolerance + 1e-6 * (keys.abs() + tolerance)


def _near_duplicate_limit(problem: Problem, rows: Tensor, tolerance: Tensor) -> Tensor:
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


class Ranked(NamedTuple):
    distances: Tensor  # (R, K) in the query's dtype
    indices: Tensor  # (R, K) int64
    valid: Tensor  # (R, K) bool
    certified: Tensor  # (R,) bool: provably the exact answer


def order_by_distance_then_position(distances: Tensor, positions: Tensor, k: int) -> Tensor:
    """Per row, the first ``k`` columns of the permutation sorting by (distance, position).

    Float32 distances take one sort on a combined int64 key (``keys.order_key``), or a top-k selection on it
    when ``k`` is at most half the columns (a selection reads the key once, a sort several times); other dtypes
    two stable sorts.
    """
    if distances.dtype == torch.float32 and positions.numel() and int(positions.max()) < 2**31:
        key = order_key(distances, positions)
        if 2 * k <= key.shape[1]:  # the keys are distinct, except +inf slots of one position: any order of those
            return torch.topk(key, k, dim=1, largest=False, sorted=True).indices
        return torch.argsort(key, dim=1)[:, :k]
    by_position = torch.argsort(positions, dim=1, stable=True)
    return by_position.gather(1, torch.argsort(distances.gather(1, by_position), dim=1, stable=True))[:, :k]


def rank(
    problem: Problem,
    rows: Tensor,
    candidates: Candidates,
    k: int,
    exact_distances: bool,
    relevance: RelevanceFn | None = None,
) -> Ranked:
    """Distances of the candidates, stable order by (distance, gallery position), certificate.

    With ``exact_distances`` every candidate's distance is recomputed canonically in float64. Without,
    only the candidates whose key lies within two rounding bounds of another candidate's key are (near
    ties); the others keep the distance of their stage-1 key. The order is the same: a candidate whose
    key is further than two bounds from every other key is further than zero from them in exact
    distance too, on the same side (and far more than a float32 step apart after rounding). Near
    duplicates are recomputed too, so that a duplicate's distance is exactly 0.
    """
    indices, ok, floor, keys = candidates.indices, candidates.ok, candidates.floor, candidates.keys
    tolerance = candidate_tolerance(problem, rows, candidates)
    if not exact_distances and plan.use_compiled(ok.device, problem.query.shape[0], problem.gallery.shape[0]):
        return _rank_compiled(problem, rows, candidates, k, tolerance, relevance)
    if exact_distances:
        recompute = ok
    else:
        near = _near_ties(keys.masked_fill(~ok, float("inf")), 2.0 * tolerance)
        recompute = ok & (near | (keys <= _near_duplicate_limit(problem, rows, tolerance)[:, None]))
    pair_rows, slots = torch.nonzero(recompute, as_tuple=True)
    dtype = problem.dtype
    if exact_distances:
        values = torch.full(ok.shape, float("inf"), dtype=dtype, device=ok.device)
    else:
        values = _key_to_distance(problem, rows, keys).to(dtype).masked_fill_(~ok, float("inf"))
    values[pair_rows, slots] = canonical_distances(problem, rows, pair_rows, indices[pair_rows, slots]).to(dtype)
    order = order_by_distance_then_position(values, torch.where(ok, indices, problem.gallery.shape[0]), k)
    valid = ok.gather(1, order)
    distances = values.gather(1, order).masked_fill_(~valid, float("inf"))
    chosen = indices.gather(1, order).masked_fill_(~valid, 0)
    last = order[:, -1:]
    certified = _certified(
        problem, rows, ok, floor, tolerance, k, distances, keys.gather(1, last), recompute.gather(1, last)
    )
    return _within_caps(problem, rows, Ranked(distances, chosen, valid, certified))


def _certified(
    problem: Problem,
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
    certified = covered | ((n_found >= k) & (upper < bound))
    if problem.caps is not None:  # every item within the cap is a candidate
        certified |= bound > problem.caps[rows]
    return certified


def _within_caps(problem: Problem, rows: Tensor, ranked: Ranked) -> Ranked:
    """``ranked`` without the items beyond their query's cap: what a capped search promises is the exact top K
    among the items within the cap (beyond it, an item may be missing)."""
    if problem.caps is None:
        return ranked
    valid = ranked.valid & (ranked.distances <= problem.caps[rows, None])
    distances = ranked.distances.masked_fill(~valid, float("inf"))
    return ranked._replace(distances=distances, indices=ranked.indices.masked_fill(~valid, 0), valid=valid)


def _rank_compiled(
    problem: Problem,
    rows: Tensor,
    candidates: Candidates,
    k: int,
    tolerance: Tensor,
    relevance: RelevanceFn | None,
) -> Ranked:
    """:func:`rank` without exact distances, ordered by the compiled kernels of ``compiled.order``.

    With ``relevance``, a run of near ties whose items are all relevant or all irrelevant keeps its key
    order: any order of it gives every rank the same relevance, so only mixed runs are recomputed.
    """
    indices, ok, floor, keys = candidates.indices, candidates.ok, candidates.floor, candidates.keys
    keys32 = keys.to(torch.float32).masked_fill(~ok, float("inf"))
    near_limit = _near_duplicate_limit(problem, rows, tolerance)
    keys32, items, near = sort_by_key(keys32, indices.masked_fill(~ok, 0), 2.0 * tolerance, near_limit)
    ok = keys32 < float("inf")
    near &= ok
    if relevance is not None:
        near = mixed_runs(near, relevance(rows, items))
    dtype = problem.dtype
    values = torch.zeros(keys32.shape, dtype=dtype)
    pair_rows, slots = torch.nonzero(near, as_tuple=True)
    values[pair_rows, slots] = canonical_distances(problem, rows, pair_rows, items[pair_rows, slots]).to(dtype)
    order = order_runs(values, items, near)[:, :k]
    query_sq = problem.query_sq64[rows]
    distances, chosen, valid, recomputed = ranked_columns(
        keys32, items, near, values, order, query_sq, problem.distance
    )
    last_key = keys32.gather(1, order[:, -1:]).reshape(-1).to(torch.float64)
    certified = _certified(problem, rows, ok, floor, tolerance, k, distances, last_key, recomputed[:, -1])
    return Ranked(distances, chosen, valid, certified)


# ----------------------------------------------------------------------------------------------------------------------
# knn: public entry point
# ----------------------------------------------------------------------------------------------------------------------
