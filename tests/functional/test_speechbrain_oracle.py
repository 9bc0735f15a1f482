"""``eer`` and ``min_dcf/{p}`` of ``score_metrics`` against speechbrain's ``EER`` and ``minDCF``
(``speechbrain.utils.metric_stats``, speechbrain 1.1.2, installed with ``--no-deps``; its metric module needs
``hyperpyyaml``, a test dependency).

speechbrain's package ``__init__`` imports its audio I/O, and with it torchaudio, whose compiled extension is built
against one torch release: the metric functions never touch it, so a stand-in module named ``torchaudio`` is put in
``sys.modules`` while speechbrain imports (when no torchaudio is installed), and removed afterwards.

The rules, compared in docs/definitions.md: speechbrain's thresholds (each distinct score and each midpoint between
two, a trial accepted when it scores strictly above) make the same partitions of the trials as ours, except "accept
every trial"; on a tie of |FAR - FRR| it keeps the most accepting threshold, we the least. Its EER is (FAR + FRR) / 2
from float32 rates, its minDCF is not normalised. So the EERs are compared on data where the smallest |FAR - FRR| is
reached once (checked here, by brute force; elsewhere each EER is checked against its own rule), and minDCF after
dividing speechbrain's by min(C_miss p, C_fa (1 - p)).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.functional import score_metrics


@pytest.fixture(scope="module")
def speechbrain() -> Iterator[Any]:
    before = set(sys.modules)
    stand_in = importlib.util.find_spec("torchaudio") is None and "torchaudio" not in sys.modules
    if stand_in:
        module = types.ModuleType("torchaudio")
        module.__version__ = "0.0"  # type: ignore[attr-defined]  (speechbrain parses it)
        sys.modules["torchaudio"] = module
    try:
        yield importlib.import_module("speechbrain.utils.metric_stats")
    finally:
        # speechbrain registers lazy modules that raise ImportError when a later test's tooling (hypothesis) looks
        # at every loaded module: forget everything its import loaded once this file is done
        for name in set(sys.modules) - before:
            del sys.modules[name]


def far_frr(scores: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FAR, FRR) of every partition: accept the trials scoring at least each distinct score, and nothing."""
    cuts = np.concatenate([np.unique(scores), [np.inf]])
    far = np.array([np.mean(scores[~target] >= c) for c in cuts])
    frr = np.array([np.mean(scores[target] < c) for c in cuts])
    return far, frr


def trials(kind: str, seed: int, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target = rng.random(n) < 0.3
    target[:2] = (True, False)
    if kind == "ties":
        scores = rng.integers(-6, 7, n) / 2 + 1.0 * target
    else:
        scores = rng.normal(size=n) + 1.5 * target
    return scores, target


CASES = [("continuous", s) for s in range(4)] + [("ties", s) for s in range(4, 12)]


@pytest.mark.parametrize(("kind", "seed"), CASES)
def test_eer_against_speechbrain(speechbrain: Any, kind: str, seed: int) -> None:
    scores, target = trials(kind, seed)
    sb_eer, _ = speechbrain.EER(torch.tensor(scores[target]), torch.tensor(scores[~target]))
    got = float(score_metrics(torch.tensor(scores), torch.tensor(target), eer=True)["eer"])
    far, frr = far_frr(scores, target)  # partitions from the most accepting on
    gaps = np.abs(far - frr)
    smallest = np.flatnonzero(gaps == gaps.min())
    if smallest.size == 1:  # the rules coincide: one value
        assert got == pytest.approx(sb_eer, abs=1e-6)
    # each rule's choice among the partitions of smallest gap: ours the least accepting, speechbrain's the most
    # accepting one that is not "accept everything" (partition 0, which it never tries)
    ours, theirs = smallest[-1], smallest[smallest > 0][0]
    assert got == pytest.approx((far[ours] + frr[ours]) / 2, abs=1e-6)
    assert sb_eer == pytest.approx((far[theirs] + frr[theirs]) / 2, abs=1e-6)


def test_the_eer_cases_include_both_kinds_of_data() -> None:
    # the equality above must be asserted on most cases of both kinds (those with one smallest gap), and the two tie
    # rules on at least one case
    single = {"continuous": 0, "ties": 0}
    for kind, seed in CASES:
        far, frr = far_frr(*trials(kind, seed))
        gaps = np.abs(far - frr)
        single[kind] += int(np.sum(gaps == gaps.min()) == 1)
    assert single["continuous"] >= 3 and single["ties"] >= 3 and sum(single.values()) < len(CASES), single


@pytest.mark.parametrize(("kind", "seed"), CASES[:6])
@pytest.mark.parametrize(
    ("p", "costs"), [(0.01, (1.0, 1.0)), (0.05, (1.0, 1.0)), (0.5, (1.0, 1.0)), (0.1, (10.0, 1.0))]
)
def test_min_dcf_equals_speechbrain_normalised(
    speechbrain: Any, kind: str, seed: int, p: float, costs: tuple[float, float]
) -> None:
    scores, target = trials(kind, seed)
    c_miss, c_fa = costs
    raw, _ = speechbrain.minDCF(
        torch.tensor(scores[target]), torch.tensor(scores[~target]), c_miss=c_miss, c_fa=c_fa, p_target=p
    )
    got = score_metrics(torch.tensor(scores), torch.tensor(target), min_dcf_p_target=p, dcf_costs=costs)
    # speechbrain never accepts every trial; that partition costs C_fa (1 - p), normalised >= 1, never below its min
    expected = min(raw / min(c_miss * p, c_fa * (1 - p)), c_fa * (1 - p) / min(c_miss * p, c_fa * (1 - p)))
    assert float(got[f"min_dcf/{p}"]) == pytest.approx(expected, abs=1e-6)
