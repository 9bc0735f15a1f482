"""All-gathers of sharded mode: rows of any length per rank, in as few collectives as the data allows.

torchmetrics' ``gather_all_tensors`` starts every gather with a barrier and then takes two collectives (the
shapes, the padded data). Sharded ``compute()`` gathers a dozen per-sample fields at its start and end, so on
two CPU ranks those gathers cost a few percent of the call. Here a gather takes no barrier, and
:func:`gather_rows` moves a whole table of per-sample tensors in one collective per dtype plus one for the
row counts: collectives are ordered within a process group, so no barrier is needed between them.

Every collective of sharded mode goes through this module, and each one starts with a checkpoint
(:func:`~torchmetrics_retrieval.metrics._sharded.faults.checkpoint`: a one-element all-reduce), so that a rank whose
local work failed is known to every rank at their next collective, instead of leaving them waiting in it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.metrics._sharded.faults import checkpoint, communicating

__all__ = ["all_reduce", "gather", "gather_rows"]


def _padded(tensor: Tensor, shape: list[int]) -> Tensor:
    if list(tensor.shape) == shape:
        return tensor
    padded = tensor.new_zeros(shape)
    padded[tuple(slice(size) for size in tensor.shape)] = tensor
    return padded


def gather(tensor: Tensor, group: Any) -> list[Tensor]:
    """Every rank's ``tensor`` (same number of dimensions and dtype on every rank, any sizes), in rank order.

    Example (one process: the group of one rank)::

        >>> import torch, torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> gather(torch.tensor([[1, 2], [3, 4]]), None)
        [tensor([[1, 2],
                [3, 4]])]
        >>> dist.destroy_process_group()
    """
    checkpoint(group)
    if tensor.ndim == 0:
        return [part[0] for part in _gather(tensor.reshape(1), group)]
    return _gather(tensor, group)


def _gather(tensor: Tensor, group: Any) -> list[Tensor]:
    world = dist.get_world_size(group)
    shape = torch.tensor(tensor.shape, dtype=torch.long, device=tensor.device)
    shapes = [torch.empty_like(shape) for _ in range(world)]
    with communicating():
        dist.all_gather(shapes, shape, group=group)
    sizes = [[int(size) for size in s] for s in shapes]
    largest = [max(column) for column in zip(*sizes, strict=True)]
    padded = _padded(tensor.contiguous(), largest)
    parts = [torch.empty_like(padded) for _ in range(world)]
    with communicating():
        dist.all_gather(parts, padded, group=group)
    return [part[tuple(slice(size) for size in s)] for part, s in zip(parts, sizes, strict=True)]


def gather_rows(table: dict[str, Tensor], group: Any) -> dict[str, Tensor]:
    """Every rank's rows of ``table`` (tensors sharing their first dimension; the same keys, trailing shapes and
    dtypes on every rank), each tensor concatenated in rank order.

    The row counts take one collective, then the tensors of each dtype travel side by side in one more.

    Example (one process)::

        >>> import torch, torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> gathered = gather_rows({"labels": torch.tensor([3, 1]), "hits": torch.tensor([[True], [False]])}, None)
        >>> gathered["labels"], gathered["hits"].shape
        (tensor([3, 1]), torch.Size([2, 1]))
        >>> dist.destroy_process_group()
    """
    if not table:
        return {}
    checkpoint(group)
    first = next(iter(table.values()))
    n = first.shape[0]
    count = torch.tensor([n], device=first.device)  # one element on every rank: a plain all-gather
    every_count = [torch.empty_like(count) for _ in range(dist.get_world_size(group))]
    with communicating():
        dist.all_gather(every_count, count, group=group)
    counts = [int(c) for c in every_count]
    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, value in table.items():
        by_dtype.setdefault(value.dtype, []).append(key)
    gathered: dict[str, Tensor] = {}
    for keys in by_dtype.values():
        widths = [math.prod(table[key].shape[1:]) for key in keys]
        side_by_side = torch.cat([table[key].reshape(n, width) for key, width in zip(keys, widths, strict=True)], 1)
        block = _padded(side_by_side, [max(counts), sum(widths)])
        parts = [torch.empty_like(block) for _ in counts]
        with communicating():
            dist.all_gather(parts, block, group=group)
        whole = torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])
        for key, piece in zip(keys, whole.split(widths, dim=1), strict=True):
            gathered[key] = piece.reshape(whole.shape[0], *table[key].shape[1:]).contiguous()
    return {key: gathered[key] for key in table}


def all_reduce(tensor: Tensor, group: Any, op: Any = None) -> Tensor:
    """``dist.all_reduce`` of ``tensor`` in place (a sum unless ``op``), returned: every collective of sharded mode
    goes through this module."""
    checkpoint(group)
    with communicating():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return tensor
