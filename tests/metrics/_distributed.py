"""Run a function in real processes joined by torch.distributed (gloo on CPU), with a deadline.

``run_distributed(fn, world_size, out_dir, *args)`` has ``world_size`` processes each call
``fn(rank, world_size, *args)`` inside a freshly initialised process group and save what it returns to
``out_dir/rank{r}.pt``; the caller gets the list of the ranks' results. A process that hangs or fails makes
the test fail (every process is terminated) instead of blocking the suite.

The processes stay up between runs, for the whole test session: starting one costs seconds of imports (torch,
torchmetrics, the compiled kernels' cache), more than most runs. Each run still gets its own process group
(a new port, destroyed at the end), and what a run rebinds in the modules of the package and of the tests is
undone after it; a failed or hung run makes the next one start new processes.
"""

from __future__ import annotations

import atexit
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_OURS = ("torchmetrics_retrieval", "tests")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _module_globals_restored() -> Iterator[None]:
    """Undo what a run rebinds in the package's and the tests' modules (a patched function, a smaller block
    constant): the next run in this process must start as a fresh process would, and as the other ranks do."""
    saved = {name: dict(vars(module)) for name, module in list(sys.modules.items()) if name.startswith(_OURS)}
    try:
        yield
    finally:
        for name, namespace in saved.items():  # names added meanwhile (submodules imported) stay
            vars(sys.modules[name]).update(namespace)


def _run(rank: int, world_size: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        with _module_globals_restored():
            result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _serve(rank: int, tasks: Any, replies: Any) -> None:
    """A pool process: runs the tasks it is given as ``rank`` until it gets None."""
    torch.set_num_threads(1)
    while (task := tasks.get()) is not None:
        try:
            _run(rank, *task)
            replies.put((rank, None))
        except BaseException:
            replies.put((rank, traceback.format_exc()))


class _Pool:
    """Processes ``0 .. n-1`` waiting for tasks (functions of any test module, imported on first use)."""

    def __init__(self) -> None:
        self.context = mp.get_context("spawn")
        self.replies = self.context.Queue()
        self.workers: list[tuple[Any, Any]] = []  # (process, its task queue)

    def grow(self, size: int) -> None:
        while len(self.workers) < size:
            tasks = self.context.SimpleQueue()
            process = self.context.Process(target=_serve, args=(len(self.workers), tasks, self.replies), daemon=True)
            process.start()
            self.workers.append((process, tasks))

    def run(
        self, fn: Callable[..., Any], world_size: int, out_dir: Path, args: tuple[Any, ...], timeout: float
    ) -> None:
        self.grow(world_size)
        port = free_port()
        for _, tasks in self.workers[:world_size]:
            tasks.put((world_size, port, str(out_dir), fn, args))
        deadline, pending = time.monotonic() + timeout, set(range(world_size))
        while pending:
            try:
                rank, failure = self.replies.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r in pending if not self.workers[r][0].is_alive()]
                if dead:
                    raise RuntimeError(f"process {dead[0]} of {fn.__name__} died") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"distributed run of {fn.__name__} with {world_size} processes took over {timeout} s"
                    ) from None
                continue
            pending.discard(rank)
            if failure is not None:
                raise RuntimeError(self._failures(fn, {rank: failure}, pending))

    def _failures(self, fn: Callable[..., Any], failures: dict[int, str], pending: set[int]) -> str:
        """Every rank's failure, with the replies of the ranks still running (for a few seconds at most): the rank
        that failed first in time is not always the one whose reply comes first (its peers see the connection
        close)."""
        deadline = time.monotonic() + 5.0
        while pending and time.monotonic() < deadline:
            try:
                rank, failure = self.replies.get(timeout=0.5)
            except queue.Empty:
                continue
            pending.discard(rank)
            if failure is not None:
                failures[rank] = failure
        return "\n".join(f"rank {rank} of {fn.__name__} failed:\n{failures[rank]}" for rank in sorted(failures))

    def close(self) -> None:
        for process, tasks in self.workers:
            if process.is_alive():
                tasks.put(None)
        for process, _ in self.workers:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()


_pool: _Pool | None = None


def _close_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None


atexit.register(_close_pool)


def run_distributed(
    fn: Callable[..., Any], world_size: int, out_dir: Path, *args: Any, timeout: float = 180.0
) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo processes and return each rank's result (rank order)."""
    global _pool
    if _pool is None:
        _pool = _Pool()
    try:
        _pool.run(fn, world_size, out_dir, args, timeout)
    except BaseException:
        # a failed or hung rank leaves the others inside a collective: start afresh
        for process, _ in _pool.workers:
            process.terminate()
        _pool = None
        raise
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def sampler_rows(n: int, rank: int, world_size: int, seed: int | None = None) -> torch.Tensor:
    """The rows ``DistributedSampler`` gives ``rank``: the ``n`` rows (shuffled with ``seed``, if given) padded to a
    multiple of the world size with the first ones again, every ``world_size``-th from ``rank``."""
    order = torch.arange(n) if seed is None else torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    total = -(-n // world_size) * world_size
    return order[torch.arange(rank, total, world_size) % n]
