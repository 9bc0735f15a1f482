"""The one visiting-rounds driver of sharded mode: every rank's own list of rows, a block at a time, visits every
rank, which serves the visitors against its shard.

A round all-gathers one block per rank (``Visit.join``) and each rank keeps, of what every rank computed for the
visitors, the rows of its own block (``Visit.ours``). Every rank runs the same number of rounds, the largest any
rank needs (one ``all_reduce``), so that every rank enters the same collectives in the same order; a rank whose
list is exhausted visits with an empty block. The searches of queries apart from the gallery, the full-ranking
counts and ContrastiveAccuracy's counts all run in these rounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather

__all__ = ["Visit", "visiting_rounds"]


class Visit(NamedTuple):
    """One round: this rank's block ``mine`` (a slice of its own list) and that block's rows among the visitors
    (``ours``: every rank's block side by side, in rank order)."""

    mine: slice
    ours: slice
    group: Any

    def join(self, block: Tensor) -> Tensor:
        """Every rank's ``block`` (rows of its own block), concatenated in rank order: the visitors."""
        return torch.cat(gather(block, self.group))


def visiting_rounds(n_mine: int, block: int, group: Any, device: torch.device) -> Iterator[Visit]:
    """The rounds in which this rank's ``n_mine`` rows visit ``block`` at a time; every rank must iterate them
    to the end, together.

    Example (one process: the group of one rank)::

        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> [(v.mine.start, v.mine.stop) for v in visiting_rounds(5, 2, None, torch.device("cpu"))]
        [(0, 2), (2, 4), (4, 5)]
        >>> dist.destroy_process_group()
    """
    rounds = torch.tensor([math.ceil(n_mine / block)], device=device)
    all_reduce(rounds, group, dist.ReduceOp.MAX)
    rank = dist.get_rank(group)
    for b in range(int(rounds)):
        mine = slice(min(b * block, n_mine), min((b + 1) * block, n_mine))
        sizes = [int(size) for size in gather(torch.tensor(mine.stop - mine.start, device=device), group)]
        start = sum(sizes[:rank])
        yield Visit(mine, slice(start, start + sizes[rank]), group)
