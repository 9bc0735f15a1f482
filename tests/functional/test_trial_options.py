"""``trial_metrics`` with ``score_norm`` (and its cohort options) and with ``template_ids``/``media_ids``: against
``score_metrics`` of ``normalize_scores``' output, against scores normalised by a numpy reference written here
(z-, t-, s- and AS-norm), against ``trial_metrics`` on templates pooled by numpy, and every new error path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from torchmetrics_retrieval.functional import normalize_scores, score_metrics, trial_metrics

OPTIONS: dict[str, Any] = {"fmr_vals": (0.1, 0.5), "eer": True, "min_dcf_p_target": (0.05,), "roc_auc": True}
OPTIONS_LLR: dict[str, Any] = {**OPTIONS, "cllr": True, "act_dcf_p_target": (0.5,)}


def data(seed: int = 0, n: int = 40, d: int = 6, n_trials: int = 120, n_cohort: int = 25) -> tuple[Any, ...]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 6, (n,), generator=generator)
    centres = torch.randn(6, d, generator=generator, dtype=torch.float64)
    x = centres[labels] + 0.7 * torch.randn(n, d, generator=generator, dtype=torch.float64)
    enrol, test = torch.randint(0, n, (2, n_trials), generator=generator)
    keep = enrol != test
    enrol, test = enrol[keep], test[keep]
    cohort = torch.randn(n_cohort, d, generator=generator, dtype=torch.float64)
    return x, (enrol, test, labels[enrol] == labels[test]), cohort, labels


# ---- references --------------------------------------------------------------------------------------------------


def ref_scores(a: np.ndarray, b: np.ndarray, distance: str) -> np.ndarray:
    """Minus the distance of each row of ``a`` to each row of ``b`` (``(len(a), len(b))``)."""
    if distance == "cosine":
        an = a / np.linalg.norm(a, axis=1, keepdims=True)
        bn = b / np.linalg.norm(b, axis=1, keepdims=True)
        return an @ bn.T - 1
    if distance == "euclidean":
        return -np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    raise AssertionError(distance)


def ref_normalise(
    x: np.ndarray, trials: tuple[Tensor, ...], cohort: np.ndarray, method: str, top_n: Any, distance: str
):
    """Trial scores normalised as docs/definitions.md defines it, side statistics from every (or the top_n
    highest) cohort scores, population standard deviation."""
    enrol, test = trials[0].numpy(), trials[1].numpy()
    s = ref_scores(x[enrol], x[test], distance).diagonal()

    def side(rows: np.ndarray) -> np.ndarray:
        c = ref_scores(x[rows], cohort, distance)
        if top_n is not None:
            c = -np.sort(-c, axis=1)[:, :top_n]
        return (s - c.mean(axis=1)) / c.std(axis=1)

    z, t = side(enrol), side(test)
    return {"z": z, "t": t, "s": (z + t) / 2, "as": (z + t) / 2}[method]


def ref_pool(x: np.ndarray, template_ids: np.ndarray, media_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IJB pooling, loop by loop: unit rows, media means, template mean of the media means, unit again."""
    ids = np.unique(template_ids)
    pooled = []
    for t in ids:
        in_t = template_ids == t
        means = [x[in_t & (media_ids == m)] for m in np.unique(media_ids[in_t])]
        means = [(rows / np.linalg.norm(rows, axis=1, keepdims=True)).mean(axis=0) for rows in means]
        mean = np.mean(means, axis=0)
        pooled.append(mean / np.linalg.norm(mean))
    return np.stack(pooled), ids


def assert_same(actual: dict[str, Tensor], expected: dict[str, Tensor], atol: float = 0.0) -> None:
    assert list(actual) == list(expected)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=atol, msg=key)


