r"""Verification on a trial list, or on given scores: the values of the all-pairs path, from the listed trials only.

A *trial* is an (enrolment, test) pair with a flag: *target* when both sides are the same identity. A higher score
means more alike. With :math:`s^+` the target and :math:`s^-` the non-target scores, the all-pairs values
(``fnmr@fmr/{f}``, ``tar@far/{f}``, ``eer``, ``min_dcf/{p}``, ``roc_auc``; docs/definitions.md) are those of the
positive distances :math:`-s^+` and the negative distances :math:`-s^-`, from the same exact machinery. The scores
read as calibrated log-likelihood ratios give

.. math::
    \mathrm{C_{llr}} = \frac{1}{2}\Big(\frac{1}{P}\sum_i \log_2(1 + e^{-s^+_i})
        + \frac{1}{N}\sum_j \log_2(1 + e^{s^-_j})\Big),

``min_cllr`` (the same after the best monotonic calibration, by pool-adjacent-violators) and ``act_dcf/{p}`` (the
normalised detection cost at the Bayes threshold :math:`\log\frac{C_{fa}(1 - p)}{C_{miss}\,p}`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch  # noqa: F401  (the examples' namespace)
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_choice, check_embeddings, check_positive_int_or_none
from torchmetrics_retrieval.functional._search.types import DISTANCES, Distance
from torchmetrics_retrieval.functional._trial_options import check_norm_options, normalised_scores, pooled_embeddings
from torchmetrics_retrieval.functional._trials import (
    TrialRequest,
    check_scores,
    check_trials,
    score_values,
    trial_scores,
)
from torchmetrics_retrieval.functional.score_norm import ScoreNorm

__all__ = ["FarRule", "score_metrics", "trial_metrics"]

#: How TAR@FAR is read: at the exact FMR quantile, or at the ROC point nearest the FAR (insightface's IJB tables).
FarRule = Literal["exact", "nearest_roc_point"]


def score_metrics(
    scores: Tensor,
    is_target: Tensor,
    *,
    fmr_vals: float | Iterable[float] = (),
    eer: bool = False,
    min_dcf_p_target: float | Iterable[float] = (),
    dcf_costs: tuple[float, float] = (1.0, 1.0),
    roc_auc: bool = False,
    cllr: bool = False,
    act_dcf_p_target: float | Iterable[float] = (),
    far_rule: FarRule = "exact",
) -> dict[str, Tensor]:
    r"""Verification values of given trial scores (a higher score means more alike), exact.

    The values the all-pairs path reports are its own, with distance = ``-score``: a threshold accepts the trials
    scoring at least it. ``cllr``, ``min_cllr`` and ``act_dcf/{p}`` read the scores as log-likelihood ratios
    (natural log); see the module docstring and docs/definitions.md.

    Args:
        scores: ``(T,)`` scores of the trials, any real dtype, finite.
        is_target: ``(T,)`` bool, which trials are targets; at least one target and one non-target.
        fmr_vals: FAR (= FMR) values in [0, 1]: return ``fnmr@fmr/{f}`` and ``tar@far/{f}``.
        eer: also return ``eer``, the equal error rate.
        min_dcf_p_target: target priors p in (0, 1): also return ``min_dcf/{p}``, the minimum normalised detection
            cost.
        dcf_costs: ``(C_miss, C_fa)``, positive, of ``min_dcf`` and ``act_dcf``.
        roc_auc: also return ``roc_auc``, the area under the ROC curve, ties counting one half.
        cllr: also return ``cllr`` and ``min_cllr`` (bits).
        act_dcf_p_target: target priors p in (0, 1): also return ``act_dcf/{p}``, the normalised detection cost at the
            Bayes threshold of the scores read as log-likelihood ratios.
        far_rule: ``"exact"``: TAR@FAR at the exact FMR quantile threshold, as everywhere in the package;
            ``"nearest_roc_point"``: TAR at the ROC point whose FAR is nearest ``f``, as insightface's IJB
            evaluation reads it (that point may lie above ``f``).

    Returns:
        ``{key: tensor}``: 0-dim float32 tensors on the scores' device, ``f`` and ``p`` printed as Python prints them.

    Raises:
        TypeError, ValueError: malformed scores or flags, no target or no non-target trial, an option out of range.

    Example:
        >>> scores = torch.tensor([2.0, 1.0, 0.5, -0.5, -1.0, -3.0])
        >>> is_target = torch.tensor([True, True, False, True, False, False])
        >>> out = score_metrics(scores, is_target, eer=True, roc_auc=True, cllr=True, act_dcf_p_target=0.5)
        >>> {key: round(value.item(), 4) for key, value in out.items()}
        {'eer': 0.3333, 'roc_auc': 0.8889, 'act_dcf/0.5': 0.6667, 'cllr': 0.6613, 'min_cllr': 0.3333}
    """
    request = TrialRequest.checked(
        fmr_vals, eer, min_dcf_p_target, dcf_costs, roc_auc, cllr, act_dcf_p_target, far_rule
    )
    return score_values(*check_scores(scores, is_target), request)


def trial_metrics(
    embeddings: Tensor,
    trials: tuple[Tensor, Tensor, Tensor],
    *,
    distance: Distance = "cosine",
    fmr_vals: float | Iterable[float] = (),
    eer: bool = False,
    min_dcf_p_target: float | Iterable[float] = (),
    dcf_costs: tuple[float, float] = (1.0, 1.0),
    roc_auc: bool = False,
    cllr: bool = False,
    act_dcf_p_target: float | Iterable[float] = (),
    far_rule: FarRule = "exact",
    chunk_size: int | None = None,
    score_norm: ScoreNorm | None = None,
    cohort: Tensor | None = None,
    top_n: int | None = None,
    embedding_ids: Tensor | None = None,
    cohort_ids: Tensor | None = None,
    template_ids: Tensor | None = None,
    media_ids: Tensor | None = None,
) -> dict[str, Tensor]:
    r"""Verification values of a trial list over embeddings: :func:`score_metrics` of the trials' scores.

    A trial's score is ``-distance`` between its two rows, the distance as the rest of the package defines it (for
    ``"cosine"``, ``cos - 1``), computed pair by pair in blocks of trials: never a matrix of every pair. When the
    trials are every labelled pair, the values are those of
    :func:`~torchmetrics_retrieval.functional.fnmr_at_fmr`.

    With ``template_ids`` (IJB-B/C), the embeddings are first pooled into one unit vector per template by
    :func:`~torchmetrics_retrieval.functional.pool_templates` (with ``media_ids``, each media counting once), and
    the trial indices are then **template ids**, not rows: ``enrol_index[i] = 7`` names the template of id 7, found
    in the sorted ids by ``searchsorted``. With ``score_norm``, the trial scores are normalised against ``cohort`` by
    :func:`~torchmetrics_retrieval.functional.normalize_scores` (``"z"``, ``"t"``, ``"s"``, or ``"as"`` over each
    side's ``top_n`` highest cohort scores) before any value is computed; the cohort scores are minus the same
    ``distance``, of the (pooled) trial embeddings against the rows of ``cohort`` as given.

    Args:
        embeddings: ``(N, D)`` floating embeddings, finite.
        trials: ``(enrol_index, test_index, is_target)``: two ``(T,)`` integer tensors of rows of ``embeddings``
            (of template ids with ``template_ids``) and a ``(T,)`` bool tensor; at least one target and one
            non-target trial.
        distance: ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"`` or ``"dot"``.
        fmr_vals: as :func:`score_metrics`.
        eer: as :func:`score_metrics`.
        min_dcf_p_target: as :func:`score_metrics`.
        dcf_costs: as :func:`score_metrics`.
        roc_auc: as :func:`score_metrics`.
        cllr: as :func:`score_metrics` (meaningful on calibrated scores only).
        act_dcf_p_target: as :func:`score_metrics` (meaningful on calibrated scores only).
        far_rule: as :func:`score_metrics`.
        chunk_size: trials whose scores are computed at once (default 65536); caps the blocks of the cohort
            scores too.
        score_norm: ``"z"``, ``"t"``, ``"s"`` or ``"as"``: normalise the trial scores against ``cohort`` first;
            None (default): the raw scores.
        cohort: ``(C, D)`` floating, finite, on the device of ``embeddings``: impostors of no trial's identity;
            required by ``score_norm``, refused without it. Pool cohort templates first if they are templates.
        top_n: int in ``[1, C]``: the cohort scores kept per side by ``score_norm="as"``; required by it.
        embedding_ids: ``(N,)`` integer identity of each row of ``embeddings`` (with ``template_ids``, the same
            within a template); with ``cohort_ids``, cohort items sharing an identity with a trial's embedding are
            counted in a ``UserWarning``. Only with ``score_norm``.
        cohort_ids: ``(C,)`` integer identity of each cohort item, given with ``embedding_ids``.
        template_ids: ``(N,)`` integer template id of each embedding: pool the templates first, the trials naming
            template ids.
        media_ids: ``(N,)`` integer media id of each embedding (within its template); only with ``template_ids``.

    Returns:
        ``{key: tensor}`` as :func:`score_metrics`.

    Raises:
        TypeError, ValueError: malformed embeddings or trials, an index out of range (a template id no embedding
            carries), an option out of range, ``cohort``, ``top_n``, ``embedding_ids`` or ``cohort_ids`` without
            ``score_norm``, ``score_norm`` without ``cohort``, ``media_ids`` without ``template_ids``, and a
            normalised score that is NaN (a side whose cohort scores are all equal).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
        >>> trials = (torch.tensor([0, 0, 2, 1]), torch.tensor([1, 2, 3, 3]), torch.tensor([True, False, True, False]))
        >>> trial_metrics(x, trials, fmr_vals=0.5, eer=True)
        {'fnmr@fmr/0.5': tensor(0.), 'tar@far/0.5': tensor(1.), 'eer': tensor(0.)}

        The same trials, AS-norm against a cohort of four, each side's two highest cohort scores:

        >>> cohort = torch.tensor([[0.6, -0.8], [-1.0, 0.0], [0.0, -1.0], [0.7, 0.7]])
        >>> out = trial_metrics(x, trials, eer=True, roc_auc=True, score_norm="as", cohort=cohort, top_n=2)
        >>> {key: round(value.item(), 4) for key, value in out.items()}
        {'eer': 0.0, 'roc_auc': 1.0}

        Templates: rows 0 and 1 form template 10, rows 2 and 3 template 20; the trials name template ids.

        >>> templates = (torch.tensor([10, 10]), torch.tensor([10, 20]), torch.tensor([True, False]))
        >>> trial_metrics(x, templates, eer=True, template_ids=torch.tensor([10, 10, 20, 20]))
        {'eer': tensor(0.)}
    """
    request = TrialRequest.checked(
        fmr_vals, eer, min_dcf_p_target, dcf_costs, roc_auc, cllr, act_dcf_p_target, far_rule
    )
    x = check_embeddings("embeddings", embeddings)
    check_choice("distance", distance, DISTANCES)
    check_positive_int_or_none("chunk_size", chunk_size)
    check_norm_options(score_norm, cohort, top_n, embedding_ids, cohort_ids)
    x, ids, embedding_ids = pooled_embeddings(x, template_ids, media_ids, embedding_ids)
    enrol, test, is_target = check_trials(trials, x.shape[0], x.device, ids)
    scores = trial_scores(x, enrol, test, distance, chunk_size)
    if score_norm is not None:
        assert cohort is not None  # check_norm_options
        options: dict[str, Any] = {"method": score_norm, "top_n": top_n, "distance": distance}
        options.update(chunk_size=chunk_size, embedding_ids=embedding_ids, cohort_ids=cohort_ids)
        scores = normalised_scores(scores, x, enrol, test, cohort, options)
    return score_values(scores, is_target, request)
