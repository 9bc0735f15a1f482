"""The plan of a search: every tuning constant of the engine, the buffer sizes, and the choices made from them
(backend, compiled kernels or torch passes, one symmetric pass or a sweep).

Nothing here changes a result: each constant trades time or memory, and every path gives the same exact
answer. The measurements behind the values are in benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "bf16_candidates_per_query",
    "buffer_width",
    "candidates_per_query",
    "force_compiled",
    "lazy_float64",
    "part_of",
    "resolve_backend",
    "symmetric_buffer_fits",
    "symmetric_search_fits",
    "use_compiled",
]

# ---- blocks of the distance matrix (distance_blocks, the verification and full-ranking passes) -----------------
#: Memory budget of one block of the distance matrix (plus its mask and temporaries), in bytes.
BLOCK_BYTES = 128 * 2**20
#: Preferred number of gallery columns of a block (cache-friendly, large enough for a fast matmul).
BLOCK_COLUMNS = 4096

#: Blocks of float32 keys of the passes over all pairs (``key_blocks``): rows of a one-sided block (512 x 4096
#: keys stay in cache while a kernel counts them), and the side of a symmetric block (read by rows, then by
#: columns).
KEY_TILE_ROWS = 512
SYMMETRIC_KEY_TILE = 1024

# ---- stage 1: candidates by float32 keys ---------------------------------------------------------------------------
#: Row stride, in entries, of the key blocks of a search: a block whose width is not a multiple of it is written
#: into rows padded to one (a matrix product writes rows of an unaligned length far slower).
ALIGNED_COLUMNS = 16
#: Stage-1 candidates per query: ``K + min(MAX_MARGIN, max(MIN_MARGIN, K // MARGIN_DIVISOR))``. A thin margin
#: keeps stage 1 cheap; the rows it leaves without a certificate (0-0.15% of the queries on clustered data)
#: are searched again alone, with twice the candidates.
MIN_MARGIN = 2
MARGIN_DIVISOR = 32
MAX_MARGIN = 64
#: Rows and columns of a stage-1 block of the torch backend.
STAGE1_ROWS = 512
STAGE1_COLUMNS = 4096
#: Query chunks that meet each gallery block in turn when the gallery's rows are half precision, made float32 per
#: block (``half_rows``): the block is made once for all of them (a gallery block of float32 rows is a view).
HALF_QUERY_CHUNKS = 8
#: Width of the segments whose minima prune a block before any exact comparison (torch buffer).
SEGMENT = 32
#: A transposed scan gathers its passing column segments unless more than 1 in this many pass.
TRANSPOSE_SHARE = 8
#: The pre-pass that gives every query an initial threshold samples about ``SAMPLE_SCALE * (kp * G)^(1/3)``
#: gallery items: a larger sample costs more, a smaller one gives a looser threshold (more entries pass it,
#: each costing an append and a sort).
SAMPLE_SCALE = 6.0
#: An estimated first threshold is the sample rank ``m + SIGMAS * (sqrt(m) + 1)``, where ``m`` is the expected
#: number of sample keys below the true ``kp``-th key: a miss needs a deviation of over ``SIGMAS`` standard
#: deviations (under 1% of the queries on random data; they are searched again). A smaller margin lets more
#: entries pass the threshold, a larger one makes more queries miss.
SIGMAS = 2.5
#: Sample items per group when the sample is folded to its group minima (see ``sample_thresholds``).
FOLD = 4
#: Largest candidate buffer (bytes) of the one-pass symmetric search, which holds every query's candidates.
SYMMETRIC_BUFFER_BYTES = 768 * 2**20
#: The symmetric sweep (when that buffer does not fit): queries per group (each group's buffer is
#: ``GROUP_ROWS x 2 kp`` entries of 8 bytes), the byte budget of the spilled entries (8 bytes each, plus 12
#: bytes per entry of the group being scanned), and the spilled entries per query assumed when choosing the
#: window (the estimated thresholds let about 1.6 ``kp`` entries of a query pass).
GROUP_ROWS = 2048
SPILL_BYTES = 160 * 2**20
SPILL_PER_KP = 2.0
#: The faiss stage's first round takes a range search below estimated thresholds from this many candidates
#: per query and galleries of at least ``RANGE_GALLERY_PER_KP * kp`` items.
RANGE_MIN_KP = 64
RANGE_GALLERY_PER_KP = 16
#: Faiss GPU indexes cannot return more neighbours than this.
FAISS_GPU_MAX_K = 2048
#: Without compiled scans, ``auto`` takes the symmetric torch stage from this many samples and up to this many
#: candidates per query.
AUTO_TORCH_MIN_N = 60_000
AUTO_TORCH_MAX_KP = 48

# ---- stage 2 and the rounds ------------------------------------------------------------------------------------------
#: Margin on the worst-case float32 rounding bound of the stage-1 keys (see ``certify.key_tolerance``).
TOLERANCE_FACTOR = 1.5
#: Candidate pairs stage 1 returns at once in a round (bounds its memory; smaller groups slow faiss at large K).
ROUND_PAIRS = 2**21
#: Candidate pairs stage 2 ranks at once (up to about 180 bytes a pair: 45 MiB): smaller parts bound the memory
#: at no measurable cost (the benchmarks page has the figures).
RANK_PAIRS = 2**18
#: A set whose float64 copy would exceed this many bytes is read as float64 block by block (``keys.Float64Rows``):
#: the canonical stage then upcasts only the candidates' rows (same values; the copy would be 8 bytes an entry).
FLOAT64_COPY_BYTES = 256 * 2**20
#: Largest squared norm accepted (float32 keys must not overflow).
MAX_SQUARED_NORM = 1e36

# ---- the bfloat16 candidate pass (``low_precision``) ----------------------------------------------------------------
#: ``search_precision="auto"`` takes bfloat16 where a probe measures its products at least this many times faster
#: than float32. The faster products must pay for what the wider bound costs: more candidates per query (more
#: canonical distances in stage 2) and more queries searched again, the more of them the larger the set. The value
#: is a judgement from counts of those candidates and queries: no machine with bfloat16 units was at hand to time it.
BF16_MIN_SPEEDUP = 1.8
#: Stage-1 candidates per query of a bfloat16 pass: ``K + max(BF16_MIN_MARGIN, K // BF16_MARGIN_DIVISOR)``. The
#: bound is about ``2**16`` times wider than float32's, so a thin margin would leave most queries undecided.
BF16_MIN_MARGIN = 16
BF16_MARGIN_DIVISOR = 2
#: A bfloat16 search whose first round leaves more than this share of its queries undecided continues in float32
#: (the bound is too wide for the data: very low D, coarse quantised embeddings, masses of near ties).
BF16_FALLBACK_SHARE = 0.25
#: Float64 temporaries of rounding rows to bfloat16 (one block of rows at a time).
BF16_ROUND_BYTES = 8 * 2**20

# ---- compiled kernels -------------------------------------------------------------------------------------------
#: numba is a dependency, but every path works without it (torch passes); it is imported on first use only.
HAS_NUMBA = importlib.util.find_spec("numba") is not None
#: Smallest search (query x gallery pairs) that takes the compiled kernels: below it, loading them (numba's
#: import and its on-disk cache, or compiling them on a machine's first use) costs more than they save.
MIN_PAIRS = 2**26

_forced: bool | None = None
#: Pairs of the whole search that the searches in progress are parts of (``part_of``).
_whole_pairs = 0


def use_compiled(device: torch.device, n_query: int, n_gallery: int) -> bool:
    """Whether the compiled kernels serve a search of ``n_query`` x ``n_gallery`` on ``device``: the one place
    where that is decided (CPU only, numba present, large enough, positions stored as int32)."""
    if not (HAS_NUMBA and device.type == "cpu" and n_gallery < 2**31):
        return False
    return _forced if _forced is not None else max(n_query * n_gallery, _whole_pairs) >= MIN_PAIRS


@contextlib.contextmanager
def part_of(n_query: int, n_gallery: int) -> Iterator[None]:
    """The searches inside the block are parts of one search of ``n_query`` x ``n_gallery`` (a shard's share of a
    sharded search): the compiled kernels' size threshold applies to the whole, which loads them anyway.

    Example:
        >>> with part_of(10**5, 10**5):
        ...     use_compiled(torch.device("cpu"), 100, 100) == HAS_NUMBA
        True
    """
    global _whole_pairs
    saved, _whole_pairs = _whole_pairs, n_query * n_gallery
    try:
        yield
    finally:
        _whole_pairs = saved


@contextlib.contextmanager
def force_compiled(enabled: bool | None) -> Iterator[None]:
    """Take the compiled kernels for every CPU search of any size (True), never (False), or by size (None)
    inside the block: how the tests run both paths on small data.

    Example:
        >>> with force_compiled(False):
        ...     use_compiled(torch.device("cpu"), 10**6, 10**6)
        False
    """
    global _forced
    saved, _forced = _forced, enabled
    try:
        yield
    finally:
        _forced = saved


def candidates_per_query(k: int, n_gallery: int) -> int:
    """Stage-1 candidates per query for ``k`` neighbours: ``k`` plus the margin."""
    return min(n_gallery, k + min(MAX_MARGIN, max(MIN_MARGIN, k // MARGIN_DIVISOR)))


def bf16_candidates_per_query(k: int, n_gallery: int) -> int:
    """Stage-1 candidates per query of a bfloat16 pass for ``k`` neighbours (a wider margin: its bound is wider)."""
    return min(n_gallery, k + max(BF16_MIN_MARGIN, k // BF16_MARGIN_DIVISOR))


def lazy_float64(*sets: torch.Tensor) -> bool:
    """Whether the float64 rows of a search over ``sets`` are read on demand (their copy exceeds
    ``FLOAT64_COPY_BYTES``)."""
    return sum(x.numel() for x in sets) * 8 > FLOAT64_COPY_BYTES


def buffer_width(kp: int) -> int:
    """Slots per row of a candidate buffer: ``kp`` kept plus a slack >= ``kp`` (a dense append of <= kp fits
    after a compaction)."""
    return kp + max(2 * kp, 64)


def symmetric_buffer_fits(n: int, kp: int) -> bool:
    """Whether the one-pass symmetric search of ``n`` rows with ``kp`` candidates fits its buffer budget."""
    return n * buffer_width(kp) * 8 <= SYMMETRIC_BUFFER_BYTES


def symmetric_search_fits(n: int, k: int) -> bool:
    """Whether a set of ``n`` samples searched against itself for ``k`` neighbours takes the symmetric torch
    stage in one pass (its candidate buffer for every sample fits ``SYMMETRIC_BUFFER_BYTES``)."""
    return symmetric_buffer_fits(n, candidates_per_query(k, n))


def faiss_module() -> Any:
    """faiss, imported lazily (only the faiss stage needs it)."""
    try:
        import faiss
    except ImportError as error:  # pragma: no cover - faiss-cpu is a dependency
        raise ImportError("backend='faiss' needs faiss: `pip install faiss-cpu` (or faiss-gpu).") from error
    return faiss


def resolve_backend(
    backend: str,
    device: torch.device,
    n_query: int,
    n_gallery: int,
    kp: int,
    *,
    symmetric: bool,
    groups: bool,
    half: bool = False,
) -> str:
    """The stage that runs: ``"torch"``, ``"faiss"`` or ``"faiss-gpu"``.

    ``auto`` takes what was fastest in benchmarks/bench_knn.py (2 CPU cores, D = 128, clustered data): with
    compiled scans, the torch stage for a set searched against itself (each distance block computed once)
    and for large K against a gallery, faiss for small K against a gallery; without them, torch only for
    large leave-one-out searches with few candidates. Search groups (which faiss cannot restrict a search
    to) and tensors off the CPU take the torch stage, with a warning when faiss was asked for.

    ``half``: the rows are stored in float16 or bfloat16. ``auto`` then takes the torch stage, which makes its
    float32 rows block by block (``half_rows``): faiss searches a float32 index, a float32 copy of the gallery
    (twice the stored set, and its ``[2g, -|g|^2, 1]`` rows once more while it is built). Feeding faiss one
    gallery block at a time would avoid the copy but search every query against each block and merge the lists;
    a short measurement (10k x 190k, D = 128, K = 19, float16 storage, two threads) found the torch stage no
    slower than faiss on such rows, so the torch stage serves them. ``backend="faiss"`` still takes faiss.
    """
    if backend == "auto":
        if device.type != "cpu" or groups or half:
            return "torch"
        if use_compiled(device, n_query, n_gallery):
            return "torch" if symmetric or kp >= RANGE_MIN_KP else "faiss"
        large_symmetric = symmetric and n_query >= AUTO_TORCH_MIN_N and kp <= AUTO_TORCH_MAX_KP
        return "torch" if large_symmetric else "faiss"
    if backend == "torch":
        return "torch"
    if groups:
        warnings.warn(
            "backend='faiss' cannot restrict a search to search groups: using the torch backend.", stacklevel=4
        )
        return "torch"
    if device.type != "cpu":
        if not (faiss_module().get_num_gpus() > 0 and kp <= FAISS_GPU_MAX_K):
            warnings.warn(
                f"backend='faiss' on {device} needs faiss-gpu and at most {FAISS_GPU_MAX_K} candidates: "
                "using the torch backend.",
                stacklevel=4,
            )
            return "torch"
        return "faiss-gpu"
    return "faiss"
