"""Speed and memory of ``knn`` against bare faiss and a plain torch ``mm + topk``, in one process.

Leave-one-out search (every point is a query and a gallery item) on synthetic clustered, L2-normalised
embeddings. Not a test: run it by hand, e.g.

    python benchmarks/bench_knn.py                       # N = 10k, 30k; K = 21, 100, 1001
    python benchmarks/bench_knn.py --n 100000 --k 21 100 1001

Prints seconds per method, the ratio to bare faiss (< 1: faster than faiss) and the peak RSS of the
process so far (monotone: it includes every earlier method).
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable
from functools import partial

import faiss
import torch

from torchmetrics_retrieval.functional.search import KNNBackend, knn


def clustered(n: int, dim: int, n_clusters: int, seed: int = 0) -> torch.Tensor:
    """L2-normalised points around random centres (cluster of each point drawn at random)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_clusters, dim, generator=g)
    labels = torch.randint(0, n_clusters, (n,), generator=g)
    x = centres[labels] + 0.6 * torch.randn(n, dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1).contiguous()


def bare_faiss(x: torch.Tensor, k: int) -> None:
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x.numpy())
    index.search(x.numpy(), k + 1)


def run_knn(x: torch.Tensor, k: int, backend: KNNBackend) -> None:
    knn(x, k=k, backend=backend)


def mm_topk(x: torch.Tensor, k: int, rows: int = 1024) -> None:
    """The naive baseline: squared distances by matmul per row chunk, then topk (no exactness guarantees)."""
    sq = (x * x).sum(dim=1)
    for start in range(0, x.shape[0], rows):
        q = x[start : start + rows]
        d = torch.addmm(sq[None, :], q, x.T, alpha=-2.0)
        torch.topk(d, k + 1, dim=1, largest=False)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def timed(fn: Callable[[torch.Tensor, int], object], x: torch.Tensor, k: int) -> float:
    start = time.perf_counter()
    fn(x, k)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 30_000], help="numbers of points")
    parser.add_argument("--k", type=int, nargs="+", default=[21, 100, 1001], help="neighbours per query")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--skip-mm", action="store_true", help="skip the mm + topk baseline")
    args = parser.parse_args()
    print(f"torch {torch.__version__} threads={torch.get_num_threads()}  faiss {faiss.__version__}")
    print(f"{'N':>7} {'K':>5} {'method':<14} {'seconds':>8} {'vs faiss':>8} {'peak RSS GiB':>12}")
    for n in args.n:
        x = clustered(n, args.dim, args.clusters)
        embeddings_gib = x.numel() * 4 / 2**30
        for k in args.k:
            methods: dict[str, Callable[[torch.Tensor, int], object]] = {
                "faiss (bare)": bare_faiss,
                "knn torch": partial(run_knn, backend="torch"),
                "knn faiss": partial(run_knn, backend="faiss"),
            }
            if not args.skip_mm:
                methods["mm + topk"] = mm_topk
            reference = None
            for name, fn in methods.items():
                seconds = timed(fn, x, k)
                reference = reference or seconds
                print(f"{n:>7} {k:>5} {name:<14} {seconds:>8.2f} {seconds / reference:>8.2f} {peak_rss_gib():>12.2f}")
        print(f"embeddings: {embeddings_gib:.3f} GiB")


if __name__ == "__main__":
    main()
