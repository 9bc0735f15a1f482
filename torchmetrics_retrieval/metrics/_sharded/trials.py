"""TrialMetrics, sharded: each trial scored by the rank that holds its enrolment sample, the scores gathered.

Every rank builds the de-duplicated global set from the gathered dataset indexes (:func:`global_rows`: which rank
holds each sample, and its row there) and maps the trial list to global rows, identically. A trial is scored by the
owner of its enrolment row; the test rows it does not hold are sent by their owners, point to point (each rank
receives only the distinct rows it needs). A trial's score depends on its two rows only,
so it is the score one process computes; the scores are gathered in the trial list's order and every rank computes
the values from them, as :func:`~torchmetrics_retrieval.functional.trials.trial_metrics` does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._trials import score_values, trial_scores
from torchmetrics_retrieval.metrics._sharded.faults import checkpoint
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import check_rows, global_rows
from torchmetrics_retrieval.metrics._sharded.search import _post, _wait

__all__ = ["sharded_trial_compute"]


#: Tag of the point-to-point messages that carry the test rows.
ROWS_TAG = 41


def _needed(by: int, source: int, enrol: Tensor, test: Tensor, owner: Tensor) -> Tensor:
    """The global rows rank ``by`` needs from rank ``source``: the test rows ``source`` holds of the trials whose
    enrolment row ``by`` holds (distinct, sorted). Every rank computes it alike."""
    return torch.unique(test[(owner[enrol] == by) & (owner[test] == source)])


def _exchanged_rows(
    local: Tensor, row: Tensor, owner: Tensor, enrol: Tensor, test: Tensor, group: Any
) -> tuple[Tensor, Tensor]:
    """``(rows, where)``: this rank's rows followed by the test rows it receives from their owners, and the position
    of each global row among them (-1: not here). In round ``k`` every rank sends to the rank ``k`` after it the
    rows that rank needs from it and receives from the rank ``k`` before it, point to point."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    where = torch.full((owner.numel(),), -1, dtype=torch.long, device=owner.device)
    own = owner == rank
    where[own] = row[own]
    blocks, offset = [local], local.shape[0]
    for k in range(1, world):
        to, source = (rank + k) % world, (rank - k) % world
        send = local[row[_needed(to, rank, enrol, test, owner)]].contiguous()
        wanted = _needed(rank, source, enrol, test, owner)
        receive = local.new_empty((wanted.numel(), *local.shape[1:]))
        checkpoint(group)  # every rank passed it: each message posted below is matched by its peer
        _wait(_post([send], to, [receive], source, group, ROWS_TAG))
        where[wanted] = offset + torch.arange(wanted.numel(), device=owner.device)
        blocks.append(receive)
        offset += wanted.numel()
    return (torch.cat(blocks) if len(blocks) > 1 else local), where


def sharded_trial_compute(metric: Any, group: Any) -> dict[str, Tensor]:
    """The values of ``metric`` (a :class:`~torchmetrics_retrieval.metrics.trials.TrialMetrics`) over the samples of
    every rank, the embeddings left where they are. Every rank must call it (it is a sequence of collectives)."""
    local, _, owner, row, indexes = global_rows(metric, group)
    assert indexes is not None  # a required field
    check_rows(local, metric.distance, group)  # a bad row (zero for cosine): the same ValueError on every rank
    enrol, test, is_target = metric.trial_rows(indexes)  # the same on every rank (raises on every rank alike)
    rank = dist.get_rank(group)
    rows, where = _exchanged_rows(local, row, owner, enrol, test, group)
    mine = owner[enrol] == rank
    if bool(mine.any()):
        scored = trial_scores(rows, where[enrol[mine]], where[test[mine]], metric.distance, metric.chunk_size)
    else:  # no enrolment sample here (an empty rank): nothing to score
        scored = rows.new_empty((0,))
    every = gather(scored, group)
    scores = torch.empty(enrol.numel(), dtype=scored.dtype, device=scored.device)
    by = owner[enrol]
    for source, part in enumerate(every):
        scores[by == source] = part.to(scores.device)
    return score_values(scores, is_target, metric.request)
