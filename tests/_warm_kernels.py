"""Compile the package's numba kernels into their on-disk cache before the test processes start (see conftest).

On a fresh clone the cache is empty, and every process that reached a kernel before it was cached (both xdist
workers, the gloo ranks, the notebook kernels, the subprocesses of the thread and command-line tests) compiled
it again for itself, seconds per kernel. Here two processes compile them side by side (``search`` then
``ranks``, which searches first and loads the search kernels from the cache; ``pairs``, which never searches)
through the public functions on small data with the compiled plan forced; every later process loads them from
the cache. Nothing is asserted: the tests check the values, and compile whatever is missed here, as before.
"""

from __future__ import annotations

import sys

import torch

import torchmetrics_retrieval.functional as F
from torchmetrics_retrieval.functional._search import plan


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (600, 6), generator=g).float()
    x[10:20] = x[3]
    return x, torch.randint(0, 20, (600,), generator=g)


def search() -> None:
    x, _ = data()
    seq = torch.arange(600) // 7
    knobs = plan.SYMMETRIC_BUFFER_BYTES, plan.GROUP_ROWS
    for dtype in (torch.float32, torch.float64):
        y = x.to(dtype)
        for distance in ("euclidean", "cosine", "dot"):
            for precision in ("float32", "bfloat16"):
                F.knn(y, k=9, distance=distance, backend="torch", sequence_ids=seq, search_precision=precision)
                F.knn(y[:100], y, k=9, distance=distance, backend="torch", search_precision=precision)
                F.knn(y[:100], y, k=9, distance=distance, backend="faiss", search_precision=precision)
        plan.SYMMETRIC_BUFFER_BYTES, plan.GROUP_ROWS = 0, 128  # the symmetric sweep
        F.knn(y, k=9, backend="torch")
        plan.SYMMETRIC_BUFFER_BYTES, plan.GROUP_ROWS = knobs
    for dtype in (torch.float32, torch.float64):  # stage 2 ordered by the compiled kernels (no exact distances)
        y = x.to(dtype)
        F.knn(y, k=9, backend="torch", exact_distances=False, sequence_ids=seq)
        F.knn(y[:100], y, k=9, backend="torch", exact_distances=False)
    for dtype in (torch.float16, torch.bfloat16):  # rows stored in half precision, made float32 block by block
        for distance in ("euclidean", "cosine", "dot"):
            F.knn(x.to(dtype), k=9, distance=distance, backend="torch")
            F.knn(x[:100].to(dtype), x.to(dtype), k=9, distance=distance, backend="torch")


def ranks() -> None:
    """The full-ranking count and the per-query values (after ``search``: they search first, from its cache)."""
    x, labels = data()
    for dtype in (torch.float32, torch.float64):
        y = x.to(dtype)
        F.retrieval_metrics(y, labels, cmc_top_k=(1, 5), map_at_r=True, mrr=True, map_full=True, minp=True)
        F.retrieval_per_query(y, labels, options=F.RetrievalOptions(map_at_r=True, r_precision=True))


def pairs() -> None:
    """The passes over every pair (rates, ROC AUC) and the score kernels: no search, so alongside ``search``."""
    x, labels = data()
    for dtype in (torch.float32, torch.float64):
        y = x.to(dtype)
        F.fnmr_at_fmr(y, labels, fmr_vals=(0.01, 0.1), eer=True, roc_auc=True)
        F.fnmr_at_fmr(y, labels, fmr_vals=(0.1,), eer=True, chunk_size=64)
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        scores = torch.randn(2000, generator=g).to(dtype)
        targets = torch.rand(2000, generator=g) < 0.3
        options = {"fmr_vals": (0.01, 0.1), "min_dcf_p_target": 0.01, "act_dcf_p_target": 0.01}
        F.score_metrics(scores, targets, eer=True, roc_auc=True, cllr=True, **options)  # type: ignore[arg-type]


PARTS = {"search": (search, ranks), "pairs": (pairs,)}

if __name__ == "__main__":
    with plan.force_compiled(True):
        for part in PARTS[sys.argv[1]]:
            part()
