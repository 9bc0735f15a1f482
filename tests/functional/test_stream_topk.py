"""The block scans of the torch stage-1 selection against a plain mask, for every branch they take."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._stream_topk import SEGMENT, _below_by_column, _below_by_row


def expected_by_row(keys: torch.Tensor, tau: torch.Tensor) -> tuple[list[int], list[int], list[float]]:
    r, c = torch.nonzero(keys < tau[:, None], as_tuple=True)  # row-major: sorted by row, then column
    return r.tolist(), c.tolist(), keys[r, c].tolist()


@pytest.mark.parametrize("share", [0.0, 0.002, 0.05, 0.5, 1.0])  # from no entry to every entry below tau
@pytest.mark.parametrize("shape", [(2 * SEGMENT, 3 * SEGMENT), (SEGMENT + 5, 2 * SEGMENT), (7, 13)])
def test_scans_find_exactly_the_entries_below_the_threshold(share: float, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    keys = torch.rand(shape, generator=g)
    tau_rows = torch.full((shape[0],), share) * torch.linspace(0.5, 1.5, shape[0])
    assert [t.tolist() for t in _below_by_row(keys, tau_rows)] == list(expected_by_row(keys, tau_rows))
    # by column: the entries below their column's threshold, sorted by column then row
    tau_cols = torch.full((shape[1],), share) * torch.linspace(0.5, 1.5, shape[1])
    c, r, v = _below_by_column(keys, tau_cols)
    assert (c.tolist(), r.tolist(), v.tolist()) == expected_by_row(keys.T, tau_cols)


def test_column_scan_on_a_non_contiguous_block() -> None:
    keys = torch.rand(3 * SEGMENT, 2 * SEGMENT, generator=torch.Generator().manual_seed(1))[:, ::2]
    tau = torch.full((SEGMENT,), 0.1)
    c, r, v = _below_by_column(keys, tau)
    assert (c.tolist(), r.tolist(), v.tolist()) == expected_by_row(keys.T, tau)
