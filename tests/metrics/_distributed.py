"""Run a function in real processes joined by torch.distributed (gloo on CPU), with a deadline.

``run_distributed(fn, world_size, out_dir, *args)`` starts ``world_size`` processes; each calls
``fn(rank, world_size, *args)`` inside an initialised process group and saves what it returns to
``out_dir/rank{r}.pt``; the caller gets the list of the ranks' results. A process that hangs or fails
makes the test fail (the others are terminated) instead of blocking the suite.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any], world_size: int, out_dir: Path, *args: Any, timeout: float = 180.0
) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo processes and return each rank's result (rank order)."""
    context = mp.spawn(_worker, args=(world_size, free_port(), str(out_dir), fn, args), nprocs=world_size, join=False)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            raise TimeoutError(f"distributed run of {fn.__name__} with {world_size} processes took over {timeout} s")
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def sampler_rows(n: int, rank: int, world_size: int, seed: int | None = None) -> torch.Tensor:
    """The rows ``DistributedSampler`` gives ``rank``: the ``n`` rows (shuffled with ``seed``, if given) padded to a
    multiple of the world size with the first ones again, every ``world_size``-th from ``rank``."""
    order = torch.arange(n) if seed is None else torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    total = -(-n // world_size) * world_size
    return order[torch.arange(rank, total, world_size) % n]
