r"""Verification metrics on pairs: FNMR@FMR, TAR@FAR and the DET curve, exact and streaming.

Pairs (see docs/definitions.md): for every query ``q`` and every gallery item ``g`` of its gallery ``G(q)``
(``q`` itself, items of its sequence and of other search groups removed), the ordered pair ``(q, g)``
is *positive* when the labels match and *negative* otherwise; the pairs of a query without any
relevant item are therefore all negatives. With :math:`v` the negative and :math:`u` the positive
distances,

.. math::
    T_f = Q_v(f) \quad\text{(numpy's default linear interpolation)}, \qquad
    \mathrm{FNMR@FMR}{=}f = \frac{\#\{i : u_i \ge T_f\}}{\#u}, \qquad \mathrm{TAR@FAR}{=}f = 1 - \mathrm{FNMR@FMR}{=}f.

The value is exact, and no pair is materialised: the distance matrix is streamed block by block twice
(``functional._pairs.quantiles``). Memory is one distance block plus histograms and the distinct values collected
near the thresholds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_callable,
    check_choice,
    check_fractions,
    check_positive_int_or_none,
    describe,
)
from torchmetrics_retrieval.functional._pairs.passes import PairPasses
from torchmetrics_retrieval.functional._pairs.quantiles import (
    Curve,
    PairBlock,
    PairBuckets,
    PairSource,
    Statistics,
    curve,
    statistics,
)
from torchmetrics_retrieval.functional._pairs.rates import RateRequest
from torchmetrics_retrieval.functional._search.keys import largest_norm
from torchmetrics_retrieval.functional._search.types import DISTANCES, Distance
from torchmetrics_retrieval.functional._sets import PairedIds, QueryGallery, split_query_gallery
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn

if TYPE_CHECKING:
    from torchmetrics_retrieval.functional._options import RetrievalOptions

__all__ = ["DEFAULT_FMR_GRID", "det_curve", "fnmr_at_fmr", "fnmr_at_fmr_from_distances"]

#: FMR values of :func:`det_curve` when no grid is given: 51 points, log-spaced from 1e-5 to 1.
DEFAULT_FMR_GRID: tuple[float, ...] = tuple(10.0 ** (-5 + i / 10) for i in range(51))


# ----------------------------------------------------------------------------------------------------------------------
# sources of pairs
# ----------------------------------------------------------------------------------------------------------------------


def _check_distances(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D torch.Tensor of distances, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(value)}.")
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"`{name}` must have a real dtype, got {describe(value)}.")
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"`{name}` must be finite, got NaN or inf in {describe(value)}.")
    return value


def _given_distances(positive: Tensor, negative: Tensor) -> tuple[PairSource, PairBuckets]:
    dtype = torch.promote_types(torch.promote_types(positive.dtype, negative.dtype), torch.float32)
    if not dtype.is_floating_point:
        dtype = torch.float64
    pos, neg = positive.to(dtype), negative.to(dtype)
    both = torch.cat([pos, neg])
    buckets = PairBuckets.spanning(float(both.min()), float(both.max())) if both.numel() else PairBuckets(0.0, 1.0)

    def source() -> Iterator[PairBlock]:
        yield PairBlock(pos, torch.ones_like(pos, dtype=torch.bool), None)
        yield PairBlock(neg, torch.zeros_like(neg, dtype=torch.bool), None)

    return source, buckets


def _distance_bounds(query: Tensor, gallery: Tensor, distance: str) -> tuple[float, float]:
    """Bounds of every distance by the Cauchy-Schwarz inequality (rounding may cross them: buckets clamp)."""
    if distance == "cosine":
        return 0.0, 2.0
    return _bounds_of_norms(largest_norm(query), largest_norm(gallery), distance)


def _bounds_of_norms(q_max: float, g_max: float, distance: str) -> tuple[float, float]:
    """:func:`_distance_bounds` from the largest query and gallery norms."""
    if distance == "cosine":
        return 0.0, 2.0
    if distance == "euclidean":
        return 0.0, q_max + g_max
    if distance == "sqeuclidean":
        return 0.0, (q_max + g_max) ** 2
    return -q_max * g_max, q_max * g_max


#: The arguments of :func:`fnmr_at_fmr` and :func:`det_curve` that describe the query and gallery sets.
_SET_ARGUMENTS = (
    "query",
    "query_labels",
    "gallery",
    "gallery_labels",
    "is_query",
    "is_gallery",
    "sequence_ids",
    "search_groups",
)


def _checked_problem(arguments: Mapping[str, Any]) -> QueryGallery:
    """The one check of the inputs of :func:`fnmr_at_fmr` and :func:`det_curve`, given by name as they name them
    (their ``locals()``): ``distance``, ``label_comparison_fn``, ``chunk_size`` and the sets (a missing one: None)."""
    check_choice("distance", arguments["distance"], DISTANCES)
    check_callable("label_comparison_fn", arguments["label_comparison_fn"])
    check_positive_int_or_none("chunk_size", arguments["chunk_size"])
    sets: dict[str, Any] = {name: arguments.get(name) for name in _SET_ARGUMENTS}
    return split_query_gallery(**sets)


def pair_curve(
    qg: QueryGallery,
    fractions: tuple[float, ...],
    distance: str,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
) -> Curve:
    """Thresholds and FNMR at the FMR values ``fractions`` over every pair of a checked problem."""
    buckets = PairBuckets.spanning(*_distance_bounds(qg.query, qg.gallery, distance))
    return curve(PairPasses(qg, distance, label_comparison_fn, chunk_size), buckets, fractions, qg.query.device)


class PairRequest(NamedTuple):
    """The pair metrics asked for (``fmr_vals``, the ``rates``, ``roc_auc``) and the rules of the pairs: what
    :func:`pair_metrics` and its sharded twin (``metrics._sharded.pairs``) take, built from a
    :class:`RetrievalOptions` in one place (:meth:`of`)."""

    fmr_vals: tuple[float, ...]
    rates: RateRequest
    distance: str
    label_comparison_fn: LabelComparisonFn | None
    chunk_size: int | None
    roc_auc: bool = False

    @classmethod
    def of(cls, options: RetrievalOptions) -> PairRequest:
        """The pair metrics that ``options`` ask for."""
        rates = RateRequest(options.eer, options.min_dcf_p_target, options.dcf_costs)
        rules = (options.distance, options.label_comparison_fn, options.chunk_size)
        return cls(options.fmr_vals, rates, *rules, options.roc_auc)

    @property
    def needs_statistics(self) -> bool:
        """Whether a value comes from the statistics passes (every metric but ``roc_auc``)."""
        return bool(self.fmr_vals or self.rates.eer or self.rates.p_targets)


def pair_metrics(qg: QueryGallery, request: PairRequest) -> dict[str, Tensor]:
    """``fnmr@fmr/{f}``, ``tar@far/{f}``, ``eer`` and ``min_dcf/{p}`` (float32, 0-dim) of a checked problem, from
    the same passes over every pair; ``roc_auc`` from its own pass (``functional._pairs.auc``), with the positive pairs'
    distances the first passes listed, if they did."""
    fmr_vals, rates, distance, label_comparison_fn, chunk_size, roc_auc = request
    out: dict[str, Tensor] = {}
    listed = None
    if request.needs_statistics:
        source = PairPasses(qg, distance, label_comparison_fn, chunk_size)
        found = _pair_statistics(qg, fmr_vals, rates, distance, label_comparison_fn, chunk_size, source)
        out.update(statistics_keys(found, fmr_vals))
        listed = source.listed_positives
    if roc_auc:
        from torchmetrics_retrieval.functional._pairs.auc import roc_auc_of_pairs

        out["roc_auc"] = roc_auc_of_pairs(qg, distance, label_comparison_fn, chunk_size, listed).to(torch.float32)
    return out


def statistics_keys(found: Statistics, fmr_vals: tuple[float, ...]) -> dict[str, Tensor]:
    """``fnmr@fmr/{f}``, ``tar@far/{f}``, ``eer`` and ``min_dcf/{p}`` (float32, 0-dim) of the passes' statistics."""
    fnmr = found.curve.fnmr.to(torch.float32)
    out = {f"fnmr@fmr/{f}": fnmr[i] for i, f in enumerate(fmr_vals)}
    out.update({f"tar@far/{f}": 1 - fnmr[i] for i, f in enumerate(fmr_vals)})
    out.update({key: value.to(torch.float32) for key, value in found.rates.items()})
    return out


