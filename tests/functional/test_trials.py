"""``score_metrics`` and ``trial_metrics`` against references written here: brute-force numpy EER and minDCF,
scikit-learn's ``roc_auc_score`` and ``roc_curve`` (ROC AUC, the ROC points of ``far_rule="nearest_roc_point"``),
``IsotonicRegression`` followed by the Cllr formula (``min_cllr``), hand-computed Cllr and actual DCF, and the
all-pairs path (``fnmr_at_fmr``) when the trial list is every labelled pair.

speechbrain's ``EER``/``minDCF`` are the oracle of ``test_speechbrain_oracle``; the one-sort path's ties, signed
zeros and value ranges are tested in ``test_score_sweep``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.isotonic import IsotonicRegression
from sklearn.metrics import roc_auc_score, roc_curve

from torchmetrics_retrieval.functional import fnmr_at_fmr, score_metrics, trial_metrics

LN2 = math.log(2)

# ---- references --------------------------------------------------------------------------------------------------


def ref_rates(scores: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FAR, FRR) at every threshold: accept nothing, then accept the trials scoring >= each distinct score,
    from the highest down (docs/definitions.md: distance = -score, accept at distance <= t)."""
    pos, neg = scores[target], scores[~target]
    cuts = np.concatenate([[np.inf], np.unique(scores)[::-1]])
    far = np.array([np.mean(neg >= c) for c in cuts])
    frr = np.array([np.mean(pos < c) for c in cuts])
    return far, frr


