"""The one tile schedule of the passes over every pair: every ordered pair read exactly once."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.blocks import TileSchedule


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(
    ("n_rows", "n_cols", "chunk_size"), [(29, 29, 4), (29, 17, None), (1100, 1030, None), (7, 5000, 3), (1, 1, None)]
)
def test_every_ordered_pair_is_covered_once(symmetric: bool, n_rows: int, n_cols: int, chunk_size: int | None) -> None:
    if symmetric:
        n_cols = n_rows
    schedule = TileSchedule.of(n_rows, n_cols, chunk_size, symmetric)
    covered = torch.zeros(n_rows, n_cols, dtype=torch.long)
    for rows, cols in schedule.tiles():
        covered[rows, cols] += 1
        if schedule.mirrored(rows, cols):
            covered[cols, rows] += 1
    assert torch.equal(covered, torch.ones_like(covered))


def test_tiles_respect_the_chunk_size_and_the_row_cap() -> None:
    schedule = TileSchedule.of(3000, 9000, None, symmetric=False)
    assert max(rs.stop - rs.start for rs in schedule.row_blocks) <= plan.KEY_TILE_ROWS
    chunked = TileSchedule.of(50, 50, 8, symmetric=True)
    assert all(rs.stop - rs.start <= 8 for rs, _ in chunked.tiles())


def test_first_rows_only_keeps_the_first_row_block() -> None:
    schedule = TileSchedule.of(40, 40, 8, symmetric=True)
    first = schedule.tiles(first_rows_only=True)
    assert {rs.start for rs, _ in first} == {0}
    assert [cs.start for _, cs in first] == [0, 8, 16, 24, 32]
