"""No result depends on the number of threads: 1, 2 and 3 threads give bit-identical neighbours and metrics.

Each thread count runs in a fresh process (numba's pool size is fixed when it starts: ``NUMBA_NUM_THREADS=3``
lets 3 threads run even on a 2-core machine), on data with exact ties and duplicates, with the compiled
kernels forced on and off (both in the same process: one process per thread count serves both tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = """
import sys
import torch
import torchmetrics_retrieval.functional as F
from torchmetrics_retrieval.functional._search import plan

threads, out = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
x = torch.randint(-3, 4, (3000, 6), generator=g).float()  # exact ties everywhere
x[100:160] = x[7]  # duplicates
labels = torch.randint(0, 40, (3000,), generator=g)
seq = torch.randint(0, 900, (3000,), generator=g)
knobs = plan.SYMMETRIC_BUFFER_BYTES, plan.GROUP_ROWS
runs = {}
for compiled in (False, True):  # the torch passes first, in a process where numba has not started its pool
    results = runs[compiled] = {}
    with plan.force_compiled(compiled):
        for backend in ("torch", "faiss"):
            found = F.knn(x, k=40, backend=backend, sequence_ids=seq)
            results[f"knn/{backend}"] = tuple(found)
            found = F.knn(x[:700], x, k=150, backend=backend, exact_distances=False)
            results[f"knn_gallery/{backend}"] = tuple(found)
        plan.SYMMETRIC_BUFFER_BYTES, plan.GROUP_ROWS = 0, 512  # the symmetric sweep, group by group
        results["sweep"] = tuple(F.knn(x, k=40, backend="torch"))
        plan.SYMMETRIC_BUFFER_BYTES, plan.GROUP_ROWS = knobs
        # 2000 rows: the full rankings' torch pass compares N^2 pairs with each row's ~N/40 relevant ranks
        metrics, per_query = F.retrieval_metrics(
            x[:2000], labels[:2000], cmc_top_k=(1, 5), map_at_r=True, mrr=True, map_full=True, minp=True,
            fmr_vals=(0.001, 0.01, 0.1), return_per_query=True,
        )
        results["metrics"] = metrics
        results["per_query"] = per_query.values
        results["chunked"] = F.retrieval_per_query(
            x, labels, options=F.RetrievalOptions(map_at_r=True, r_precision=True), keep_neighbours=False
        ).values
    assert torch.get_num_threads() == threads  # the thread count the results are compared at, kept
torch.save(runs, out)
"""


def run(threads: int, out_dir: Path) -> dict:  # type: ignore[type-arg]
    """The worker's results on ``threads`` threads, keyed by ``compiled`` (True: kernels forced on)."""
    out = out_dir / f"{threads}.pt"
    env = {**os.environ, "NUMBA_NUM_THREADS": "3", "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-c", WORKER, str(threads), str(out)], env=env, check=True)
    return torch.load(out)


@pytest.fixture(scope="module")
def by_threads(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    """One fresh process per thread count (1, 2, 3), each running the worker with the kernels on and off."""
    out_dir = tmp_path_factory.mktemp("threads")
    return {threads: run(threads, out_dir) for threads in (1, 2, 3)}


def assert_identical(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())), where
        both = ~(a.isnan() if a.is_floating_point() else torch.zeros_like(a, dtype=torch.bool))
        assert torch.equal(a[both], b[both]), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}/{key}")
    else:
        assert isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            assert_identical(u, v, f"{where}[{i}]")


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled kernels", "torch passes"])
def test_one_two_and_three_threads_give_identical_results(by_threads: dict, compiled: bool) -> None:  # type: ignore[type-arg]
    one = by_threads[1][compiled]
    assert set(one) == {
        "knn/torch",
        "knn/faiss",
        "knn_gallery/torch",
        "knn_gallery/faiss",
        "sweep",
        "metrics",
        "per_query",
        "chunked",
    }
    for threads in (2, 3):
        assert_identical(by_threads[threads][compiled], one, f"{threads} threads")


@pytest.mark.parametrize(
    "call",
    [
        "F.knn(x, k=5)",
        # the pair passes start with a sample of their pairs, which runs a kernel of its own
        "F.fnmr_at_fmr(x, labels, fmr_vals=(0.1,), eer=True, chunk_size=64)",
        "F.fnmr_at_fmr(x, labels, fmr_vals=(), roc_auc=True)",
        "F.retrieval_metrics(x, labels, map_full=True)",
    ],
)
def test_the_compiled_kernels_keep_to_torch_thread_count_and_leave_it_alone(call: str) -> None:
    # Starting numba's OpenMP pool resets the process's OpenMP thread count, which torch reads as its own: the
    # first kernel of a fresh process must not start it on every core.
    code = (
        "import numba, torch\n"
        "torch.set_num_threads(1)\n"
        "import torchmetrics_retrieval.functional as F\n"
        "from torchmetrics_retrieval.functional._search import plan\n"
        "x, labels = torch.randn(600, 8), torch.arange(600) % 30\n"
        "with plan.force_compiled(True):\n"
        f"    {call}\n"
        "print(torch.get_num_threads(), numba.get_num_threads())\n"
    )
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]
