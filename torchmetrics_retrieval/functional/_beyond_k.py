"""The per-query values that lie beyond a search's K: the reciprocal rank over the whole ranking (``mrr``, for
the queries with no relevant item within K), full-ranking average precision (``map``) and the inverse negative
penalty (``minp``), from the ranks of the relevant items that the full-ranking count finds (``_ranks``), on one
process or, with the ranks of sharded mode, across processes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._ranks import plan as ranks_plan
from torchmetrics_retrieval.functional._ranks.count import relevant_ranks
from torchmetrics_retrieval.functional._sets import QueryGallery

__all__ = ["RanksFn", "beyond_k"]


#: ``ranks(rows, max_relevant, last)``: :func:`relevant_ranks` of the queries ``rows`` (indexes into the caller's
#: queries). Sharded mode passes its own: every rank calls it alike (its collectives must meet), even with no row.
RanksFn = Callable[[Tensor, int | None, bool], Tensor]


def _mrr(
    qg: QueryGallery, options: RetrievalOptions, within_k: Tensor, n_relevant: Tensor, ranks: RanksFn | None = None
) -> Tensor:
    """Exact reciprocal rank over the full ranking from the one within the retrieved K (0: no hit there);
    only queries with no hit in the top K take a second, streaming pass (``ranks``; default: this process's)."""
    values = within_k.clone()
    beyond = torch.nonzero((values == 0) & (n_relevant > 0)).flatten()
    find = ranks or (lambda rows, most, last: relevant_ranks(qg.take(rows), n_relevant[rows], options, most, last))
    first = find(beyond, 1, False)  # even without such a query: sharded, the other ranks may have some
    if beyond.numel():
        values[beyond] = 1.0 / first[:, 0].to(values.dtype)
    return values


def _full_ranking_values(
    qg: QueryGallery, options: RetrievalOptions, n_relevant: Tensor, ranks: RanksFn | None = None
) -> dict[str, Tensor]:
    """Exact full-ranking average precision (``map``) from the ranks of every relevant item, and the inverse
    negative penalty (``minp``: n(q) / rank of the last relevant item; 0 without one), from the same ranks or,
    alone, from the last item's rank only (``ranks``; default: this process's, over the whole ``qg``)."""
    values: dict[str, Tensor] = {}
    find = ranks or (lambda rows, most, last: relevant_ranks(qg, n_relevant, options, most, last))
    every = torch.arange(n_relevant.shape[0], device=n_relevant.device)
    if options.map_full:
        full = find(every, None, False)
        position = torch.arange(1, full.shape[1] + 1, device=full.device, dtype=torch.float64)
        precision_sums = torch.zeros(full.shape[0], dtype=torch.float64, device=full.device)
        # the full ranking's budget of entries at a time: the float64 temporaries of all the ranks at once were
        # 4x the ranks (3.2 GB at N = 100k with 999 relevant items per query)
        for rows in every.split(max(1, ranks_plan.BUDGET_ENTRIES // max(1, full.shape[1]))):
            part = full[rows].to(torch.float64)
            precision_sums[rows] = torch.where(part > 0, position[None, :] / part.clamp(min=1), 0.0).sum(dim=1)
        values["map"] = (precision_sums / n_relevant.clamp(min=1)).to(torch.float32)
        last = full.gather(1, (n_relevant - 1).clamp(min=0)[:, None])[:, 0] if full.shape[1] else full[:, 0:0]
        last = last.to(torch.float64)
    elif options.minp:
        last = find(every, None, True).to(torch.float64)
    if options.minp:
        last = last.reshape(-1) if last.numel() else torch.zeros(n_relevant.shape[0], dtype=torch.float64)
        inverse = n_relevant.to(torch.float64) / last.clamp(min=1)
        values["minp"] = torch.where(n_relevant > 0, inverse, 0.0).to(torch.float32)
    return values


def beyond_k(
    qg: QueryGallery,
    options: RetrievalOptions,
    values: dict[str, Tensor],
    n_relevant: Tensor,
    ranks: RanksFn | None = None,
    mrr_beyond: bool = True,
) -> dict[str, Tensor]:
    """``values`` (the ranking values within K of the queries whose n(q) is ``n_relevant``) completed with what
    lies beyond K: ``mrr`` over the full ranking (unless not ``mrr_beyond``: a user's lists rank nothing beyond
    them) and the full-ranking values (``ranks``: as in :func:`_mrr`)."""
    if options.mrr and mrr_beyond:
        values["mrr"] = _mrr(qg, options, values["mrr"], n_relevant, ranks)
    if options.map_full or options.minp:
        values.update(_full_ranking_values(qg, options, n_relevant, ranks))
    return values
