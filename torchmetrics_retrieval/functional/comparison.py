r"""Paired comparison of two models evaluated on the same queries.

Given per-query values :math:`a_i` and :math:`b_i` of one metric for models a and b (aligned by query,
:math:`i = 1..n`), everything is computed from the paired differences :math:`d_i = b_i - a_i`, in float64 on
the values' device:

* ``mean_a``, ``mean_b``, ``difference`` :math:`= \bar d = \bar b - \bar a`;
* ``ci_low``, ``ci_high``: percentile bootstrap interval of :math:`\bar d` (``n_resamples`` resamples of the
  :math:`d_i` with replacement, the ``(1 - c)/2`` and ``(1 + c)/2`` quantiles, numpy's linear rule;
  the helper of :mod:`torchmetrics_retrieval.functional._bootstrap`);
* ``p_value`` of a two-sided test of "no difference in mean" (below).

The tests:

* ``"paired_t"``: Student's paired t-test, :math:`t = \bar d / (s_d / \sqrt n)` with the sample standard deviation
  :math:`s_d` (``n - 1`` in its denominator), :math:`p = P(|T_{n-1}| \ge |t|)`, equal to
  ``scipy.stats.ttest_rel(b, a).pvalue``. The t distribution's tail is the regularised incomplete beta function
  :math:`I_{\nu/(\nu + t^2)}(\nu/2, 1/2)`, evaluated by its continued fraction (no scipy at run time).
  Zero variance (every :math:`d_i` equal; scipy returns NaN when they are all 0): a constant nonzero difference is
  an effect without any noise, the limit :math:`|t| \to \infty` of a shrinking spread, so ``p = 0``; identical
  inputs (every :math:`d_i = 0`) show no difference at all, so ``p = 1``, as both resampling tests give for them.
  Differences that are equal only up to rounding have a tiny variance and take the ordinary route.
* ``"randomization"``: Fisher's sign-flip randomization test. Under the null hypothesis the labels a and b of each
  query are exchangeable, so each :math:`d_i` is as likely as :math:`-d_i`. With ``n_resamples`` random sign
  vectors :math:`s` (``torch.Generator`` seeded with ``seed``), :math:`p = (1 + \#\{r : |\overline{s_r d}| \ge
  |\bar d|\}) / (1 + R)`. The ``+1`` counts the observed signs, one of the equally likely sign vectors under the
  null, so ``p`` is never 0 and :math:`P(p \le \alpha) \le \alpha` holds exactly under the null for any
  :math:`R` (Phipson & Smyth, 2010). ranx's ``"fisher"`` test (swapping a and b per query, which is the same
  flip) reports the plain proportion :math:`\#/R` instead (on the same draws the rules differ by less than
  :math:`1/(R + 1)`), and compares rounded means without tolerance, so on discrete per-query values (hits,
  fractions of k) it splits exact ties at random and can report less.
* ``"bootstrap"``: the paired bootstrap test (Efron & Tibshirani 1993, ch. 16: the one-sample test on the
  differences, with the data shifted to the null mean). The bootstrap means
  :math:`\bar d^*_r` (the same resamples as the interval) shifted by :math:`-\bar d` estimate the distribution
  of :math:`\bar d` under a null of mean zero; :math:`p = (1 + \#\{r : |\bar d^*_r - \bar d| \ge |\bar d|\}) /
  (1 + R)`, the ``+1`` as Davison & Hinkley (1997) write Monte-Carlo bootstrap p-values (never 0).

In both counts, values equal up to floating-point rounding (within :math:`4 n \epsilon \cdot \overline{|d|}`,
a bound of the rounding error of the sums) count as at least as extreme; an observed :math:`\bar d = 0`
gives ``p = 1``. Draws are made in blocks of ``(block, n)`` with ``block * n <= 2**22``: no loop over queries.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._bootstrap import (
    _block_sizes,
    _bootstrap_means,
    _quantiles,
    check_confidence_level,
    check_seed,
)
from torchmetrics_retrieval.functional._checks import check_choice, check_positive_int, check_same_length, describe

__all__ = ["COMPARISON_TESTS", "ComparisonTest", "compare_models"]

ComparisonTest = Literal["paired_t", "randomization", "bootstrap"]
COMPARISON_TESTS: tuple[str, ...] = ("paired_t", "randomization", "bootstrap")


def _check_per_query(name: str, value: Any) -> Tensor:
    """A 1-D floating tensor of at least two finite values."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D floating torch.Tensor of per-query values, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D of shape (n,), got {describe(value)}.")
    if not value.is_floating_point():
        raise TypeError(f"`{name}` must have a floating dtype, got {describe(value)}.")
    if value.shape[0] < 2:
        raise ValueError(f"`{name}` must hold at least 2 queries, got {describe(value)}.")
    if not bool(torch.isfinite(value).all()):
        n_bad = int((~torch.isfinite(value)).sum())
        raise ValueError(f"`{name}` must be finite, got NaN or inf in {n_bad} of {value.shape[0]} queries.")
    return value


