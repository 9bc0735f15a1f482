"""The bfloat16 candidate pass of stage 1: rows rounded to bfloat16, products accumulated in float32, and a
rigorous bound on what that rounding can change, so that the canonical stage 2 still proves every answer exact.

The pass changes only the *keys* stage 1 ranks by; the candidates it returns carry a wider tolerance
(:func:`extra_tolerance`), which the certificate (``certify.rank``) adds to the float32 one. Values never
depend on it: a query is reported only once its answer is proven equal to the canonical float64 one.

The bound. Let ``x`` be a float32 stage row (``keys.stage_rows``: within one float32 rounding of its exact
value, which the float32 bound already covers) and ``x^`` its rounding to bfloat16 (8 significant bits,
unit roundoff ``v = 2**-8``), with the exact error norm ``e_x = |x - x^|`` (computed in float64 from values
that float64 holds exactly). For a query ``q`` and an item ``g``::

    <q, g> - <q^, g^> = <q - q^, g> + <q^, g - g^>       so   |<q, g> - <q^, g^>| <= e_q |g| + |q^| e_g

The product of two bfloat16 numbers is exact in float32 (16 significant bits <= 24), so the float32 sum of the
``D`` products errs by at most ``D u |q^| |g^|`` (``u = 2**-24``), the float32 accumulation term of the float32
bound with ``|q^| |g^| <= (1 + 2**-6) |q| |g|``. A CPU product of bfloat16 tensors returns bfloat16: its
result is rounded once more, by at most ``v (1 + 2**-6) |q^| |g^|``. With ``alpha`` the key's factor of the
product (2 for L2 keys ``|g|^2 - 2<q, g>``, 1 for dot and cosine), a key's error is at most::

    (1 + 2**-6) * float32 bound  +  margin * |alpha| * (e_q max|g| + |q^| max e_g + v (1 + 2**-6) |q^| max|g^|)

(maxima over the gallery, since a query's floor must bound every item it did not take; ``margin`` is
``plan.TOLERANCE_FACTOR``, which also covers the float64 rounding of the norms). A row's error is typically
``0.3 v |x|``, so the bound is about ``1.5 v`` relative to ``|q| |g|``: far wider than float32's ``D u``,
hence more candidates per query (``plan.BF16_MARGIN``) and a fallback to float32 when too few queries are
decided (``plan.BF16_FALLBACK_SHARE``: very low D, coarse quantised embeddings, masses of near ties).

Where bfloat16 pays: CPUs with AMX or AVX512-BF16 and GPUs with bfloat16 tensor cores run these products
several times faster than float32; elsewhere (this project's 2-core EPYC test machine, 5.6x *slower*) the
products are emulated, and ``"auto"`` keeps float32 (:func:`resolve`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.keys import Rows64, stage_rows

__all__ = [
    "SEARCH_PRECISIONS",
    "BFloat16Keys",
    "BFloat16Rows",
    "BFloat16SymmetricKeys",
    "SearchPrecision",
    "auto_precision",
    "bf16_products",
    "counters",
    "extra_tolerance",
    "resolve",
    "round_rows",
]

SearchPrecision = Literal["auto", "float32", "bfloat16"]
SEARCH_PRECISIONS: tuple[str, ...] = ("auto", "float32", "bfloat16")

#: Unit roundoff of bfloat16 (8 significant bits): the relative error of one rounding.
BF16_UNIT = 2.0**-8
#: Bounds ``(1 + 2**-8)^2 (1 + 2**-24)^2``: norms of rounded rows against exact ones, and the like.
_GROWTH = 1.0 + 2.0**-6
#: CPU flags of bfloat16 units (``/proc/cpuinfo``).
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})

#: What the bfloat16 searches of this process did: how many started, how many fell back to float32, and the
#: queries of their first rounds with those the bound left undecided (searched again with more candidates); the
#: same counts of the float32 searches (``float32_...``), for comparison.
counters = {
    "bfloat16_searches": 0,
    "fallbacks": 0,
    "first_round_queries": 0,
    "first_round_undecided": 0,
    "float32_first_round_queries": 0,
    "float32_first_round_undecided": 0,
}


class BFloat16Rows(NamedTuple):
    """Rows rounded to bfloat16, with what the bound needs of each row (float64)."""

    rows: Tensor  # (N, D) bfloat16
    error: Tensor  # (N,) |x - x^|, x the float32 stage row
    norm: Tensor  # (N,) |x|
    rounded_norm: Tensor  # (N,) |x^|


def round_rows(x64: Rows64, sq64: Tensor, distance: str) -> BFloat16Rows:
    """The stage rows of ``x64`` rounded to bfloat16, block by block: no float32 copy of the whole set is made
    (a set stored in half precision is read as it is, ``keys.Float64Rows``)."""
    n, dim = x64.shape
    rows = torch.empty((n, dim), dtype=torch.bfloat16, device=x64.device)
    error, norm, rounded = (torch.empty(n, dtype=torch.float64, device=x64.device) for _ in range(3))
    step = max(1, plan.BF16_ROUND_BYTES // (8 * max(1, dim)))
    for start in range(0, n, step):
        block = slice(start, start + step)
        x32 = stage_rows(x64[block], sq64[block], distance)[0]
        rows[block] = x32.to(torch.bfloat16)
        x = x32.to(torch.float64)
        back = rows[block].to(torch.float64)  # every bfloat16 and float32 value is a float64: exact differences
        error[block] = torch.linalg.vector_norm(x - back, dim=1)
        norm[block] = torch.linalg.vector_norm(x, dim=1)
        rounded[block] = torch.linalg.vector_norm(back, dim=1)
    return BFloat16Rows(rows, error, norm, rounded)


def extra_tolerance(error: Tensor, rounded_norm: Tensor, gallery: BFloat16Rows, distance: str) -> Tensor:
    """``(R,)`` float64: what the bfloat16 rounding adds to the float32 bound of every key of the queries whose rows
    have rounding errors ``error`` and rounded norms ``rounded_norm`` (see the module's docstring); the certificate
    takes ``(1 + 2**-6) * float32 bound + this``."""
    alpha = 2.0 if distance in ("euclidean", "sqeuclidean") else 1.0
    if gallery.norm.numel() == 0:
        return torch.zeros_like(error)
    largest, largest_error, largest_rounded = gallery.norm.max(), gallery.error.max(), gallery.rounded_norm.max()
    terms = error * largest + rounded_norm * (largest_error + BF16_UNIT * _GROWTH * largest_rounded)
    return plan.TOLERANCE_FACTOR * alpha * terms


def bf16_products(left: Tensor, right: Tensor, out: Tensor | None = None) -> Tensor:
    """``left @ right.T`` of bfloat16 rows in float32 (``out``: a float32 buffer of the block's shape).

    Torch accumulates bfloat16 products in float32 on the CPU (oneDNN) and returns them rounded to bfloat16:
    that rounding is in the bound. Only the accumulation's precision matters, and :func:`float32_accumulation`
    keeps cuBLAS from reducing in bfloat16.
    """
    product = torch.mm(left, right.T)
    if out is None:
        return product.to(torch.float32)
    return out.copy_(product)


@contextlib.contextmanager
def float32_accumulation() -> Iterator[None]:
    """bfloat16 products accumulated in float32 inside the block (cuBLAS may otherwise reduce in bfloat16)."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = saved


class BFloat16Keys:
    """One-sided keys ``bias[g] + alpha * <q^, g^>`` of bfloat16 rows in float32, as ``stream_topk.addmm_keys``
    (``alpha * product`` is exact, a power of two; the sum is rounded once, as in ``addmm``)."""

    def __init__(self, query: Tensor, gallery: Tensor, bias: Tensor, alpha: float) -> None:
        self.query, self.gallery, self.bias, self.alpha = query, gallery, bias, alpha
        self.memory: Tensor | None = None

    def _block(self, n_rows: int, n_cols: int) -> Tensor:
        if self.memory is None or self.memory.numel() < n_rows * n_cols:
            self.memory = torch.empty(n_rows * n_cols, dtype=torch.float32, device=self.bias.device)
        return self.memory[: n_rows * n_cols].view(n_rows, n_cols)

    def __call__(self, rows: slice, cols: slice | Tensor) -> Tensor:
        left, right = self.query[rows], self.gallery[cols]
        out = bf16_products(left, right, self._block(left.shape[0], right.shape[0]))
        return out.mul_(self.alpha).add_(self.bias[None, cols])


class BFloat16SymmetricKeys(BFloat16Keys):
    """Symmetric keys of a set against itself from its bfloat16 rows, as ``torch_stage.SymmetricKeys``: half the
    squared L2 distance ``h_i + h_j - <x^_i, x^_j>`` (``h = |x|^2 / 2`` in float32, added after the product: a
    bfloat16 column of norms would round them), or ``-<x^_i, x^_j>`` (dot, cosine)."""

    def __init__(self, x: Tensor, half_sq: Tensor | None) -> None:
        zeros = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        super().__init__(x, x, zeros, -1.0)
        self.half_sq = half_sq

    @property
    def x(self) -> Tensor:
        """The bfloat16 rows."""
        return self.query

    def __call__(self, rows: slice, cols: slice | Tensor) -> Tensor:
        left, right = self.query[rows], self.query[cols]
        out = bf16_products(left, right, self._block(left.shape[0], right.shape[0])).neg_()
        if self.half_sq is not None:
            out.add_(self.half_sq[rows, None]).add_(self.half_sq[None, cols])
        return out


def cpu_flags() -> frozenset[str]:
    """The flags of the first CPU in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def probe_speedup(device: torch.device) -> float:
    """How many times faster a stage-1 block of bfloat16 products runs than the float32 one on ``device``
    (the best of a few runs of each; about 10 ms on a CPU with bfloat16 units)."""
    rows, cols, dim = plan.STAGE1_ROWS, plan.STAGE1_COLUMNS // 2, 128
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(rows, dim, generator=generator).to(device)
    right = torch.randn(cols, dim, generator=generator).to(device)

    def best(a: Tensor, b: Tensor) -> float:
        times = []
        for _ in range(4):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b.T)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return min(times[1:])  # the first run pays for warming up

    return best(left, right) / max(best(left.bfloat16(), right.bfloat16()), 1e-9)


def auto_precision(device: torch.device, flags: frozenset[str] | None = None, speedup: float | None = None) -> str:
    """What ``search_precision="auto"`` chooses on ``device``: ``"bfloat16"`` where bfloat16 products are
    measured at least ``plan.BF16_MIN_SPEEDUP`` times faster than float32, ``"float32"`` elsewhere.

    A CPU is probed only when its flags (``flags``, default ``/proc/cpuinfo``) show bfloat16 units (AMX or
    AVX512-BF16): without them torch emulates bfloat16, several times slower. CUDA devices of compute
    capability 8.0 and later (bfloat16 tensor cores) are probed too. ``speedup`` replaces the probe (tests).

    Example:
        >>> auto_precision(torch.device("cpu"), flags=frozenset({"avx2"}))
        'float32'
        >>> auto_precision(torch.device("cpu"), flags=frozenset({"amx_bf16"}), speedup=2.5)
        'bfloat16'
    """
    if device.type == "cpu":
        if not (BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags)):
            return "float32"
    elif device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 0):
        return "float32"
    measured = _cached_speedup(str(device)) if speedup is None else speedup
    return "bfloat16" if measured >= plan.BF16_MIN_SPEEDUP else "float32"


@functools.cache
def _cached_speedup(device: str) -> float:
    """:func:`probe_speedup`, once per process and device."""
    return probe_speedup(torch.device(device))


def resolve(precision: str, device: torch.device) -> str:
    """``"float32"`` or ``"bfloat16"``: the precision of stage 1's products for ``search_precision``."""
    return auto_precision(device) if precision == "auto" else precision
