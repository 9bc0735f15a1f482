"""``eer`` and ``min_dcf/{p}`` over every pair, against scikit-learn's ROC route and a brute-force minimum.

The pairs are listed in the tests (numpy, all ordered pairs, every distance); the package never lists them. Both
computing paths (compiled kernels, checked to be called, and torch passes) run, with few histogram buckets too (many
distances per bucket).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from tests.functional.conftest import KernelCalls
from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional.verification import fnmr_at_fmr


def pairs(x: torch.Tensor, labels: torch.Tensor, distance: str) -> tuple[np.ndarray, np.ndarray]:
    """Distances and positive flags of every ordered pair (q, g), g != q: docs/definitions.md's formula in float64,
    rounded to the embeddings' float32 as the package reports distances (so that pairs at the same distance, e.g.
    parallel integer rows under cosine, tie as they do in the package)."""
    a = x.double().numpy()
    gram = a @ a.T  # exact on small integers
    if distance in ("euclidean", "sqeuclidean"):
        squared = ((a[:, None] - a[None]) ** 2).sum(-1)
        d = np.sqrt(squared) if distance == "euclidean" else squared
    elif distance == "cosine":  # 1 - <q, g> / sqrt(<q, q> <g, g>): exactly 0 for parallel rows
        d = 1.0 - gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    else:  # dot: -<q, g>
        d = -gram
    d = d.astype(np.float32).astype(np.float64)
    off = ~np.eye(x.shape[0], dtype=bool)
    return d[off], (labels[:, None] == labels[None, :]).numpy()[off]


def sklearn_eer(d: np.ndarray, positive: np.ndarray) -> float:
    fpr, tpr, _ = roc_curve(positive.astype(int), -d, drop_intermediate=False)
    i = int(np.argmin(np.abs((1 - tpr) - fpr)))
    return float((fpr[i] + 1 - tpr[i]) / 2)


def brute_min_dcf(d: np.ndarray, positive: np.ndarray, p: float, costs: tuple[float, float]) -> float:
    pos, neg = d[positive], d[~positive]
    best = costs[0] * p  # t = -inf: every positive missed, no false match
    for t in np.unique(d):
        cost = costs[0] * p * np.mean(pos > t) + costs[1] * (1 - p) * np.mean(neg <= t)
        best = min(best, cost)
    return best / min(costs[0] * p, costs[1] * (1 - p))


CASES = [
    ("integer ties", "sqeuclidean", 0),
    ("integer ties", "sqeuclidean", 1),
    ("continuous", "euclidean", 2),
    ("integer ties", "cosine", 3),
    ("integer ties", "cosine", 4),
    ("continuous", "cosine", 5),
    ("integer ties", "dot", 6),
    ("integer ties", "dot", 7),
    ("continuous", "dot", 8),
]


def data(kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (45,), generator=g)
    labels[:2] = torch.tensor([98, 99])  # lone queries: their pairs are all negative
    if kind == "integer ties":  # exact ties between positive and negative distances
        x = torch.randint(-2, 3, (45, 3), generator=g).float()
        x[x.abs().sum(dim=1) == 0] = 1.0  # no zero row (cosine)
    else:
        x = torch.randn(45, 4, generator=g) + labels[:, None].float().remainder(5) / 2
    x[10:14] = x[9]  # exact duplicates, mostly of other labels: ties across positive and negative pairs
    return x, labels


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled kernels", "torch passes"])
@pytest.mark.parametrize("n_buckets", [2**16, 7])
@pytest.mark.parametrize(("kind", "distance", "seed"), CASES)
def test_eer_and_min_dcf_match_the_references(
    kind: str,
    distance: str,
    seed: int,
    n_buckets: int,
    compiled: bool,
    monkeypatch: pytest.MonkeyPatch,
    kernel_calls: KernelCalls,
) -> None:
    x, labels = data(kind, seed)
    d, positive = pairs(x, labels, distance)
    monkeypatch.setattr(pairs_plan, "N_BUCKETS", n_buckets)
    targets, costs = (0.01, 0.3, 0.5), (2.0, 0.5)
    with kernel_calls.forced(compiled, "pairs.histogram"):
        got = fnmr_at_fmr(
            x, labels, fmr_vals=(0.1,), eer=True, min_dcf_p_target=targets, dcf_costs=costs, distance=distance
        )
    assert got["eer"].item() == pytest.approx(sklearn_eer(d, positive), abs=1e-6)
    for p in targets:
        assert got[f"min_dcf/{p}"].item() == pytest.approx(brute_min_dcf(d, positive, p, costs), abs=1e-6), p
    assert got["fnmr@fmr/0.1"].item() == pytest.approx(np.mean(d[positive] >= np.quantile(d[~positive], 0.1)), abs=1e-6)


def test_no_positive_pair_gives_nan_with_a_warning() -> None:
    x = torch.randn(5, 2)
    with pytest.warns(UserWarning, match="no positive pair"):
        got = fnmr_at_fmr(x, torch.arange(5), fmr_vals=(), eer=True, min_dcf_p_target=0.5)
    assert torch.isnan(got["eer"]) and torch.isnan(got["min_dcf/0.5"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"min_dcf_p_target": (0.0,)}, ValueError, "`min_dcf_p_target` must contain numbers strictly between 0 and 1"),
        ({"min_dcf_p_target": (1.5,)}, ValueError, "`min_dcf_p_target` must contain numbers in \\[0, 1\\]"),
        ({"min_dcf_p_target": "0.5"}, TypeError, "`min_dcf_p_target`"),
        ({"dcf_costs": (1.0, -1.0)}, ValueError, "`dcf_costs` must hold two positive finite costs"),
        ({"dcf_costs": (1.0,)}, TypeError, "`dcf_costs` must be a pair"),
        ({"eer": "yes"}, TypeError, "`eer` must be a bool"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        fnmr_at_fmr(torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]), **kwargs)
