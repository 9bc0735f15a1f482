"""How the one tile schedule is shared out over the ranks (``metrics._sharded.tiles``)."""

from __future__ import annotations

import pytest

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.metrics._sharded.tiles import _holders


def _pairs_of(schedule: TileSchedule, holders: list[int], world: int) -> list[int]:
    load = [0] * world
    for rows, cols in schedule.tiles():
        j = schedule.col_blocks.index(cols)
        load[holders[j]] += (rows.stop - rows.start) * (cols.stop - cols.start)
    return load


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("n_rows", "n_cols", "symmetric"), [(20_000, 20_000, True), (5_000, 20_000, False), (900, 900, True)]
)
def test_every_column_block_has_one_holder_and_the_loads_are_balanced(
    world: int, n_rows: int, n_cols: int, symmetric: bool
) -> None:
    schedule = TileSchedule.of(n_rows, n_cols, None, symmetric)
    holders = _holders(schedule, world)
    assert len(holders) == len(schedule.col_blocks) and set(holders) <= set(range(world))
    load = _pairs_of(schedule, holders, world)
    largest_block = max(
        (cs.stop - cs.start) * sum(rs.stop - rs.start for rs, c in schedule.tiles() if c == cs)
        for cs in schedule.col_blocks
    )
    assert max(load) - min(load) <= largest_block  # greedy, largest first: within one block of each other
    assert sum(load) == sum((rs.stop - rs.start) * (cs.stop - cs.start) for rs, cs in schedule.tiles())


def test_a_symmetric_triangle_is_split_more_evenly_than_by_block_number() -> None:
    """Column block j of a symmetric set holds j + 1 tiles: every other block would give one rank the heavier half."""
    schedule = TileSchedule.of(5 * plan.SYMMETRIC_KEY_TILE, 5 * plan.SYMMETRIC_KEY_TILE, None, symmetric=True)
    balanced = _pairs_of(schedule, _holders(schedule, 2), 2)
    alternate = _pairs_of(schedule, [j % 2 for j in range(len(schedule.col_blocks))], 2)
    tile = plan.SYMMETRIC_KEY_TILE**2
    assert sorted(alternate) == [6 * tile, 9 * tile]  # blocks 0, 2, 4 hold 1 + 3 + 5 tiles; blocks 1, 3: 2 + 4
    assert sorted(balanced) == [7 * tile, 8 * tile]