def _pair_statistics(
    qg: QueryGallery,
    fmr_vals: tuple[float, ...],
    request: RateRequest,
    distance: str,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
    source: PairPasses | None = None,
) -> Statistics:
    """The statistics of every pair of ``qg``, read by ``source`` (default: a new ``PairPasses``)."""
    buckets = PairBuckets.spanning(*_distance_bounds(qg.query, qg.gallery, distance))
    if source is None:
        source = PairPasses(qg, distance, label_comparison_fn, chunk_size)
    return statistics(source, buckets, fmr_vals, request, qg.query.device)


def _operating_points(query: Tensor, query_labels: Tensor, request: RateRequest, **options: Any) -> dict[str, Tensor]:
    """``(FMR, FNMR)`` where ``eer`` and each ``min_dcf/{p}`` of ``request`` are reached (the markers of the DET
    plot of ``FNMRAtFMR``); ``options`` as :func:`fnmr_at_fmr`'s (already checked)."""
    qg = _checked_problem({"query": query, "query_labels": query_labels, **options})
    distance, fn, chunk = options["distance"], options["label_comparison_fn"], options["chunk_size"]
    return _pair_statistics(qg, (), request, distance, fn, chunk).points


# ----------------------------------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------------------------------


def fnmr_at_fmr_from_distances(
    pos_dist: Tensor, neg_dist: Tensor, fmr_vals: float | Iterable[float] = (0.1,)
) -> Tensor:
    r"""FNMR at given FMR values from the distances of positive and negative pairs.

    :math:`T_f` is the ``f``-quantile of ``neg_dist`` (numpy's linear interpolation) and the value is the
    fraction of ``pos_dist`` that is ``>= T_f``. Same algorithm as :func:`fnmr_at_fmr`.

    Args:
        pos_dist: ``(P,)`` distances of the positive pairs (any real dtype, finite).
        neg_dist: ``(M,)`` distances of the negative pairs.
        fmr_vals: FMR values in [0, 1].

    Returns:
        ``(len(fmr_vals),)`` float32 tensor; NaN with a warning when ``P = 0`` or ``M = 0``.

    Example:
        >>> pos = torch.tensor([0, 0, 1, 1, 2, 2, 5, 5, 9, 9])
        >>> neg = torch.tensor([3, 3, 4, 4, 6, 6, 7, 7, 8, 8])
        >>> fnmr_at_fmr_from_distances(pos, neg, fmr_vals=(0.1, 0.5))
        tensor([0.4000, 0.2000])
    """
    fractions = check_fractions("fmr_vals", fmr_vals)
    pos = _check_distances("pos_dist", pos_dist)
    neg = _check_distances("neg_dist", neg_dist).to(pos.device)
    source, buckets = _given_distances(pos, neg)
    return curve(source, buckets, fractions, pos.device).fnmr.to(torch.float32)


