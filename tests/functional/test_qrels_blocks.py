"""qrels_metrics with the corpus searched in several blocks (``_qrels_search.CORPUS_BLOCK_BYTES``) gives the values
of one block, bit for bit (``torch.equal``), under every tie rule, with identical ids left out, and with ``mrr``
beyond the lists (the counts summed over blocks). The one-block values are checked against pytrec_eval in
``test_qrels.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.metrics.test_ddp_qrels import IDENTICAL, _identical_data
from tests.metrics.test_qrels_metrics import OPTIONS, data
from torchmetrics_retrieval.functional import _qrels_search, qrels_metrics


@pytest.mark.parametrize("ties", ["position", "trec_eval", "expected"])
@pytest.mark.parametrize("identical", [False, True])
def test_blocks_equal_one_block(ties: str, identical: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _identical_data() if identical else data()
    options: dict[str, Any] = {"ties": ties, **(IDENTICAL if identical else {"distance": "dot"}), **OPTIONS}
    args = (d["query"], d["query_ids"], d["corpus"], d["corpus_ids"], d["qrels"])
    whole = qrels_metrics(*args, **options)
    seen: list[int] = []
    original = _qrels_search.BlockedCorpus.__init__

    def recording(self: Any, *a: Any, **k: Any) -> None:
        original(self, *a, **k)
        seen.append(len(self.blocks))

    monkeypatch.setattr(_qrels_search.BlockedCorpus, "__init__", recording)
    monkeypatch.setattr(_qrels_search, "CORPUS_BLOCK_BYTES", 7 * 4 * 3)  # blocks of 7 of the 40 rows
    monkeypatch.setattr(_qrels_search, "SINGLE_BLOCK_BYTES", 0)
    blocked = qrels_metrics(*args, **options)
    assert seen == [6]
    assert list(blocked) == list(whole)
    for key, value in whole.items():
        assert torch.equal(blocked[key], value), key