def _check_ids(name: str, pair: Any) -> tuple[Tensor, Tensor]:
    """An ``(ids, values)`` pair: 1-D integer ids, distinct, one per value."""
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise TypeError(f"`{name}` must be an (ids, values) pair like the other model's, got {describe(pair)}.")
    ids, values = pair
    if not isinstance(ids, Tensor) or ids.ndim != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"`{name}` ids must be a 1-D integer torch.Tensor, got {describe(ids)}.")
    values = _check_per_query(name, values)
    check_same_length(name, ids, values.shape[0], f"{name} values")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError(f"`{name}` ids must be distinct, got {ids.numel() - torch.unique(ids).numel()} repeated.")
    return ids, values


def _aligned(per_query_a: Any, per_query_b: Any) -> tuple[Tensor, Tensor]:
    """Two models' ``(ids, values)`` pairs (``EmbeddingMetrics.per_query_values``) as values in one query order."""
    ids_a, a = _check_ids("per_query_a", per_query_a)
    ids_b, b = _check_ids("per_query_b", per_query_b)
    ids_a, order_a = torch.sort(ids_a)
    ids_b, order_b = torch.sort(ids_b.to(ids_a.device))
    if not torch.equal(ids_a, ids_b):
        only_a = int((~torch.isin(ids_a, ids_b)).sum())
        only_b = int((~torch.isin(ids_b, ids_a)).sum())
        raise ValueError(
            f"`per_query_b` must cover the queries of `per_query_a`, got {only_a} ids only in `per_query_a` and "
            f"{only_b} only in `per_query_b`: evaluate both models on the same queries (and the same "
            "empty_target_action)."
        )
    return a[order_a], b[order_b]


def _compare_models_tensor_validation(per_query_a: Any, per_query_b: Any) -> tuple[Tensor, Tensor]:
    if isinstance(per_query_a, tuple) or isinstance(per_query_b, tuple):
        per_query_a, per_query_b = _aligned(per_query_a, per_query_b)
    a = _check_per_query("per_query_a", per_query_a)
    b = _check_per_query("per_query_b", per_query_b)
    check_same_length("per_query_b", b, a.shape[0], "per_query_a")
    if b.device != a.device:
        raise ValueError(f"`per_query_b` must be on the device of `per_query_a` ({a.device}), got {b.device}.")
    return a, b


def _compare_models_arg_validation(test: Any, confidence_level: Any, n_resamples: Any, seed: Any) -> None:
    check_choice("test", test, COMPARISON_TESTS)
    check_confidence_level("confidence_level", confidence_level)
    check_positive_int("n_resamples", n_resamples)
    check_seed("seed", seed)


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), converging for
    ``x < (a + 1) / (a + b + 2)`` in about ``sqrt(max(a, b))`` steps: ``I_x(a, b) = front * cf / a``."""
    tiny = 1e-300

    def away_from_zero(value: float) -> float:
        return value if abs(value) > tiny else tiny

    c = 1.0
    d = 1.0 / away_from_zero(1.0 - (a + b) * x / (a + 1.0))
    fraction = d
    for m in range(1, 200 + int(20 * math.sqrt(max(a, b)))):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for term in (even, odd):
            d = 1.0 / away_from_zero(1.0 + term * d)
            c = away_from_zero(1.0 + term / c)
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return fraction


def _two_sided_t_p_value(t: float, df: int) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom: ``I_x(df/2, 1/2)``, ``x = df/(df + t^2)``;
    from ``1 - I_{1-x}(1/2, df/2)`` where the fraction of ``x`` would converge slowly."""
    t2 = t * t
    if t2 == 0.0:
        return 1.0
    if math.isinf(t2):
        return 0.0
    a, b = df / 2.0, 0.5
    log_x = -math.log1p(t2 / df)  # log(df / (df + t^2)), accurate for small t
    log_y = math.log(t2) - math.log(df + t2)  # log(t^2 / (df + t^2)), accurate for large t
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * log_x + b * log_y)
    x = math.exp(log_x)
    if x < (a + 1.0) / (a + b + 2.0):
        p = front * _beta_continued_fraction(a, b, x) / a
    else:
        p = 1.0 - front * _beta_continued_fraction(b, a, math.exp(log_y)) / b
    return min(max(p, 0.0), 1.0)


def _paired_t_p_value(d: Tensor) -> float:
    """Two-sided p-value of the paired t-test of float64 differences ``d`` (zero variance: see the module)."""
    n = d.shape[0]
    mean, var = float(d.mean()), float(d.var(correction=1))
    if var == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return _two_sided_t_p_value(mean / math.sqrt(var / n), n - 1)


def _tie_tolerance(d: Tensor) -> float:
    """Bound of the rounding error of a mean of ``+-d`` (any summation order), for counting ties as extreme."""
    return 4.0 * d.shape[0] * torch.finfo(torch.float64).eps * float(d.abs().mean())