# ---- score normalisation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize(("method", "top_n"), [("z", None), ("t", None), ("s", None), ("as", 5)])
def test_score_norm_is_score_metrics_of_normalize_scores(method: str, top_n: Any, distance: str) -> None:
    x, trials, cohort, _ = data()
    enrol, test, is_target = trials
    a, b = x[enrol], x[test]
    raw_scores = -(torch.cdist(a[:, None], b[:, None]).flatten()) if distance == "euclidean" else None
    if raw_scores is None:
        raw_scores = torch.nn.functional.cosine_similarity(a, b) - 1
    normalised = normalize_scores(raw_scores, x, enrol, test, cohort, method=method, top_n=top_n, distance=distance)
    expected = score_metrics(normalised, is_target, **OPTIONS_LLR)
    actual = trial_metrics(
        x, trials, distance=distance, score_norm=method, cohort=cohort, top_n=top_n, chunk_size=7, **OPTIONS_LLR
    )
    assert_same(actual, expected, atol=1e-6)


@pytest.mark.parametrize(("method", "top_n"), [("z", None), ("t", None), ("s", None), ("as", 1 + 2), ("as", 25)])
@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_score_norm_matches_numpy_reference(method: str, top_n: Any, distance: str) -> None:
    x, trials, cohort, _ = data(seed=1)
    reference = ref_normalise(x.numpy(), trials, cohort.numpy(), method, top_n, distance)
    expected = score_metrics(torch.from_numpy(reference), trials[2], **OPTIONS_LLR)
    actual = trial_metrics(x, trials, distance=distance, score_norm=method, cohort=cohort, top_n=top_n, **OPTIONS_LLR)
    assert_same(actual, expected, atol=1e-6)


def test_score_norm_changes_the_values() -> None:
    """Not the raw scores' values again (the normalisation is applied)."""
    x, trials, cohort, _ = data(seed=2)
    raw = trial_metrics(x, trials, cllr=True)
    normalised = trial_metrics(x, trials, cllr=True, score_norm="z", cohort=cohort)
    assert not torch.equal(raw["cllr"], normalised["cllr"])


def test_shared_ids_warn() -> None:
    x, trials, cohort, labels = data(seed=3)
    cohort_ids = torch.full((cohort.shape[0],), 100)
    cohort_ids[0] = int(labels[trials[0][0]])
    with pytest.warns(UserWarning, match="share an id"):
        trial_metrics(x, trials, eer=True, score_norm="s", cohort=cohort, embedding_ids=labels, cohort_ids=cohort_ids)


# ---- templates -----------------------------------------------------------------------------------------------------


def template_data(seed: int = 0) -> tuple[Any, ...]:
    generator = torch.Generator().manual_seed(seed)
    n_templates, d = 12, 5
    identity = torch.arange(n_templates) % 4
    template_of_row = torch.randint(0, n_templates, (60,), generator=generator)
    template_of_row[:n_templates] = torch.arange(n_templates)  # every template has a row
    template_ids = 1000 + 7 * template_of_row  # ids are not rows
    media_ids = torch.randint(0, 3, (60,), generator=generator)
    centres = torch.randn(4, d, generator=generator, dtype=torch.float64)
    x = centres[identity[template_of_row]] + 0.8 * torch.randn(60, d, generator=generator, dtype=torch.float64)
    enrol, test = torch.randint(0, n_templates, (2, 80), generator=generator)
    keep = enrol != test
    enrol, test = enrol[keep], test[keep]
    trials = (1000 + 7 * enrol, 1000 + 7 * test, identity[enrol] == identity[test])
    return x, template_ids, media_ids, trials, identity[template_of_row]


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("with_media", [False, True])
def test_templates_match_numpy_pooling(distance: str, with_media: bool) -> None:
    x, template_ids, media_ids, trials, _ = template_data()
    media = media_ids if with_media else torch.arange(x.shape[0])
    pooled, ids = ref_pool(x.numpy(), template_ids.numpy(), media.numpy())
    rows = (
        torch.from_numpy(np.searchsorted(ids, trials[0].numpy())),
        torch.from_numpy(np.searchsorted(ids, trials[1].numpy())),
    )
    expected = trial_metrics(torch.from_numpy(pooled), (*rows, trials[2]), distance=distance, **OPTIONS_LLR)
    actual = trial_metrics(
        x,
        trials,
        distance=distance,
        template_ids=template_ids,
        media_ids=media_ids if with_media else None,
        **OPTIONS_LLR,
    )
    assert_same(actual, expected, atol=1e-6)


