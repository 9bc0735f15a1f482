"""Stage rows of a set stored in half precision, made block by block: stage 1 without a float32 copy of the set.

A float16 or bfloat16 set is read as float64 on demand (``make_problem`` wraps it in :class:`~.keys.Float64Rows`
whatever ``lazy64`` says, so the canonical stage upcasts only the candidates' rows). Stage 1 multiplies float32
rows: :class:`BlockRows` makes them one block at a time (the rows of one product), into a buffer it reuses, just
before the product. A row's float32 stage value (``keys.stage_rows``) depends on that row alone: the exact
float32 value of each half entry, or for cosine the float32 rounding of its float64 quotient by the row's
canonical norm. So every block holds, bit for bit, the rows of the whole copy that ``keys.stage_rows`` would make.

The price is converting a gallery block again for every group of query rows it meets: one pass over ``D``
entries per row against the ``2 * D * rows`` operations of the products it feeds. A one-sided search makes each
gallery block once for ``plan.HALF_QUERY_CHUNKS`` chunks of queries (``stream_topk``); the symmetric pass and sweep
make each column block once per chunk of rows (their column blocks start after each chunk's rows, so consecutive
chunks do not share them). For cosine a conversion also divides every entry by its row's norm in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._search.keys import Float64Rows, Rows64

__all__ = ["HALF_DTYPES", "BlockRows", "StageRows", "half_rows", "rows_at", "values_dtype"]

#: Storage dtypes whose stage rows are made block by block.
HALF_DTYPES = (torch.float16, torch.bfloat16)


def values_dtype(x: Tensor) -> torch.dtype:
    """The dtype of the distances the metrics compare for rows ``x``: float32 for half-precision rows (distances
    rounded to float16 would tie pairs that float32 tells apart), else the rows' own dtype. So the metrics of a set
    held in half precision are those of the same rows in float32, without a float32 copy of them."""
    return torch.float32 if x.dtype in HALF_DTYPES else x.dtype


def half_rows(x64: Rows64) -> bool:
    """Whether stage 1 reads ``x64`` block by block: half-precision rows read on demand."""
    return isinstance(x64, Float64Rows) and x64.x.dtype in HALF_DTYPES


class BlockRows:
    """The float32 stage rows of the half-precision rows ``x64`` (or of its rows ``index``), made per block.

    ``rows[index]`` (a slice, or positions as a long tensor) gives the float32 rows in a buffer that the next
    call reuses (copy what must outlive it); a slice within the slice asked for last is a view of it, converted
    once (ask for a group of rows first, then for its chunks).
    :meth:`write` writes them into a given tensor (for instance the columns of a wider block). :meth:`take`
    gives the stage rows of a subset, still made per block.
    """

    def __init__(
        self, x64: Float64Rows, sq64: Tensor, distance: str, compiled: bool, index: Tensor | None = None
    ) -> None:
        self.x64, self.sq64, self.distance, self.compiled, self.index = x64, sq64, distance, compiled, index
        # cosine rows are divided by their canonical norms (float64, one per row of the set: not a copy of rows)
        self.norms = ieee_sqrt(sq64) if distance == "cosine" else None
        self.buffer: Tensor | None = None
        self.cached: tuple[int, int, int] | None = None  # the slice the buffer holds

    @property
    def shape(self) -> torch.Size:
        n = self.x64.shape[0] if self.index is None else self.index.numel()
        return torch.Size((n, self.x64.shape[1]))

    @property
    def device(self) -> torch.device:
        return self.x64.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def take(self, rows: Tensor) -> BlockRows:
        """The stage rows of the rows ``rows`` (positions in these rows), made per block as well."""
        index = rows if self.index is None else self.index[rows]
        taken = BlockRows.__new__(BlockRows)
        taken.x64, taken.sq64, taken.distance, taken.compiled = self.x64, self.sq64, self.distance, self.compiled
        taken.index, taken.norms, taken.buffer, taken.cached = index, self.norms, None, None
        return taken

    def _count(self, index: slice | Tensor) -> int:
        if isinstance(index, slice):
            return len(range(*index.indices(self.shape[0])))
        return index.numel()

    def __getitem__(self, index: slice | Tensor) -> Tensor:
        n, dim = self._count(index), self.shape[1]
        key = index.indices(self.shape[0]) if isinstance(index, slice) else None
        held = self.cached
        if key is not None and held is not None and key[2] == held[2] == 1 and held[0] <= key[0] <= key[1] <= held[1]:
            start = key[0] - held[0]  # rows of the slice the buffer holds: a view, nothing converted
            return self.buffer[start * dim : (start + n) * dim].view(n, dim)  # type: ignore[index]
        if self.buffer is None or self.buffer.numel() < n * dim:
            self.buffer, self.cached = torch.empty(n * dim, dtype=torch.float32, device=self.device), None
        block = self.buffer[: n * dim].view(n, dim)
        if key is None or key != self.cached:
            self.cached = None  # (the write below replaces what the buffer held)
            self.write(index, block)
            self.cached = key
        return block

    def write(self, index: slice | Tensor, out: Tensor) -> Tensor:
        """Write the float32 stage rows ``index`` into ``out`` (``(n, D)`` float32; contiguous for cosine)."""
        at = index if self.index is None else self.index[index]
        out.copy_(self.x64.x[at])  # exact: every float16 and bfloat16 value is a float32
        if self.norms is None:
            return out
        norms = self.norms[at]
        if self.compiled and out.device.type == "cpu" and out.is_contiguous():
            from torchmetrics_retrieval.functional._search.compiled import row_kernels
            from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

            # in place: the kernel reads each entry (float64 of its float32, that is of its half value) before
            # writing its quotient, as ``keys.stage_rows`` reads the half rows
            values = out.numpy()
            row_kernels.unit_rows(values, norms.contiguous().numpy(), values, kernel_threads())
            return out
        return out.copy_(out.to(torch.float64) / norms[:, None])  # rounded to float32 as ``stage_rows`` rounds


#: Stage rows: a float32 tensor, or half-precision rows made per block.
StageRows = Tensor | BlockRows


def rows_at(rows: StageRows, index: Tensor) -> StageRows:
    """The stage rows ``index`` of ``rows``: a float32 tensor's rows, or half rows still made per block."""
    return rows.take(index) if isinstance(rows, BlockRows) else rows[index]
