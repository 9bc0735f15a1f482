"""Failures of sharded ``compute()`` known to every rank: one clear error everywhere instead of a hang.

Sharded ``compute()`` is a sequence of collectives with local work in between. When the local work raises on one
rank, the others would wait for it in their next collective until the process group's timeout (30 minutes by
default), or fail with a transport error that names neither the rank nor the cause. So:

* every collective of sharded mode starts with a :func:`checkpoint`: one all-reduce of a flag, the same on every
  rank wherever it is called, so that the ranks agree, step by step, that none of them failed;
* the metric classes run their sharded ``compute()`` inside :func:`agreed`: a rank whose local work raised calls
  the checkpoint with its failure (no collective runs while the exception unwinds, so it meets the other ranks at
  their next checkpoint), and a rank that completed calls a last one, so that a failure after the last
  collective is seen too. Every rank then raises: the failing rank its own exception (its traceback is where the
  bug is), the others a :class:`ShardedComputeError` naming the failing rank and its exception;
* errors of the communication itself (a peer that exited, a timeout) are never followed by a checkpoint: the
  group cannot be trusted any more, and a checkpoint would wait for its own timeout (:func:`communicating`).

The point-to-point exchanges of the symmetric search (``search.py``) take a checkpoint before every wait, so a
rank only ever waits for messages its peers have posted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ShardedComputeError", "agreed", "broken", "checkpoint", "communicating", "settled"]

#: Bytes of a failure's description sent to every rank (longer ones are cut).
MESSAGE_BYTES = 2048
#: Set on a failure every rank already knows of: no checkpoint follows it.
_SETTLED = "_sharded_settled"
#: Set on an error of the communication itself: no checkpoint follows it, nor a wait for messages in flight.
_BROKEN = "_sharded_broken"


class ShardedComputeError(RuntimeError):
    """Raised by sharded ``compute()`` on every rank that did not fail itself, when other ranks did.

    ``failures`` maps each failing rank to its exception (``"Type: message"``); the failing ranks raise their own
    exceptions.
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.failures)


def broken(error: BaseException) -> bool:
    """Whether ``error`` came from the communication (a peer gone, a timeout): the group cannot be trusted."""
    return bool(getattr(error, _BROKEN, False))


def settled(error: BaseException) -> bool:
    """Whether no checkpoint may follow ``error``: every rank already knows of it, or it came from the
    communication."""
    return isinstance(error, ShardedComputeError) or broken(error) or bool(getattr(error, _SETTLED, False))


def _settle(error: BaseException) -> None:
    setattr(error, _SETTLED, True)


@contextlib.contextmanager
def communicating() -> Iterator[None]:
    """Around a call of ``torch.distributed``: an error inside is the communication's (a peer gone, a timeout),
    and is marked so that no checkpoint waits on the broken group after it."""
    try:
        yield
    except Exception as error:
        setattr(error, _BROKEN, True)
        raise


def _device(group: Any) -> torch.device:
    """The device of the checkpoint's tensors: the one the group's object collectives use (the CPU when the group
    has a CPU backend), the same on every rank whatever device the data of the step is on."""
    pick = getattr(dist.distributed_c10d, "_get_object_coll_device", None)
    return torch.device(pick(group) if pick is not None else "cpu" if dist.get_backend(group) == "gloo" else "cuda")


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__qualname__}: {text}" if text else type(error).__qualname__


def _note(error: BaseException, text: str) -> None:
    if hasattr(error, "add_note"):  # Python 3.11+
        error.add_note(text)


def _encoded(text: str, device: torch.device) -> torch.Tensor:
    data = list(text.encode("utf-8", "replace")[:MESSAGE_BYTES])
    return torch.tensor(data + [0] * (MESSAGE_BYTES - len(data)), dtype=torch.uint8, device=device)


def _decoded(message: torch.Tensor) -> str:
    return bytes(message.cpu().tolist()).rstrip(b"\0").decode("utf-8", "replace")


def _failures(group: Any, device: torch.device, failure: BaseException | None, where: str) -> dict[int, str]:
    """Every rank's failure (rank: ``"Type: message"``; empty when none failed): one all-reduce of a flag and, when
    it is set, one all-gather of the descriptions."""
    flag = torch.tensor([int(failure is not None)], dtype=torch.int64, device=device)
    with communicating():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if not int(flag):
        return {}
    text = "" if failure is None else f"{where}\n{_describe(failure)}"
    parts = [torch.empty(MESSAGE_BYTES, dtype=torch.uint8, device=device) for _ in range(dist.get_world_size(group))]
    with communicating():
        dist.all_gather(parts, _encoded(text, device), group=group)
    return {rank: text for rank, part in enumerate(parts) if (text := _decoded(part))}


def checkpoint(group: Any, failure: BaseException | None = None, where: str = "sharded compute()") -> None:
    """Agree with every rank of ``group`` that none failed (every rank must call it at the same step).

    A rank whose local work raised ``failure`` calls it with that exception (``where``: what it was running): the
    other ranks learn of it at their next checkpoint and this call returns, for the caller to raise ``failure``
    (marked so that no outer checkpoint runs for it again).

    Raises:
        ShardedComputeError: on a rank without ``failure``, when another rank failed (naming it and its
            exception).
    """
    try:
        failures = _failures(group, _device(group), failure, where)
    except Exception as error:
        if failure is None:
            raise
        _settle(failure)  # the group is broken: the failure is raised as it is, the others see the transport error
        _note(failure, f"(the other ranks could not be told of it: {_describe(error)})")
        return
    if not failures:
        return
    parts = {rank: text.partition("\n") for rank, text in failures.items()}  # (where, "\n", "Type: message")
    lines = {rank: f"rank {rank} failed in {name}: {what}" for rank, (name, _, what) in parts.items()}
    if failure is not None:
        _settle(failure)
        own = dist.get_rank(group)
        for rank, line in lines.items():
            if failures[rank] != failures.get(own):  # the same error on every rank (a check of the inputs): no note
                _note(failure, line)
        return
    message = "\n".join(lines.values())
    hint = "its traceback is raised on that rank" if len(lines) == 1 else "their tracebacks are raised on those ranks"
    raise ShardedComputeError(f"{message}\n({hint})", {rank: what for rank, (_, _, what) in parts.items()})


@contextlib.contextmanager
def agreed(group: Any, where: str) -> Iterator[None]:
    """Run a sharded computation over ``group`` (``where``: its name in the errors, e.g.
    ``"EmbeddingMetrics.compute()"``) so that a failure on any rank is raised on every rank within a step.

    An ``Exception`` raised locally inside the block is told to the other ranks (:func:`checkpoint`) and then
    raised as it is; a :class:`ShardedComputeError` (another rank failed) or an error of the communication is
    raised at once. Leaving the block normally takes a last checkpoint, so that a rank that failed after the last
    collective does not wait for the others in their next one. ``KeyboardInterrupt`` and ``SystemExit`` pass
    straight through: the process is ending, and the others learn of it from their transport.

    Example (one process: the group of one rank; the failing rank raises its own exception)::

        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> with agreed(None, "an example"):
        ...     raise MemoryError("simulated")
        Traceback (most recent call last):
        MemoryError: simulated
        >>> dist.destroy_process_group()
    """
    try:
        yield
    except Exception as error:
        if not settled(error):
            checkpoint(group, error, where)
        raise
    checkpoint(group)
