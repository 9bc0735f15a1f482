"""The gathers of sharded mode on real gloo processes: every rank's rows, in rank order, whatever their number.

Each rank builds its tensors from its rank alone, so the test knows every rank's part and checks the gathered
result against their plain concatenation: uneven and empty ranks, several dtypes (bool included), 1-D and 2-D
columns, a 0-d tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.metrics._distributed import run_distributed
from torchmetrics_retrieval.metrics._sharded.gather import gather, gather_rows

ROWS = {1: [5], 2: [0, 7], 3: [4, 0, 9]}


def _table(rank: int, n: int) -> dict[str, Tensor]:
    base = torch.arange(n) + 100 * rank
    return {
        "rows": base,
        "distances": torch.stack([base.double() / 7, -base.double()], dim=1),
        "items": torch.stack([base, base * 2, base * 3], dim=1).int(),
        "hits": base % 3 == 0,
        "score": base.float() / 3,
        "grid": base.float().repeat_interleave(4).reshape(n, 2, 2),
    }


def _gathered(rank: int, world_size: int) -> dict[str, Any]:
    n = ROWS[world_size][rank]
    table = _table(rank, n)
    return {
        "table": gather_rows(table, None),
        "parts": gather(table["items"][: max(0, n - 1)], None),
        "scalars": gather(torch.tensor(float(rank) / 3), None),
    }


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_rank_gets_every_ranks_rows_in_rank_order(world_size: int, tmp_path: Path) -> None:
    results = run_distributed(_gathered, world_size, tmp_path)
    tables = [_table(rank, n) for rank, n in enumerate(ROWS[world_size])]
    for result in results:
        assert list(result["table"]) == list(tables[0])
        for key, value in result["table"].items():
            expected = torch.cat([table[key] for table in tables])
            assert value.dtype == expected.dtype and value.shape == expected.shape, key
            assert torch.equal(value, expected), key
        for rank, part in enumerate(result["parts"]):
            assert torch.equal(part, tables[rank]["items"][: max(0, ROWS[world_size][rank] - 1)])
        assert [float(s) for s in result["scalars"]] == [float(torch.tensor(r / 3)) for r in range(world_size)]
        assert all(s.ndim == 0 for s in result["scalars"])