def fnmr_at_fmr(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    fmr_vals: float | Iterable[float] = (0.1,),
    eer: bool = False,
    min_dcf_p_target: float | Iterable[float] = (),
    dcf_costs: tuple[float, float] = (1.0, 1.0),
    roc_auc: bool = False,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    distance: Distance = "euclidean",
    label_comparison_fn: LabelComparisonFn | None = None,
    chunk_size: int | None = None,
) -> dict[str, Tensor]:
    r"""FNMR@FMR and TAR@FAR over all (query, gallery) pairs, exact, without materialising the pairs.

    See the module docstring for the definition of the pairs and of the values. The query and gallery
    sets are described as in :func:`~torchmetrics_retrieval.functional.retrieval.retrieval_metrics`:
    with ``gallery=None`` the first pair of arguments is the whole set and ``is_query`` /
    ``is_gallery`` (missing: all True) select the queries and gallery items, a sample never being
    paired with itself; otherwise ``(query, query_labels)`` and ``(gallery, gallery_labels)`` are two
    separate sets, and ``sequence_ids`` / ``search_groups`` are ``(query_side, gallery_side)`` pairs.

    Args:
        query: ``(Q, D)`` embeddings (or the whole set when ``gallery`` is None).
        query_labels: ``(Q,)`` or ``(Q, L)`` labels, any dtype.
        gallery: ``(G, D)`` embeddings or None.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels, with ``gallery``.
        fmr_vals: FMR values in [0, 1].
        eer: also return ``eer``, the equal error rate.
        min_dcf_p_target: target priors p in (0, 1): also return ``min_dcf/{p}``, the minimum normalised detection
            cost (docs/definitions.md).
        dcf_costs: ``(C_miss, C_fa)``, positive, of the detection cost.
        roc_auc: also return ``roc_auc``, the area under the ROC curve (TAR against FAR), ties counting one half.
        is_query: ``(N,)`` bool, which samples are queries (``gallery=None`` only).
        is_gallery: ``(N,)`` bool, which samples are gallery items (``gallery=None`` only).
        sequence_ids: pairs of the same sequence are left out.
        search_groups: only pairs of the same group are formed.
        distance: ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"`` or ``"dot"``.
        label_comparison_fn: custom label match, ``fn(query_labels[:, None], gallery_labels[None, :])``.
        chunk_size: largest side of a block of the distance matrix.

    Returns:
        ``{"fnmr@fmr/{f}": tensor, ..., "tar@far/{f}": tensor, ...}``: 0-dim float32 tensors, ``f``
        printed as Python prints it. NaN with a warning when there is no positive or no negative pair.

    Raises:
        TypeError, ValueError: malformed inputs, an FMR value outside [0, 1].

    Example:
        >>> # leave-one-out: positive distances (1, 1, 4, 4), negative (2, 2, 3, 3, 6, 6, 7, 7)
        >>> x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
        >>> fnmr_at_fmr(x, torch.tensor([0, 0, 1, 1]), fmr_vals=(0.1, 0.5))
        {'fnmr@fmr/0.1': tensor(0.5000), 'fnmr@fmr/0.5': tensor(0.),
         'tar@far/0.1': tensor(0.5000), 'tar@far/0.5': tensor(1.)}
        >>> # roc_auc: of the 4 x 8 (positive, negative) couples, 24 have the positive closer (each 1 below all 8)
        >>> fnmr_at_fmr(x, torch.tensor([0, 0, 1, 1]), fmr_vals=(), roc_auc=True)
        {'roc_auc': tensor(0.7500)}
    """
    fractions = check_fractions("fmr_vals", fmr_vals)
    request = RateRequest.checked(eer, min_dcf_p_target, dcf_costs)
    with_auc = check_bool("roc_auc", roc_auc)
    qg = _checked_problem(locals())
    return pair_metrics(qg, PairRequest(fractions, request, distance, label_comparison_fn, chunk_size, with_auc))