def test_templates_with_as_norm() -> None:
    x, template_ids, media_ids, trials, row_identity = template_data(seed=1)
    pooled, ids = ref_pool(x.numpy(), template_ids.numpy(), media_ids.numpy())
    cohort = torch.randn(20, x.shape[1], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    rows = tuple(torch.from_numpy(np.searchsorted(ids, t.numpy())) for t in trials[:2])
    reference = ref_normalise(pooled, (*rows, trials[2]), cohort.numpy(), "as", 6, "cosine")
    expected = score_metrics(torch.from_numpy(reference), trials[2], **OPTIONS)
    actual = trial_metrics(
        x,
        trials,
        template_ids=template_ids,
        media_ids=media_ids,
        score_norm="as",
        cohort=cohort,
        top_n=6,
        embedding_ids=row_identity,
        cohort_ids=torch.full((20,), -1),
        **OPTIONS,
    )
    assert_same(actual, expected, atol=1e-6)


# ---- errors --------------------------------------------------------------------------------------------------------


def _error_cases() -> list[Any]:
    x, trials, cohort, labels = data(seed=4)
    ids = torch.full((cohort.shape[0],), 100)
    tx, template_ids, _, template_trials, _ = template_data()
    unknown = (template_trials[0].clone(), template_trials[1], template_trials[2])
    unknown[0][3] = 1001
    mixed = torch.arange(tx.shape[0])
    single = cohort[:1]
    return [
        ("cohort without score_norm", x, trials, {"cohort": cohort}, "`cohort`"),
        ("top_n without score_norm", x, trials, {"top_n": 3}, "`top_n`"),
        ("embedding_ids without score_norm", x, trials, {"embedding_ids": labels}, "`embedding_ids`"),
        ("cohort_ids without score_norm", x, trials, {"cohort_ids": ids}, "`cohort_ids`"),
        ("score_norm without cohort", x, trials, {"score_norm": "z"}, "`cohort`"),
        ("score_norm unknown", x, trials, {"score_norm": "zt", "cohort": cohort}, "`score_norm`"),
        ("as without top_n", x, trials, {"score_norm": "as", "cohort": cohort}, "`top_n`"),
        ("top_n with z", x, trials, {"score_norm": "z", "cohort": cohort, "top_n": 2}, "`top_n`"),
        ("cohort columns", x, trials, {"score_norm": "z", "cohort": cohort[:, :3]}, "`cohort`"),
        ("cohort of one", x, trials, {"score_norm": "t", "cohort": single}, "`cohort`"),
        ("cohort_ids alone", x, trials, {"score_norm": "z", "cohort": cohort, "cohort_ids": ids}, "`embedding_ids`"),
        ("media_ids without template_ids", x, trials, {"media_ids": labels}, "`media_ids`"),
        ("unknown template id", tx, unknown, {"template_ids": template_ids}, "`trials`"),
        ("template_ids length", tx, template_trials, {"template_ids": template_ids[:-1]}, "`template_ids`"),
        (
            "embedding_ids mixed within a template",
            tx,
            template_trials,
            {
                "template_ids": template_ids,
                "score_norm": "z",
                "cohort": cohort[:, :5],
                "embedding_ids": mixed,
                "cohort_ids": ids,
            },
            "`embedding_ids`",
        ),
    ]


@pytest.mark.parametrize(("what", "x", "trials", "kwargs", "named"), _error_cases(), ids=[c[0] for c in _error_cases()])
@pytest.mark.filterwarnings("ignore:.*normalised scores are NaN")
def test_errors_name_the_argument(what: str, x: Tensor, trials: Any, kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises((ValueError, TypeError), match=named):
        trial_metrics(x, trials, eer=True, **kwargs)


def test_unknown_template_id_is_named() -> None:
    tx, template_ids, _, trials, _ = template_data()
    test = trials[1].clone()
    test[5] = 4242
    with pytest.raises(ValueError, match=r"\(test_index\).*got 4242 at position 5"):
        trial_metrics(tx, (trials[0], test, trials[2]), eer=True, template_ids=template_ids)