def _randomization_p_value(d: Tensor, n_resamples: int, seed: int) -> float:
    """Sign-flip randomization p-value ``(1 + #{|mean(s * d)| >= |mean(d)|}) / (1 + R)`` of float64 ``d``."""
    n = d.shape[0]
    threshold = abs(float(d.mean())) - _tie_tolerance(d)
    generator = torch.Generator().manual_seed(seed)
    extreme = 0
    for block in _block_sizes(n, n_resamples):
        bits = torch.randint(2, (block, n), generator=generator, dtype=torch.float64).to(d.device)
        flipped = (2.0 * bits - 1.0) @ d / n
        extreme += int((flipped.abs() >= threshold).sum())
    return (1 + extreme) / (1 + n_resamples)


def _bootstrap_p_value(d: Tensor, bootstrap_means: Tensor) -> float:
    """Paired bootstrap p-value ``(1 + #{|m* - mean(d)| >= |mean(d)|}) / (1 + R)`` from the resampled means."""
    observed = float(d.mean())
    extreme = int(((bootstrap_means - observed).abs() >= abs(observed) - _tie_tolerance(d)).sum())
    return (1 + extreme) / (1 + bootstrap_means.shape[0])


def compare_models(
    per_query_a: Tensor | tuple[Tensor, Tensor],
    per_query_b: Tensor | tuple[Tensor, Tensor],
    *,
    test: ComparisonTest = "paired_t",
    confidence_level: float = 0.95,
    n_resamples: int = 10000,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Compare two models on the same queries: means, bootstrap interval of the difference, two-sided p-value.

    The definitions and the p-value rules are in the module's docstring. Inputs are torch tensors only (a numpy
    array is a ``TypeError``; ``torch.from_numpy`` converts one). Results are deterministic for a seed: the
    random draws come from a CPU generator whatever the device.

    Args:
        per_query_a: ``(n,)`` finite floating values of model a, one per query, ``n >= 2``; or an ``(ids, values)``
            pair (``EmbeddingMetrics.per_query_values``), then aligned with ``per_query_b``'s by id.
        per_query_b: ``(n,)`` values of model b on the same queries in the same order, on the same device; or
            an ``(ids, values)`` pair with the same ids (in any order).
        test: ``"paired_t"``, ``"randomization"`` or ``"bootstrap"``.
        confidence_level: coverage of the interval, in (0, 1).
        n_resamples: number of bootstrap resamples (the interval, the bootstrap test) and of random sign vectors
            (the randomization test), >= 1.
        seed: seed of the draws, an int >= 0.

    Returns:
        A dict of 0-dim tensors ``mean_a``, ``mean_b``, ``difference`` (b - a), ``ci_low``, ``ci_high`` and
        ``p_value``, in the promoted dtype of the inputs (``p_value`` always float64, which does not underflow to 0
        for the tiny p-values of thousands of queries) and on their device.

    Example:
        >>> a = torch.tensor([0.50, 0.20, 0.70, 0.40, 0.90, 0.30, 0.60, 0.80])
        >>> b = torch.tensor([0.60, 0.35, 0.70, 0.55, 0.95, 0.30, 0.75, 0.85])
        >>> result = compare_models(a, b)
        >>> {key: round(value.item(), 4) for key, value in result.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'mean_a': 0.55, 'mean_b': 0.6313, 'difference': 0.0813, 'ci_low': 0.0375, 'ci_high': 0.125,
         'p_value': 0.0096}
        >>> round(compare_models(a, b, test="randomization")["p_value"].item(), 4)
        0.0283
        >>> compare_models(a, a)["p_value"]  # identical models: no evidence of a difference
        tensor(1., dtype=torch.float64)
    """
    a, b = _compare_models_tensor_validation(per_query_a, per_query_b)
    _compare_models_arg_validation(test, confidence_level, n_resamples, seed)
    d = b.to(torch.float64) - a.to(torch.float64)
    bootstrap_means = _bootstrap_means(d[:, None], n_resamples, seed)
    low, high = _quantiles(bootstrap_means, confidence_level)
    if test == "paired_t":
        p_value = _paired_t_p_value(d)
    elif test == "randomization":
        p_value = _randomization_p_value(d, n_resamples, seed)
    else:
        p_value = _bootstrap_p_value(d, bootstrap_means[:, 0])
    dtype = torch.promote_types(a.dtype, b.dtype)
    result = {
        "mean_a": a.to(torch.float64).mean(),
        "mean_b": b.to(torch.float64).mean(),
        "difference": d.mean(),
        "ci_low": low[0],
        "ci_high": high[0],
        "p_value": torch.tensor(p_value, dtype=torch.float64, device=a.device),
    }
    # the p-value stays float64: float32 underflows to 0 below about 1e-45 (paired t on thousands of queries)
    return {key: value if key == "p_value" else value.to(dtype) for key, value in result.items()}