def det_curve(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    fmr_grid: Iterable[float] = DEFAULT_FMR_GRID,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    distance: Distance = "euclidean",
    label_comparison_fn: LabelComparisonFn | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Points of the DET curve (FNMR against FMR) on a grid of FMR values, for plotting.

    Same inputs and pairs as :func:`fnmr_at_fmr`; one point per grid value ``f``: the threshold
    :math:`T_f` (the ``f``-quantile of the negative distances) and FNMR at it. TAR against FAR (the ROC
    curve) is ``(fmr, 1 - fnmr)``.

    Returns:
        ``(fmr, fnmr, thresholds)``, three ``(len(fmr_grid),)`` float64 tensors, ``fmr`` the grid.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
        >>> fmr, fnmr, thresholds = det_curve(x, torch.tensor([0, 0, 1, 1]), fmr_grid=(0.0, 0.5, 1.0))
        >>> fnmr.tolist(), thresholds.tolist()
        ([0.5, 0.0, 0.0], [2.0, 4.5, 7.0])
    """
    fractions = check_fractions("fmr_grid", fmr_grid)
    qg = _checked_problem(locals())
    points = pair_curve(qg, fractions, distance, label_comparison_fn, chunk_size)
    fmr = torch.tensor(fractions, dtype=torch.float64, device=qg.query.device)
    return fmr, points.fnmr, points.thresholds
