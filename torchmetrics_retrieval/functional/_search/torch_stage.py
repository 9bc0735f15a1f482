"""Stage 1 on the tensors' device: blocked matrix products of float32 keys and a streaming threshold selection
(``stream_topk``), scanned by compiled code on the CPU for large searches."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import low_precision, plan
from torchmetrics_retrieval.functional._search.certify import cap_keys
from torchmetrics_retrieval.functional._search.half_rows import BlockRows, StageRows, rows_at
from torchmetrics_retrieval.functional._search.keys import Float64Rows
from torchmetrics_retrieval.functional._search.problem import Candidates, Problem, rounding_terms
from torchmetrics_retrieval.functional._search.stream_topk import BlockMemory, stream_topk, stream_topk_symmetric
from torchmetrics_retrieval.functional._search.symmetric_sweep import SymmetricSweep
from torchmetrics_retrieval.functional._search.types import consecutive_start

__all__ = ["SymmetricKeys", "TorchStage", "symmetric_left_rows", "symmetric_right_rows"]


def symmetric_right_rows(x: Tensor, half_sq: Tensor | None) -> Tensor:
    """The right operand of :class:`SymmetricKeys`' product for the rows ``x``: ``[x, h, 1]`` (``h = |x|^2 / 2``),
    or a contiguous copy of ``x`` without ``half_sq`` (dot, cosine). A block's key is
    ``symmetric_left_rows(r) @ c.T`` of two of them, ``r`` its rows and ``c`` its columns."""
    if half_sq is None:
        return x.contiguous()
    return torch.cat([x, half_sq[:, None], torch.ones_like(x[:, :1])], dim=1)


def symmetric_left_rows(right: Tensor, dim: int) -> Tensor:
    """The left operand from rows made by :func:`symmetric_right_rows` (``dim``: the embeddings' dimension):
    ``[-x, 1, h]`` from ``[x, h, 1]``, or ``-x``."""
    if right.shape[1] == dim:
        return -right
    return torch.cat([-right[:, :dim], right[:, [dim + 1, dim]]], dim=1)


class SymmetricKeys:
    """Symmetric keys of a set against itself from one ``(N, D + 2)`` copy of its rows ``[x, h, 1]``: half the
    squared L2 distance ``h_i + h_j - <x_i, x_j> = <[-x_i, 1, h_i], [x_j, h_j, 1]>`` (``h = |x|^2 / 2``; the
    left rows are made for one row block at a time), or ``-<x_i, x_j>`` (dot, cosine, from ``x`` alone).
    Each block is valid until the next (:class:`BlockMemory`).

    Rows stored in half precision (:class:`~.half_rows.BlockRows`) are not copied: the right rows ``[x, h, 1]``
    of a block are made for that block, in one buffer, with the values of the copy.

    The product sums ``D + 2`` terms of total size ``(|x_i| + |x_j|)^2 / 2``, as in ``certify.key_tolerance``'s
    symmetric case; the keys of (i, j) and (j, i) may differ by rounding, each within that bound.
    """

    def __init__(self, x: StageRows, half_sq: Tensor | None, aligned: bool = False) -> None:
        self.dim = x.shape[1]
        self.half_sq = half_sq
        self.source = x if isinstance(x, BlockRows) else None
        self.rows: Tensor | None = None
        if isinstance(x, Tensor):
            self.rows = x if half_sq is None else symmetric_right_rows(x, half_sq)
        self.memory = BlockMemory(aligned)  # (``aligned``: the blocks of a search, see ``BlockMemory``)
        self.wide = BlockMemory()  # the right rows ``[x, h, 1]`` of a block made from half rows
        self.left: tuple[slice | None, Tensor | None] = (None, None)  # the left rows of the last row block

    @property
    def x(self) -> StageRows:
        """The rows ``x`` (a view, or the half rows made per block)."""
        if self.source is not None:
            return self.source
        assert self.rows is not None
        return self.rows[:, : self.dim]

    def _right_rows(self, cols: slice | Tensor) -> Tensor:
        if self.rows is not None:
            return self.rows[cols]
        assert self.source is not None
        if self.half_sq is None:
            return self.source[cols]
        count = len(range(*cols.indices(self.source.shape[0]))) if isinstance(cols, slice) else cols.numel()
        right = self.wide(count, self.dim + 2, self.half_sq)
        self.source.write(cols, right[:, : self.dim])
        right[:, self.dim] = self.half_sq[cols]
        right[:, self.dim + 1] = 1.0
        return right

    def _left_rows(self, rows: slice) -> Tensor:
        cached_rows, left = self.left
        if left is None or cached_rows != rows:
            left = symmetric_left_rows(self._right_rows(rows), self.dim)
            self.left = (rows, left)
        return left

    def __call__(self, rows: slice, cols: slice | Tensor) -> Tensor:
        left, right = self._left_rows(rows), self._right_rows(cols)
        return torch.mm(left, right.T, out=self.memory(left.shape[0], right.shape[0], left))


class TorchStage:
    """Stage 1 on the tensors' device: blocked ``addmm`` keys and a streaming threshold selection.

    A set searched against itself (``gallery=None``) takes the symmetric path for the first round: every
    distance block serves its row queries and, transposed, its column queries (half the matrix products),
    in one pass when every query's candidates fit in memory and group by group (:class:`SymmetricSweep`)
    when they do not. A bipartite problem (``Problem.split``) computes only the rectangle between its two
    sets in that pass (not swept: when its buffer does not fit, its rows are searched one-sided). Later rounds
    (a few uncertified queries, more candidates) search their rows against the whole gallery.

    With ``precision="bfloat16"`` the rows are rounded to bfloat16 block by block (no float32 copy of the set) and
    the keys come from bfloat16 products (``low_precision``); the candidates carry the wider bound.
    :meth:`fall_back` turns the stage to float32 for the rest of the search.
    """

    def __init__(self, problem: Problem, chunk_size: int | None, precision: str = "float32") -> None:
        self.problem, self.chunk_size, self.precision = problem, chunk_size, precision
        self.low: low_precision.BFloat16Rows | None = None
        gallery: StageRows
        if precision == "bfloat16":
            self.low = low_precision.round_rows(problem.gallery64, problem.gallery_sq64, problem.distance)
            gallery = self.low.rows
            l2 = problem.distance in ("euclidean", "sqeuclidean")
            gallery_sq = problem.gallery_sq64.to(torch.float32) if l2 else None
        else:
            gallery, gallery_sq = problem.stage_gallery_rows()
        zeros = torch.zeros(gallery.shape[0], dtype=torch.float32, device=gallery.device)
        self.bias = gallery_sq if gallery_sq is not None else zeros
        self.alpha = -2.0 if gallery_sq is not None else -1.0
        self.rows = min(plan.STAGE1_ROWS, chunk_size or plan.STAGE1_ROWS)
        self.cols = max(1, min(plan.STAGE1_COLUMNS, chunk_size or plan.STAGE1_COLUMNS, gallery.shape[0]))
        self.symmetric = problem.symmetric
        self.symmetric_keys: SymmetricKeys | low_precision.BFloat16SymmetricKeys
        if self.symmetric:  # one copy of the rows serves the symmetric keys and, as a view, the other rounds
            half = None if gallery_sq is None else gallery_sq / 2
            if self.low is not None:
                assert isinstance(gallery, Tensor)
                self.symmetric_keys = low_precision.BFloat16SymmetricKeys(gallery, half)
            else:
                self.symmetric_keys = SymmetricKeys(gallery, half, aligned=True)
            gallery = self.symmetric_keys.x
        self.gallery = gallery
        self._all_rows: Candidates | None = None
        self._sweep: SymmetricSweep | None = None

    def __call__(self, rows: Tensor, kp: int, first_round: bool) -> Candidates:
        """Candidates of ``rows``; the first round starts from estimated thresholds (cheaper, may fall short)."""
        n_query, bipartite = self.problem.query.shape[0], self.problem.split is not None
        if first_round and self.symmetric and plan.symmetric_buffer_fits(n_query, kp):
            if self._all_rows is None:
                self._all_rows = self._search_symmetric(kp)
            return self._all_rows.take(rows)
        if first_round and self.symmetric and not bipartite and plan.use_compiled(rows.device, n_query, n_query):
            found = self._sweep_take(rows, kp)
            if found is not None:
                return found
        return self._search(rows, kp, estimate=first_round)

    def fall_back(self) -> None:
        """Continue in float32: the bfloat16 bound left too many queries undecided (``plan.BF16_FALLBACK_SHARE``)."""
        self.__init__(self.problem, self.chunk_size, "float32")  # type: ignore[misc]

    def _candidates(self, found: tuple[Tensor, Tensor, Tensor], low: tuple[Tensor, Tensor] | None) -> Candidates:
        """Candidates of found keys; ``low``: the bfloat16 rounding errors and rounded norms of their queries."""
        keys, positions, floor = found
        extra = None
        if low is not None and self.low is not None:
            extra = low_precision.extra_tolerance(*low, self.low, self.problem.distance)
        rounding = rounding_terms(self.gallery.shape[1])
        return Candidates(positions, keys < float("inf"), floor, keys, rounding, extra)

    def _own_rounding(self, rows: Tensor | slice) -> tuple[Tensor, Tensor] | None:
        """The bfloat16 rounding errors and rounded norms of the set's own rows (None: float32)."""
        return None if self.low is None else (self.low.error[rows], self.low.rounded_norm[rows])

    def _from_symmetric(self, found: tuple[Tensor, Tensor, Tensor], rows: Tensor | slice) -> Candidates:
        """Candidates from symmetric keys, which for L2 become ``|g|^2 - 2<q, g> = 2 * key - |q|^2``."""
        keys, positions, floor = found
        if self.alpha == -2.0:
            floor = 2.0 * floor - self.bias[rows]
            keys = 2.0 * keys - self.bias[rows, None]
        return self._candidates((keys, positions, floor), self._own_rounding(rows))

    def _symmetric_mask(self) -> Callable[[Tensor, slice, slice | Tensor], object]:
        """The exclusions of a symmetric pass's blocks. A block of a bipartite pass's rectangle pairs the two
        sides only: the side rule, which would compare every pair of the block, has nothing to mask there."""
        exclusions, split = self.problem.exclusions, self.problem.split
        everything = functools.partial(exclusions.fill_excluded_, value=float("inf"))
        if split is None:
            return everything
        across = functools.partial(exclusions._replace(sides=None).fill_excluded_, value=float("inf"))

        def mask(keys: Tensor, rows: slice, cols: slice | Tensor) -> object:
            inside = isinstance(cols, slice) and rows.stop <= split <= cols.start
            return (across if inside else everything)(keys, rows, cols)

        return mask

    def _ceiling(self, rows: Tensor | slice, symmetric: bool) -> Tensor | None:
        """Float32 first thresholds from the problem's caps (None: no caps), as one-sided or symmetric keys."""
        if self.problem.caps is None:
            return None
        rounding = rounding_terms(self.gallery.shape[1])
        keys = cap_keys(self.problem, rows, rounding)
        if symmetric and self.alpha == -2.0:  # the symmetric L2 key is (one-sided key + |q|^2) / 2
            keys = (keys + self.problem.query_sq64[rows]) / 2.0
        keys32 = keys.to(torch.float32)  # rounded up, never below the float64 value
        return torch.where(keys32.double() < keys, torch.nextafter(keys32, keys32.new_tensor(float("inf"))), keys32)

    def _search_symmetric(self, kp: int) -> Candidates:
        mask = self._symmetric_mask()
        n = self.gallery.shape[0]
        found = stream_topk_symmetric(
            self.symmetric_keys,
            n,
            kp,
            mask,
            rows_per_chunk=self.rows,
            cols_per_block=self.cols,
            estimate=True,
            split=self.problem.split,
            ceiling=self._ceiling(slice(None), symmetric=True),
        )
        return self._from_symmetric(found, slice(None))

    def _sweep_take(self, rows: Tensor, kp: int) -> Candidates | None:
        """The candidates of consecutive ``rows`` from the symmetric sweep (None: not the sweep's next rows)."""
        start = consecutive_start(rows)
        if start is None:
            return None
        if self._sweep is None:
            mask = functools.partial(self.problem.exclusions.fill_excluded_, value=float("inf"))
            n = self.gallery.shape[0]
            self._sweep = SymmetricSweep(
                self.symmetric_keys, n, kp, mask, rows_per_chunk=self.rows, cols_per_block=self.cols
            )
        found = self._sweep.take(start, start + rows.numel())
        return None if found is None else self._from_symmetric(found, rows)

    def _search(self, rows: Tensor, kp: int, estimate: bool) -> Candidates:
        problem = self.problem
        low = self._own_rounding(rows) if self.symmetric else None
        query: StageRows
        if self.symmetric:
            query = rows_at(self.gallery, rows)
        elif self.low is not None:
            query64 = problem.query64  # rows read on demand: rounded per block, no float64 copy of the group
            taken = Float64Rows(query64.x[rows]) if isinstance(query64, Float64Rows) else query64[rows]
            rounded = low_precision.round_rows(taken, problem.query_sq64[rows], problem.distance)
            query, low = rounded.rows, (rounded.error, rounded.rounded_norm)
        else:
            query = problem.stage_query_rows(rows)
        key_fn = None
        if self.low is not None:
            assert isinstance(query, Tensor) and isinstance(self.gallery, Tensor)
            key_fn = low_precision.BFloat16Keys(query, self.gallery, self.bias, self.alpha)
        mask = functools.partial(problem.exclusions.take(rows).fill_excluded_, value=float("inf"))
        found = stream_topk(
            query,
            self.gallery,
            self.bias,
            self.alpha,
            kp,
            mask,
            rows_per_chunk=self.rows,
            cols_per_block=self.cols,
            estimate=estimate,
            # the whole search decides, not this group of its queries (a last, smaller group included)
            compiled=plan.use_compiled(rows.device, problem.query.shape[0], self.gallery.shape[0]),
            ceiling=self._ceiling(rows, symmetric=False),
            key_fn=key_fn,
        )
        return self._candidates(found, low)
