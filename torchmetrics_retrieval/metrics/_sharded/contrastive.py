"""Sharded ``ContrastiveAccuracy`` under DDP: every rank keeps its own pairs; only ``z1`` rows travel, in blocks.

Only the dataset indexes are gathered (:func:`~.global_set.global_rows`): every rank
learns which rank owns each sample of the de-duplicated global set and keeps, of its own rows, those it owns
(``z1[i]`` and ``z2[i]`` are stored together, so pairs stay paired). The owner normalises its rows (row by row:
the values of one process) and computes each pair's canonical partner similarity (the float64 dot product).

Then, in rounds, every rank's next block of ``z1`` rows and their partner values is all-gathered, and every rank
counts, in one :func:`~torchmetrics_retrieval.functional.contrastive._count_above` pass of the rectangle between
the visitors and its shard, both directions at once: its rows give, for each visitor ``i``, the ``z2`` rows of
the shard strictly more similar to ``z1[i]`` than its partner (direction 1; all-reduced, so summed over every
shard: over all candidates), and its columns give, for each ``z2[j]`` of the shard, the visiting ``z1`` rows
strictly more similar to it than its partner (direction 2; summed over the rounds, in which every ``z1`` row of
the set visits: over all candidates). So each similarity of the global set is computed once, as on one process.

Why exact: a count is decided per (row, candidate) pair, by a fast similarity outside a rounding bound of the
partner value or else by the canonical float64 dot product of the two rows, which does not depend on which
rows are counted together; the bound is taken with the global maxima of the row norms, so it is valid for
every shard and block. Counts over a split of the candidates add up to the counts over all of them, a hit is
``count < k``, and the hits are integers summed over the ranks: the accuracy is that of one process, bit for bit.

Memory per rank: its own shard (and its float64 partner values), one visiting block (``VISIT_BLOCK`` rows of
every rank), its counts and one ``chunk_size`` tile.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings
from torchmetrics_retrieval.functional._search.keys import largest_norm
from torchmetrics_retrieval.functional.contrastive import (
    DEFAULT_CHUNK,
    _count_above,
    _pair_dots,
    _prepare,
    _rounding_bound,
)
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce
from torchmetrics_retrieval.metrics._sharded.global_set import global_rows
from torchmetrics_retrieval.metrics._sharded.rounds import visiting_rounds
from torchmetrics_retrieval.metrics._state import _concat

__all__ = ["VISIT_BLOCK", "sharded_contrastive"]

#: Pairs of one rank whose ``z1`` rows visit every rank in one round (each round all-gathers one block per rank).
VISIT_BLOCK = 4096


def _check_finite(views: dict[str, Tensor], group: Any) -> None:
    """The gathered path's check of the values (finite), on every rank at once: a rank that found a bad row must
    not leave the others waiting in the next collective."""
    message = ""
    try:
        for name, view in views.items():
            check_embeddings(name, view, allow_empty=True)
    except ValueError as error:
        message = str(error)
    flags = torch.tensor([len(message) > 0], dtype=torch.long, device=next(iter(views.values())).device)
    all_reduce(flags, group)
    if int(flags):
        raise ValueError(message or f"`z1`/`z2` of {int(flags)} other process(es) failed the checks of the rows.")


def _own_pairs(metric: Any, group: Any) -> tuple[Tensor, Tensor, int]:
    """``(z1, z2, n)``: this rank's pairs of the de-duplicated global set (in the compute dtype, normalised as
    asked) and the number of pairs of that set."""
    z1, _, owner, row, _ = global_rows(metric, group)  # raises the same on every rank (no sample, shapes differ)
    stored_z2 = _concat(metric.z2)
    mine = row[owner == dist.get_rank(group)]
    views = {"z1": z1[mine], "z2": (z1 if stored_z2 is None else stored_z2)[mine]}
    _check_finite(views, group)
    dtype = torch.promote_types(z1.dtype, torch.float32)  # both views are stored in one dtype: as the functional
    a, b = (_prepare(view, dtype, metric.normalize, metric.eps) for view in views.values())
    return a, b, owner.numel()


def _accuracy(hits: Tensor, n: int) -> Tensor:
    """``hits / n`` as the functional computes it: the float32 mean of ``n`` zeros and ones (exact sums)."""
    return (torch.arange(n, device=hits.device) < hits).float().mean()


def sharded_contrastive(metric: Any, group: Any) -> Tensor | dict[str, Tensor]:
    """The value of ``metric.compute()`` (a ``ContrastiveAccuracy``) when every rank keeps its own pairs."""
    a, b, n = _own_pairs(metric, group)
    single = isinstance(metric.top_k, int)
    ks: tuple[int, ...] = (metric.top_k,) if single else metric.top_k
    k = torch.tensor(ks, device=a.device)
    own = torch.arange(a.shape[0], device=a.device)
    partner = _pair_dots(a, b, own, own)
    norms = torch.tensor([largest_norm(a), largest_norm(b)], dtype=torch.float64, device=a.device)
    all_reduce(norms, group, dist.ReduceOp.MAX)
    tol = _rounding_bound(a.shape[1], a.dtype, float(norms[0]), float(norms[1]))
    chunk = metric.chunk_size or DEFAULT_CHUNK
    hits_1 = torch.zeros(len(ks), dtype=torch.int64, device=a.device)  # direction 1 of this rank's pairs
    above_2 = torch.zeros(a.shape[0], dtype=torch.int64, device=a.device)  # direction 2, summed over the rounds
    for visit in visiting_rounds(a.shape[0], VISIT_BLOCK, group, a.device):
        visiting, visiting_partner = visit.join(a[visit.mine]), visit.join(partner[visit.mine])
        above_1, above_own = _count_above(visiting, b, visiting_partner, partner, tol, chunk)
        above_2 += above_own
        all_reduce(above_1, group)  # this shard's candidates + every other shard's: all of them
        hits_1 += (above_1[visit.ours, None] < k).sum(dim=0)
    hits = torch.stack([hits_1, (above_2[:, None] < k).sum(dim=0)])
    all_reduce(hits, group)
    scores = [0.5 * (_accuracy(hits[0, i], n) + _accuracy(hits[1, i], n)) for i in range(len(ks))]
    if single:
        return scores[0]
    return {f"contrastive_accuracy/{top_k}": score for top_k, score in zip(ks, scores, strict=True)}
