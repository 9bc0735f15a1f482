"""TrialMetrics, sharded: each trial scored by the rank that holds its enrolment sample, the scores gathered.

Every rank builds the de-duplicated global set from the gathered dataset indexes (:func:`global_rows`: which rank
holds each sample, and its row there) and maps the trial list to global rows, identically. A trial is scored by the
owner of its enrolment row; the test rows it does not hold are sent by their owners (each rank sends, in one
all-gather, the distinct rows of its own that another rank needs). A trial's score depends on its two rows only,
so it is the score one process computes; the scores are gathered in the trial list's order and every rank computes
the values from them, as :func:`~torchmetrics_retrieval.functional.trials.trial_metrics` does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._trials import score_values, trial_scores
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import global_rows

__all__ = ["sharded_trial_compute"]


def _sent(rank: int, enrol: Tensor, test: Tensor, owner: Tensor) -> Tensor:
    """The global rows ``rank`` sends: its test rows of trials whose enrolment row another rank holds (sorted)."""
    return torch.unique(test[(owner[test] == rank) & (owner[enrol] != rank)])


def sharded_trial_compute(metric: Any, group: Any) -> dict[str, Tensor]:
    """The values of ``metric`` (a :class:`~torchmetrics_retrieval.metrics.trials.TrialMetrics`) over the samples of
    every rank, the embeddings left where they are. Every rank must call it (it is a sequence of collectives)."""
    local, _, owner, row, indexes = global_rows(metric, group)
    assert indexes is not None  # a required field
    enrol, test, is_target = metric.trial_rows(indexes)  # the same on every rank (raises on every rank alike)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    parts = gather(local[row[_sent(rank, enrol, test, owner)]], group)
    # this rank's rows first, then the rows the others sent, and where each global row sits among them
    where = torch.full((owner.numel(),), -1, dtype=torch.long, device=owner.device)
    own = owner == rank
    where[own] = row[own]
    blocks, offset = [local], local.shape[0]
    for source in range(world):
        if source == rank:
            continue
        sent = _sent(source, enrol, test, owner)
        where[sent] = offset + torch.arange(sent.numel(), device=owner.device)
        blocks.append(parts[source])
        offset += sent.numel()
    rows = torch.cat(blocks) if len(blocks) > 1 else local
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