def ref_eer(scores: np.ndarray, target: np.ndarray, rates: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """``rates``: ``ref_rates(scores, target)`` if already computed (it takes seconds on 10^5 distinct scores)."""
    far, frr = ref_rates(scores, target) if rates is None else rates
    i = int(np.argmin(np.abs(far - frr)))  # the first, the least accepting, on a tie
    return float((far[i] + frr[i]) / 2)


def ref_min_dcf(
    scores: np.ndarray,
    target: np.ndarray,
    p: float,
    costs: tuple[float, float] = (1.0, 1.0),
    rates: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    far, frr = ref_rates(scores, target) if rates is None else rates
    return float(np.min(costs[0] * p * frr + costs[1] * (1 - p) * far) / min(costs[0] * p, costs[1] * (1 - p)))


def ref_fnmr(scores: np.ndarray, target: np.ndarray, f: float) -> float:
    """FNMR at the f-quantile (numpy's linear rule) of the non-target distances -score."""
    threshold = np.quantile(-scores[~target], f)
    return float(np.mean(-scores[target] >= threshold))


def ref_nearest_tar(scores: np.ndarray, target: np.ndarray, f: float) -> float:
    """insightface's reading: scikit-learn's default ROC points from the highest FAR down, the first nearest f."""
    fpr, tpr, _ = roc_curve(target.astype(int), scores)
    fpr, tpr = fpr[::-1], tpr[::-1]
    return float(tpr[int(np.argmin(np.abs(fpr - f)))])


def ref_cllr(llr: np.ndarray, target: np.ndarray) -> float:
    tar, non = llr[target], llr[~target]
    return float((np.mean(np.logaddexp(0, -tar)) + np.mean(np.logaddexp(0, non))) / (2 * LN2))


def ref_min_cllr(scores: np.ndarray, target: np.ndarray) -> float:
    """Cllr of the PAV posteriors (scikit-learn, tied scores pooled) turned into LLRs at the empirical prior."""
    q = IsotonicRegression(out_of_bounds="clip").fit(scores, target.astype(float)).predict(scores)
    n_tar, n_non = int(target.sum()), int((~target).sum())
    with np.errstate(divide="ignore"):
        llr = np.log(q) - np.log1p(-q) - math.log(n_tar / n_non)  # +-inf at q = 1 or 0
    tar_cost = np.where(q[target] == 1, 0.0, np.logaddexp(0, -llr[target]))
    non_cost = np.where(q[~target] == 0, 0.0, np.logaddexp(0, llr[~target]))
    return float((tar_cost.mean() + non_cost.mean()) / (2 * LN2))


def ref_act_dcf(llr: np.ndarray, target: np.ndarray, p: float, costs: tuple[float, float] = (1.0, 1.0)) -> float:
    threshold = math.log(costs[1] * (1 - p) / (costs[0] * p))
    miss, fa = np.mean(llr[target] < threshold), np.mean(llr[~target] >= threshold)
    return float((costs[0] * p * miss + costs[1] * (1 - p) * fa) / min(costs[0] * p, costs[1] * (1 - p)))


def make_scores(kind: str, seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target = rng.random(n) < 0.3
    target[:2] = (True, False)
    if kind == "ties":  # few distinct values: many ties between targets and non-targets
        scores = rng.integers(-4, 5, n).astype(np.float64) + target * rng.integers(0, 3, n)
    else:
        scores = rng.normal(size=n) + 1.5 * target
    return scores, target


ALL = {
    "fmr_vals": (0.0, 0.01, 0.1, 0.5, 1.0),
    "eer": True,
    "min_dcf_p_target": (0.01, 0.5),
    "roc_auc": True,
    "cllr": True,
    "act_dcf_p_target": (0.01, 0.5),
}


def as_floats(out: dict[str, torch.Tensor]) -> dict[str, float]:
    return {key: float(value) for key, value in out.items()}


# ---- given scores ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("kind", "seed"), [("ties", 0), ("ties", 1), ("continuous", 2), ("continuous", 3)])
def test_score_metrics_against_references(kind: str, seed: int, dtype: torch.dtype) -> None:
    scores, target = make_scores(kind, seed)
    scores = torch.tensor(scores, dtype=dtype).double().numpy()  # the values the package sees
    out = score_metrics(torch.tensor(scores, dtype=dtype), torch.tensor(target), **ALL)
    assert all(v.dtype == torch.float32 and v.ndim == 0 for v in out.values())
    expected = {f"fnmr@fmr/{f}": ref_fnmr(scores, target, f) for f in ALL["fmr_vals"]}
    expected |= {f"tar@far/{f}": 1 - expected[f"fnmr@fmr/{f}"] for f in ALL["fmr_vals"]}
    expected["eer"] = ref_eer(scores, target)
    expected |= {f"min_dcf/{p}": ref_min_dcf(scores, target, p) for p in ALL["min_dcf_p_target"]}
    expected["roc_auc"] = roc_auc_score(target, scores)
    expected |= {f"act_dcf/{p}": ref_act_dcf(scores, target, p) for p in ALL["act_dcf_p_target"]}
    expected["cllr"] = ref_cllr(scores, target)
    expected["min_cllr"] = ref_min_cllr(scores, target)
    assert list(out) == list(expected)
    assert as_floats(out) == pytest.approx(expected, abs=1e-6)


def test_eer_matches_the_roc_route() -> None:
    # the ROC route of test_verification_rates: scikit-learn's points, the first with the smallest |FNR - FPR|
    scores, target = make_scores("ties", 7)
    fpr, tpr, _ = roc_curve(target.astype(int), scores, drop_intermediate=False)
    i = int(np.argmin(np.abs(1 - tpr - fpr)))
    eer = score_metrics(torch.tensor(scores), torch.tensor(target), eer=True)["eer"]
    assert float(eer) == pytest.approx((fpr[i] + 1 - tpr[i]) / 2, abs=1e-7)


def test_dcf_costs_apply_to_min_and_actual_dcf() -> None:
    scores, target = make_scores("continuous", 4)
    costs = (10.0, 1.0)
    out = score_metrics(
        torch.tensor(scores), torch.tensor(target), min_dcf_p_target=0.05, act_dcf_p_target=0.05, dcf_costs=costs
    )
    assert float(out["min_dcf/0.05"]) == pytest.approx(ref_min_dcf(scores, target, 0.05, costs), abs=1e-6)
    assert float(out["act_dcf/0.05"]) == pytest.approx(ref_act_dcf(scores, target, 0.05, costs), abs=1e-6)


@pytest.mark.parametrize(("kind", "seed"), [("ties", 5), ("continuous", 6), ("ties", 8)])
def test_nearest_roc_point_reads_insightface_tar(kind: str, seed: int) -> None:
    scores, target = make_scores(kind, seed)
    fmr_vals = (0.0, 1e-3, 0.013, 0.05, 0.1, 0.3, 1.0)
    out = score_metrics(torch.tensor(scores), torch.tensor(target), fmr_vals=fmr_vals, far_rule="nearest_roc_point")
    for f in fmr_vals:
        assert float(out[f"tar@far/{f}"]) == pytest.approx(ref_nearest_tar(scores, target, f), abs=1e-6), f
        assert float(out[f"fnmr@fmr/{f}"]) == pytest.approx(1 - ref_nearest_tar(scores, target, f), abs=1e-6)


def test_nearest_roc_point_can_overshoot_the_far() -> None:
    # non-targets 4, 3, 2, 1; targets 3.5, 2.5, 0.5. ROC points (FAR, TAR): (0, 0), (1/4, 0), (1/4, 1/3), (1/2, 1/3),
    # (1/2, 2/3), (1, 2/3), (1, 1). At FAR 0.4 the nearest is FAR 1/2 (TAR 2/3 there, the larger of the two), above
    # the target; the exact rule's threshold, -2.8 between the non-targets 3 and 2, accepts the target 3.5 only.
    scores = torch.tensor([4.0, 3.0, 2.0, 1.0, 3.5, 2.5, 0.5])
    target = torch.tensor([False, False, False, False, True, True, True])
    nearest = score_metrics(scores, target, fmr_vals=0.4, far_rule="nearest_roc_point")
    exact = score_metrics(scores, target, fmr_vals=0.4)
    assert float(nearest["tar@far/0.4"]) == pytest.approx(2 / 3) == ref_nearest_tar(scores.numpy(), target.numpy(), 0.4)
    assert float(exact["tar@far/0.4"]) == pytest.approx(1 / 3)


def test_hand_computed_cllr_and_act_dcf() -> None:
    # targets 2, 1, -0.5; non-targets 0.5, -1, -3 (natural-log LLRs)
    scores = torch.tensor([2.0, 1.0, 0.5, -0.5, -1.0, -3.0], dtype=torch.float64)
    target = torch.tensor([True, True, False, True, False, False])
    out = score_metrics(scores, target, cllr=True, act_dcf_p_target=(0.5, 0.1))
    tar = (math.log1p(math.exp(-2)) + math.log1p(math.exp(-1)) + math.log1p(math.exp(0.5))) / 3
    non = (math.log1p(math.exp(0.5)) + math.log1p(math.exp(-1)) + math.log1p(math.exp(-3))) / 3
    assert float(out["cllr"]) == pytest.approx((tar + non) / (2 * LN2), abs=1e-7)
    # PAV over -3 N, -1 N, -0.5 T, 0.5 N, 1 T, 2 T: 0, 0, 1/2, 1/2, 1, 1; prior odds 1: LLR 0 for the middle two
    assert float(out["min_cllr"]) == pytest.approx((1 / 3 + 1 / 3) / 2, abs=1e-7)
    # p = 0.5: threshold 0, one target missed (-0.5), one non-target accepted (0.5): (0.5/3 + 0.5/3) / 0.5
    assert float(out["act_dcf/0.5"]) == pytest.approx(2 / 3, abs=1e-7)
    # p = 0.1: threshold log 9 = 2.197, every target missed, no false alarm: 0.1 * 1 / 0.1
    assert float(out["act_dcf/0.1"]) == pytest.approx(1.0, abs=1e-7)


def test_perfect_and_lone_trials() -> None:
    perfect = score_metrics(
        torch.tensor([5.0, -5.0]), torch.tensor([True, False]), eer=True, roc_auc=True, cllr=True, fmr_vals=0.0
    )
    assert float(perfect["eer"]) == 0.0 and float(perfect["roc_auc"]) == 1.0 and float(perfect["min_cllr"]) == 0.0
    assert float(perfect["cllr"]) == pytest.approx(2 * math.log1p(math.exp(-5)) / (2 * LN2), abs=1e-7)
    tied = score_metrics(torch.tensor([1.0, 1.0]), torch.tensor([True, False]), eer=True, roc_auc=True, cllr=True)
    assert float(tied["roc_auc"]) == 0.5 and float(tied["eer"]) == 0.5
    assert float(tied["min_cllr"]) == pytest.approx(1.0)  # one block at the prior: LLR 0, 1 bit each


def test_integer_and_half_scores() -> None:
    scores, target = make_scores("ties", 9)
    as_double = as_floats(score_metrics(torch.tensor(scores), torch.tensor(target), **ALL))
    for dtype in (torch.int64, torch.float16):
        other = as_floats(score_metrics(torch.tensor(scores).to(dtype), torch.tensor(target), **ALL))
        assert other == pytest.approx(as_double, abs=1e-6), dtype


# ---- trial lists -------------------------------------------------------------------------------------------------


def every_labelled_pair(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ordered pairs (i, j), i != j, of the all-pairs path, as a trial list."""
    n = labels.shape[0]
    i, j = torch.nonzero(~torch.eye(n, dtype=torch.bool), as_tuple=True)
    return i, j, labels[i] == labels[j]


@pytest.mark.parametrize("distance", ["cosine", "euclidean", "sqeuclidean", "dot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_labelled_pair_gives_the_all_pairs_values(distance: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(40, 6, generator=gen, dtype=dtype)
    labels = torch.randint(0, 6, (40,), generator=gen)
    options: dict[str, Any] = {"fmr_vals": (0.0, 0.05, 0.5), "eer": True, "min_dcf_p_target": (0.01,), "roc_auc": True}
    expected = as_floats(fnmr_at_fmr(x, labels, distance=distance, **options))
    got = trial_metrics(x, every_labelled_pair(labels), distance=distance, chunk_size=97, **options)
    assert as_floats(got) == pytest.approx(expected, abs=1e-6)
    assert got["roc_auc"] == expected["roc_auc"]  # the same canonical distances, bit for bit


def test_trial_scores_are_minus_the_distance() -> None:
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    enrol = torch.randint(0, 30, (200,), generator=gen)
    test = (enrol + torch.randint(1, 30, (200,), generator=gen)) % 30  # no self-trial; (i, j) and (j, i) may repeat
    target = torch.rand(200, generator=gen) < 0.4
    a, b = x[enrol].numpy(), x[test].numpy()
    # docs/definitions.md's cosine, symmetric in its two sides (so that (i, j) and (j, i) tie, as in the package)
    cos = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    expected = score_metrics(torch.tensor(cos - 1), target, **ALL)
    got = trial_metrics(x, (enrol, test, target), **ALL)
    assert as_floats(got) == pytest.approx(as_floats(expected), abs=1e-6)


def test_chunk_size_does_not_change_the_values() -> None:
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(50, 4, generator=gen)
    trials = every_labelled_pair(torch.randint(0, 5, (50,), generator=gen))
    whole = trial_metrics(x, trials, **ALL)
    for chunk in (1, 7, 5000):
        assert trial_metrics(x, trials, chunk_size=chunk, **ALL) == whole


def test_trial_scores_are_computed_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchmetrics_retrieval.functional._trials as trials_module

    sizes: list[int] = []
    real = trials_module.canonical_distances

    def recorded(problem: Any, rows: torch.Tensor, pair_rows: torch.Tensor, pair_cols: torch.Tensor) -> torch.Tensor:
        sizes.append(pair_rows.numel())
        return real(problem, rows, pair_rows, pair_cols)

    monkeypatch.setattr(trials_module, "canonical_distances", recorded)
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(60, 3, generator=gen)
    trials = every_labelled_pair(torch.randint(0, 4, (60,), generator=gen))
    trial_metrics(x, (trials[0].int(), trials[1].int(), trials[2]), eer=True, chunk_size=500)
    assert sum(sizes) == trials[0].numel() and max(sizes) == 500


# ---- bad input ---------------------------------------------------------------------------------------------------

S = torch.tensor([0.3, 0.1, 0.9, -0.2])
T = torch.tensor([True, False, True, False])
X = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
TRIALS = (torch.tensor([0, 0, 2, 1]), torch.tensor([1, 2, 3, 3]), torch.tensor([True, False, True, False]))

SCORE_ERRORS = [
    ({"scores": S.tolist()}, TypeError, "`scores`"),
    ({"scores": S[None]}, ValueError, "`scores`"),
    ({"scores": torch.tensor([True, False, True, False])}, TypeError, "`scores`"),
    ({"scores": torch.tensor([0.3, float("nan"), 0.9, 0.1])}, ValueError, "`scores`"),
    ({"scores": torch.tensor([0.3, float("inf"), 0.9, 0.1])}, ValueError, "`scores`"),
    ({"is_target": T.long()}, TypeError, "`is_target`"),
    ({"is_target": [True, False, True, False]}, TypeError, "`is_target`"),
    ({"is_target": T[:3]}, ValueError, "`is_target`"),
    ({"is_target": torch.ones(4, dtype=torch.bool)}, ValueError, "non-target"),
    ({"is_target": torch.zeros(4, dtype=torch.bool)}, ValueError, "0 target"),
    ({"fmr_vals": (1.5,)}, ValueError, "`fmr_vals`"),
    ({"eer": "yes"}, TypeError, "`eer`"),
    ({"min_dcf_p_target": 0.0}, ValueError, "`min_dcf_p_target`"),
    ({"dcf_costs": (1.0, 0.0)}, ValueError, "`dcf_costs`"),
    ({"roc_auc": 1}, TypeError, "`roc_auc`"),
    ({"cllr": "no"}, TypeError, "`cllr`"),
    ({"act_dcf_p_target": (0.5, 1.0)}, ValueError, "`act_dcf_p_target`"),
    ({"act_dcf_p_target": "0.5"}, TypeError, "`act_dcf_p_target`"),
    ({"far_rule": "nearest"}, ValueError, "`far_rule`"),
]


@pytest.mark.parametrize(("change", "error", "named"), SCORE_ERRORS)
def test_score_metrics_errors(change: dict[str, Any], error: type[Exception], named: str) -> None:
    arguments = {"scores": S, "is_target": T, **change}
    with pytest.raises(error, match=named.replace("(", r"\(")):
        score_metrics(**arguments)


TRIAL_ERRORS = [
    ({"embeddings": X[:, 0]}, ValueError, "`embeddings`"),
    ({"embeddings": X.long()}, TypeError, "`embeddings`"),
    ({"embeddings": torch.zeros(4, 2)}, ValueError, "`embeddings`"),  # all-zero rows under cosine
    ({"trials": list(TRIALS[:2])}, TypeError, "`trials`"),
    ({"trials": torch.stack(TRIALS[:2])}, TypeError, "`trials`"),
    ({"trials": (TRIALS[0].float(), *TRIALS[1:])}, TypeError, "`trials` (enrol_index)"),
    ({"trials": (TRIALS[0], TRIALS[1].bool(), TRIALS[2])}, TypeError, "`trials` (test_index)"),
    ({"trials": (TRIALS[0][None], *TRIALS[1:])}, ValueError, "`trials` (enrol_index)"),
    ({"trials": (TRIALS[0], torch.tensor([1, 2, 4, 3]), TRIALS[2])}, ValueError, "got 4 at position 2"),
    ({"trials": (torch.tensor([0, -1, 2, 1]), *TRIALS[1:])}, ValueError, "got -1 at position 1"),
    ({"trials": (TRIALS[0], TRIALS[1][:3], TRIALS[2])}, ValueError, "`trials`"),
    ({"trials": (*TRIALS[:2], TRIALS[2].long())}, TypeError, "`trials` (is_target)"),
    ({"trials": (*TRIALS[:2], TRIALS[2][:3])}, ValueError, "`trials` (is_target)"),
    ({"trials": (*TRIALS[:2], torch.zeros(4, dtype=torch.bool))}, ValueError, "`trials` (is_target)"),
    ({"distance": "manhattan"}, ValueError, "`distance`"),
    ({"chunk_size": 0}, ValueError, "`chunk_size`"),
    ({"chunk_size": 1.5}, TypeError, "`chunk_size`"),
    ({"far_rule": "closest"}, ValueError, "`far_rule`"),
    ({"min_dcf_p_target": (1.0,)}, ValueError, "`min_dcf_p_target`"),
]


@pytest.mark.parametrize(("change", "error", "named"), TRIAL_ERRORS)
def test_trial_metrics_errors(change: dict[str, Any], error: type[Exception], named: str) -> None:
    arguments = {"embeddings": X, "trials": TRIALS, **change}
    with pytest.raises(error, match=named.replace("(", r"\(").replace(")", r"\)")):
        trial_metrics(**arguments)
