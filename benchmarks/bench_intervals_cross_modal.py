"""Cost of confidence intervals, and ``CrossModalRetrieval`` against bare faiss, at one thread and at all cores.

1. **Intervals.** ``retrieval_metrics`` with six ranking keys (cmc@1, cmc@5, precision@5, map@5, map@r,
   r-precision) on Q = N queries, with and without ``confidence_level=0.95, n_bootstrap=1000``: the ratio is the
   intervals' overhead. Data: seeded clustered embeddings (``_common.py``), D = 128, 20 samples per class.
2. **Cross-modal.** A images and B = 5 captions per image (noisy copies of their image), D = 512, unit rows:
   ``CrossModalRetrieval(cmc_top_k=(1, 5, 10))`` fed in batches, ``compute()`` (both directions) against one
   bare faiss inner-product search of the larger direction (every caption against the images, k = 10), and the
   peak RSS of ``compute()`` above the RSS of the fed metric (which holds the embeddings), and above the RSS
   before feeding it.

Every figure comes from one run, in this process (``--threads`` sets torch and faiss; default: one thread,
then every core). ``--json PATH`` writes the records with the machine, the command and the versions
(``_results.py``). Usage::

    python benchmarks/bench_intervals_cross_modal.py                                   # Q = 100k; 25k x 125k
    python benchmarks/bench_intervals_cross_modal.py --n 20000 --images 5000 --json r.json   # quicker
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import torch
from _common import clustered_embeddings, memory_mib, reset_peak_memory
from _results import run_info, write

from torchmetrics_retrieval import CrossModalRetrieval
from torchmetrics_retrieval.functional import retrieval_metrics

KEYS: dict[str, Any] = {"cmc_top_k": (1, 5), "precision_top_k": (5,), "map_top_k": (5,)}
KEYS |= {"map_at_r": True, "r_precision": True}


def seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def intervals(n: int) -> dict[str, Any]:
    x, labels = clustered_embeddings(n, "per_class20")
    plain = seconds(lambda: retrieval_metrics(x, labels, **KEYS))
    with_ci = seconds(lambda: retrieval_metrics(x, labels, **KEYS, confidence_level=0.95, n_bootstrap=1000))
    plain_again = seconds(lambda: retrieval_metrics(x, labels, **KEYS))
    base = (plain + plain_again) / 2
    print(f"  intervals  Q={n}: without {base:.2f} s, with 95% / 1000 resamples {with_ci:.2f} s: overhead "
          f"{100 * (with_ci / base - 1):+.1f}%")  # fmt: skip
    return {"benchmark": "intervals", "n": n, "seconds": base, "intervals_seconds": with_ci}


def image_caption_data(n_images: int, dim: int = 512) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(n_images, dim, generator=g), dim=1)
    caption_ids = torch.arange(n_images).repeat_interleave(5)
    captions = images[caption_ids] + 0.06 * torch.randn(caption_ids.numel(), dim, generator=g)
    return images, torch.arange(n_images), torch.nn.functional.normalize(captions, dim=1), caption_ids


def cross_modal(n_images: int) -> dict[str, Any]:
    images, image_ids, captions, caption_ids = image_caption_data(n_images)
    data_mib = (images.numel() + captions.numel()) * 4 / 2**20

    def bare_faiss() -> None:
        index = faiss.IndexFlatIP(images.shape[1])
        index.add(images.numpy())
        index.search(captions.numpy(), 10)

    def fed() -> CrossModalRetrieval:
        metric = CrossModalRetrieval(cmc_top_k=(1, 5, 10))
        for rows in torch.arange(n_images).split(4096):
            metric.update(embeddings_a=images[rows], ids_a=image_ids[rows])
        for rows in torch.arange(captions.shape[0]).split(4096):
            metric.update(embeddings_b=captions[rows], ids_b=caption_ids[rows])
        return metric

    faiss_s = seconds(bare_faiss)
    can_reset = reset_peak_memory()
    before_feeding, _ = memory_mib()
    start = time.perf_counter()
    metric = fed()
    fed_s = time.perf_counter() - start
    holding, _ = memory_mib()
    reset_peak_memory()
    compute_s = seconds(metric.compute)
    _, peak = memory_mib()
    ours_s = fed_s + compute_s
    peak_text = (
        f"compute() peaks {peak - holding:.0f} MiB above the metric holding the {data_mib:.0f} MiB of embeddings "
        f"({peak - before_feeding:.0f} MiB above the RSS before feeding it)"
        if can_reset
        else "n/a"
    )
    print(f"  cross-modal {n_images} x {captions.shape[0]} D=512: faiss (captions -> images, k=10) {faiss_s:.2f} s, "
          f"ours both directions (update + compute) {ours_s:.2f} s = {ours_s / faiss_s:.2f}x faiss;")  # fmt: skip
    print(f"    {peak_text}")
    sizes = {"images": n_images, "captions": captions.shape[0], "dim": images.shape[1], "data_mib": data_mib}
    memory = {"peak_mib": peak - holding, "peak_mib_before_feeding": peak - before_feeding} if can_reset else {}
    return {"benchmark": "cross_modal", **sizes, "faiss_seconds": faiss_s, "seconds": ours_s, **memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="queries of the interval benchmark")
    parser.add_argument("--images", type=int, default=25_000, help="images of the cross-modal benchmark")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--json", type=Path, default=None, help="write the records, the machine and the run here")
    args = parser.parse_args()
    info = run_info(args.threads)
    records: list[dict[str, Any]] = []
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {load}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(threads)
        print(f"{threads} thread(s):")
        records.append({"threads": threads, **intervals(args.n)})
        records.append({"threads": threads, **cross_modal(args.images)})
    if args.json is not None:
        write(args.json, info, records)


if __name__ == "__main__":
    main()
