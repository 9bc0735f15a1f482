"""The float32 stage-1 keys of every (query, gallery item) pair, block by block: what the streaming passes over
all pairs read (the full-ranking count, the verification histograms).

One-sided blocks hold ``|g|^2 - 2<q,g>`` (L2) or ``-<q,g>`` (dot; cosine on unit rows), as the torch stage of
the kNN search. A set against itself (``Problem.symmetric``) takes symmetric blocks: ``|x_i - x_j|^2 / 2`` or
``-<x_i,x_j>``, only on and above the diagonal, each serving its rows and, transposed, its columns (half the
products). :class:`KeyForm` turns a key into the pair's float32 distance. A block's rows lie at an aligned stride
(``stream_topk.BlockMemory``): a block whose width is not a multiple of 16 is a strided view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._progress import advance
from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.functional._search.problem import Problem
from torchmetrics_retrieval.functional._search.stream_topk import addmm_keys
from torchmetrics_retrieval.functional._search.torch_stage import SymmetricKeys

__all__ = ["KeyBlock", "KeyForm", "key_blocks"]


class KeyBlock(NamedTuple):
    """Keys of the query rows ``rows`` (of the rows given to :func:`key_blocks`) against the gallery columns
    ``cols``, valid until the next block. ``mirrored``: a symmetric block off the diagonal, which also holds
    the keys of the pairs (column, row)."""

    rows: slice
    cols: slice
    keys: Tensor
    mirrored: bool


class KeyForm(NamedTuple):
    """A pair's float32 distance from its key: ``v = key * scale + offset[row]``, then (``mode``) as is (dot,
    cosine), clamped at 0 (squared L2) or clamped and square-rooted (L2)."""

    scale: float
    offsets: Tensor  # (R,) float32
    mode: int  # 0: v, 1: max(v, 0), 2: sqrt(max(v, 0))


def key_form(problem: Problem, rows: Tensor, symmetric: bool) -> KeyForm:
    """How the keys of :func:`key_blocks` map to distances."""
    mode = {"dot": 0, "cosine": 0, "sqeuclidean": 1, "euclidean": 2}[problem.distance]
    offsets = torch.zeros(rows.numel(), dtype=torch.float32, device=rows.device)
    if problem.distance == "cosine":
        offsets += 1.0
    elif mode and not symmetric:
        offsets = problem.query_sq64[rows].to(torch.float32)
    return KeyForm(2.0 if mode and symmetric else 1.0, offsets, mode)


def key_blocks(
    problem: Problem, rows: Tensor, chunk_size: int | None, symmetric: bool, first_rows_only: bool = False
) -> Iterator[KeyBlock]:
    """Blocks of stage-1 keys of the queries ``rows`` (``symmetric``: every query, the set against itself);
    ``first_rows_only``: only the blocks of the first tile of rows, against every column (a sample)."""
    gallery, gallery_sq = problem.stage_gallery_rows()  # half rows: made float32 per block, not copied
    n_rows, n_cols = rows.numel(), gallery.shape[0]
    keys: Callable[[slice, slice], Tensor]
    if symmetric:
        keys = SymmetricKeys(gallery, None if gallery_sq is None else gallery_sq / 2, aligned=True)
    else:
        bias = gallery_sq
        if bias is None:
            bias = torch.zeros(n_cols, dtype=torch.float32, device=gallery.device)
        alpha = -2.0 if gallery_sq is not None else -1.0
        keys = addmm_keys(problem.stage_query_rows(rows), gallery, bias, alpha, aligned=True)
    schedule = TileSchedule.of(n_rows, n_cols, chunk_size, symmetric)
    for rs, cs in schedule.tiles(first_rows_only):
        with ieee_float32_matmul():
            block = keys(rs, cs)
        mirrored = schedule.mirrored(rs, cs)
        yield KeyBlock(rs, cs, block, mirrored)
        advance((rs.stop - rs.start) * (cs.stop - cs.start) * (2 if mirrored else 1))  # ordered pairs done
