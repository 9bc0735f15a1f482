"""``RetrievalOptions``: every option of :func:`retrieval_metrics`, declared once with its check and help.

Each field carries in its metadata an :class:`OptionKind` (how its value is checked and normalised, and how the
command line reads it) and a one-line help text. :meth:`RetrievalOptions.create` loops over the fields, and
``EmbeddingMetrics``, the command line and the compat adapters read the same fields, so a new option is one
field here plus the code that computes it. The entry points (``retrieval_metrics``, ``EmbeddingMetrics``,
``CrossModalRetrieval``, ``FNMRAtFMR``) list the options as typed keyword parameters, so that editors and mypy
know them, and hand them to :meth:`RetrievalOptions.from_arguments`; tests/test_signatures.py keeps those lists
(and :class:`OptionArguments`) in step with the fields.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, TypedDict

from torchmetrics_retrieval.functional._bootstrap import check_confidence_level, check_seed
from torchmetrics_retrieval.functional._checks import (
    check_bool,
    check_callable,
    check_choice,
    check_costs,
    check_fractions,
    check_open_fractions,
    check_positive_int,
    check_positive_int_or_none,
    check_str,
    check_top_k,
)
from torchmetrics_retrieval.functional.ranking import PrecisionMode
from torchmetrics_retrieval.functional.reduction import EMPTY_TARGET_ACTIONS, EmptyTargetAction
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.search import (
    BACKENDS,
    DISTANCES,
    SEARCH_PRECISIONS,
    Distance,
    KNNBackend,
    SearchPrecision,
)

if sys.version_info >= (3, 11):  # the type of the ``**kwargs`` of the entry points, with a TypedDict
    from typing import Unpack
else:  # pragma: no cover
    from typing_extensions import Unpack

__all__ = ["OptionArguments", "OptionKind", "RetrievalOptions", "Unpack", "check_option", "option_fields"]


@dataclass(frozen=True)
class OptionKind:
    """How an option's value is checked and normalised.

    Attributes:
        name: ``"cutoffs"``, ``"fractions"``, ``"bool"``, ``"choice"``, ``"positive_int_or_none"``,
            ``"callable_or_none"``, ``"level_or_none"``, ``"positive_int"``, ``"seed"``, ``"costs"``, ``"str"`` or
            ``"str_or_none"`` (the command line picks its argument type by it).
        check: ``check(option_name, value)`` returns the normalised value or raises ``TypeError``/``ValueError``
            naming the option.
        choices: the allowed values of a ``"choice"``.
        accepts: the annotation of the parameters that take the option, where it is wider than the field's type
            (a cutoff is given as one int or any iterable of ints, and stored as a tuple); empty: the field's type.
    """

    name: str
    check: Callable[[str, Any], Any]
    choices: tuple[Any, ...] = ()
    accepts: str = ""


def _check_factory_or_none(name: str, value: Any) -> str | None:
    """A faiss ``index_factory`` string (checked against faiss when the index is built, once D is known)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TypeError(f"`{name}` must be None or a faiss index_factory string like 'IVF1024,Flat', got {value!r}.")
    return value


def _check_level_or_none(name: str, value: Any) -> float | None:
    return None if value is None else check_confidence_level(name, value)


def _choice(choices: tuple[Any, ...]) -> OptionKind:
    return OptionKind("choice", lambda name, value: check_choice(name, value, choices), choices)


CUTOFFS = OptionKind("cutoffs", check_top_k, accepts="int | Iterable[int]")
FRACTIONS = OptionKind("fractions", check_fractions, accepts="float | Iterable[float]")
BOOL = OptionKind("bool", check_bool)
POSITIVE_INT_OR_NONE = OptionKind("positive_int_or_none", check_positive_int_or_none)
CALLABLE_OR_NONE = OptionKind("callable_or_none", check_callable)
LEVEL_OR_NONE = OptionKind("level_or_none", _check_level_or_none)
OPEN_FRACTIONS = OptionKind("fractions", check_open_fractions, accepts=FRACTIONS.accepts)
COSTS = OptionKind("costs", check_costs)
POSITIVE_INT = OptionKind("positive_int", check_positive_int)
SEED = OptionKind("seed", check_seed)
DISTANCE = _choice(DISTANCES)
PRECISION_MODE = _choice(("min_k_n", "standard"))
EMPTY_TARGET_ACTION = _choice(EMPTY_TARGET_ACTIONS)
KNN_BACKEND = _choice(BACKENDS)
STR = OptionKind("str", check_str)
FACTORY_OR_NONE = OptionKind("str_or_none", _check_factory_or_none)
SEARCH_PRECISION = _choice(SEARCH_PRECISIONS)


def _spec(kind: OptionKind, help_text: str) -> dict[str, Any]:
    """The metadata of an option's field."""
    return {"kind": kind, "help": help_text}


@dataclass(frozen=True)
class RetrievalOptions:
    """Validated options of :func:`retrieval_metrics` (also held by ``EmbeddingMetrics``).

    Build it with :meth:`create`, which checks every option and names the bad one. The help of each option
    is in its field's metadata (``option_fields()`` lists them).

    Example:
        >>> options = RetrievalOptions.create(cmc_top_k=(5, 1, 5), fmr_vals=0.1)
        >>> options.cmc_top_k, options.fmr_vals
        ((1, 5), (0.1,))
        >>> RetrievalOptions.create(distance="manhattan")
        Traceback (most recent call last):
            ...
        ValueError: `distance` must be one of ('euclidean', 'sqeuclidean', 'cosine', 'dot'), got 'manhattan'.
    """

    cmc_top_k: tuple[int, ...] = field(default=(1, 5), metadata=_spec(CUTOFFS, "cutoffs k of cmc@k"))
    precision_top_k: tuple[int, ...] = field(default=(5,), metadata=_spec(CUTOFFS, "cutoffs k of precision@k"))
    map_top_k: tuple[int, ...] = field(default=(5,), metadata=_spec(CUTOFFS, "cutoffs k of map@k"))
    recall_top_k: tuple[int, ...] = field(default=(), metadata=_spec(CUTOFFS, "cutoffs k of recall@k"))
    ndcg_top_k: tuple[int, ...] = field(default=(), metadata=_spec(CUTOFFS, "cutoffs k of ndcg@k"))
    map_at_r: bool = field(default=False, metadata=_spec(BOOL, "MAP@R"))
    r_precision: bool = field(default=False, metadata=_spec(BOOL, "R-precision"))
    mrr: bool = field(default=False, metadata=_spec(BOOL, "mean reciprocal rank over the full ranking"))
    map_full: bool = field(default=False, metadata=_spec(BOOL, "full-ranking mean average precision (key `map`)"))
    minp: bool = field(
        default=False, metadata=_spec(BOOL, "mean inverse negative penalty: n(q) / rank of the last relevant item")
    )
    clustering: bool = field(default=False, metadata=_spec(BOOL, "NMI and AMI of a k-means clustering"))
    fmr_vals: tuple[float, ...] = field(
        default=(), metadata=_spec(FRACTIONS, "FMR values in [0, 1] of fnmr@fmr and tar@far")
    )
    eer: bool = field(default=False, metadata=_spec(BOOL, "equal error rate over every pair"))
    roc_auc: bool = field(default=False, metadata=_spec(BOOL, "area under the ROC curve over every pair (exact)"))
    min_dcf_p_target: tuple[float, ...] = field(
        default=(), metadata=_spec(OPEN_FRACTIONS, "target priors p in (0, 1) of min_dcf/{p} over every pair")
    )
    dcf_costs: tuple[float, float] = field(
        default=(1.0, 1.0), metadata=_spec(COSTS, "costs (C_miss, C_fa) of the detection cost of min_dcf")
    )
    fpir_vals: tuple[float, ...] = field(
        default=(), metadata=_spec(FRACTIONS, "FPIR values in [0, 1] of open-set dir@fpir and fnir@fpir")
    )
    pcf_variance: tuple[float, ...] = field(
        default=(), metadata=_spec(FRACTIONS, "explained-variance fractions in [0, 1] of pcf")
    )
    distance: Distance = field(default="euclidean", metadata=_spec(DISTANCE, "distance between embeddings"))
    normalize: bool = field(default=False, metadata=_spec(BOOL, "L2-normalise the embeddings first"))
    precision_mode: PrecisionMode = field(
        default="min_k_n", metadata=_spec(PRECISION_MODE, "precision@k divides by min(k, n(q)) or by k")
    )
    empty_target_action: EmptyTargetAction = field(
        default="skip", metadata=_spec(EMPTY_TARGET_ACTION, "what a query without a relevant item counts as")
    )
    avg_of_avgs: bool = field(default=False, metadata=_spec(BOOL, "average per query label first, then over labels"))
    per_class: bool = field(default=False, metadata=_spec(BOOL, "also report every ranking key per query label"))
    label_comparison_fn: LabelComparisonFn | None = field(
        default=None,
        compare=False,  # left out of ==: a function compares by identity
        metadata=_spec(CALLABLE_OR_NONE, "custom relevance fn(query_labels[:, None], gallery_labels[None])"),
    )
    confidence_level: float | None = field(
        default=None,
        metadata=_spec(LEVEL_OR_NONE, "percentile-bootstrap interval of every ranking key ({key}/ci_low, /ci_high)"),
    )
    n_bootstrap: int = field(default=1000, metadata=_spec(POSITIVE_INT, "bootstrap resamples of the intervals"))
    seed: int = field(default=0, metadata=_spec(SEED, "seed of the bootstrap resamples"))
    knn_backend: KNNBackend = field(default="auto", metadata=_spec(KNN_BACKEND, "kNN backend"))
    search_precision: SearchPrecision = field(
        default="auto",
        metadata=_spec(SEARCH_PRECISION, "products of the kNN search's candidate pass (values never depend on it)"),
    )
    chunk_size: int | None = field(
        default=None, metadata=_spec(POSITIVE_INT_OR_NONE, "rows per distance block (None: from a memory budget)")
    )
    progress: bool = field(
        default=False,
        compare=False,  # how a call reports, not what it computes
        metadata=_spec(BOOL, "progress bars (tqdm, on stderr) on the passes that take more than a second"),
    )
    # approximate evaluation with an exact audit (functional/_approximate.py)
    approximate_index: str | None = field(
        default=None,
        metadata=_spec(FACTORY_OR_NONE, "faiss index_factory string of an approximate index (None: exact search)"),
    )
    approximate_params: str = field(
        default="", metadata=_spec(STR, "faiss search parameters of that index, e.g. nprobe=32")
    )
    audit_queries: int = field(
        default=2000, metadata=_spec(POSITIVE_INT, "queries of the exact audit of an approximate index")
    )

    @classmethod
    def create(cls, **options: Any) -> RetrievalOptions:
        """Validate ``options`` (the keyword arguments of :func:`retrieval_metrics`)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"Unknown option(s) {unknown}; the options are {sorted(known)}.")
        values = {name: f.metadata["kind"].check(name, options.get(name, f.default)) for name, f in known.items()}
        if values["avg_of_avgs"] and values["per_class"]:
            raise ValueError("`avg_of_avgs` and `per_class` cannot both be True, got both True.")
        return cls(**values)

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> RetrievalOptions:
        """:meth:`create` from the arguments of an entry point that lists the options as its parameters.

        Pass ``locals()`` as the first statement of its body: it then holds the parameters only, and the ones
        that are not options (``prefix``, ``kwargs``, ...) are left out; an option the entry point does not take
        keeps its default here.

        Example:
            >>> def entry_point(*, prefix: str = "", cmc_top_k: int | Iterable[int] = 1) -> RetrievalOptions:
            ...     return RetrievalOptions.from_arguments(locals())
            >>> entry_point(cmc_top_k=[10, 1]).cmc_top_k
            (1, 10)
        """
        return cls.create(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

    def as_dict(self) -> dict[str, Any]:
        """The options as keyword arguments of :func:`retrieval_metrics`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def needs_pairs(self) -> bool:
        """Whether any metric reads every (query, gallery item) pair (FNMR@FMR, EER, minDCF, ROC AUC)."""
        return bool(self.fmr_vals) or self.eer or bool(self.min_dcf_p_target) or self.roc_auc

    @property
    def needs_ranking(self) -> bool:
        """Whether any metric needs a nearest-neighbour search."""
        cutoffs = self.cmc_top_k + self.precision_top_k + self.map_top_k + self.recall_top_k + self.ndcg_top_k
        full = self.mrr or self.map_full or self.minp or bool(self.fpir_vals)
        return bool(cutoffs) or self.map_at_r or self.r_precision or full


class OptionArguments(TypedDict, total=False):
    """The options as keyword arguments (each typed as its parameters are): the type of ``**options`` in the
    overloads of :func:`retrieval_metrics`, so that mypy refuses a misspelt option there too."""

    cmc_top_k: int | Iterable[int]
    precision_top_k: int | Iterable[int]
    map_top_k: int | Iterable[int]
    recall_top_k: int | Iterable[int]
    ndcg_top_k: int | Iterable[int]
    map_at_r: bool
    r_precision: bool
    mrr: bool
    map_full: bool
    minp: bool
    clustering: bool
    fmr_vals: float | Iterable[float]
    eer: bool
    roc_auc: bool
    min_dcf_p_target: float | Iterable[float]
    dcf_costs: tuple[float, float]
    fpir_vals: float | Iterable[float]
    pcf_variance: float | Iterable[float]
    distance: Distance
    normalize: bool
    precision_mode: PrecisionMode
    empty_target_action: EmptyTargetAction
    avg_of_avgs: bool
    per_class: bool
    label_comparison_fn: LabelComparisonFn | None
    confidence_level: float | None
    n_bootstrap: int
    seed: int
    knn_backend: KNNBackend
    search_precision: SearchPrecision
    chunk_size: int | None
    progress: bool
    approximate_index: str | None
    approximate_params: str
    audit_queries: int


def option_fields() -> Mapping[str, Field[Any]]:
    """Every field of :class:`RetrievalOptions` by name, in declaration order (``metadata``: ``kind``, ``help``).

    Example:
        >>> spec = option_fields()["cmc_top_k"]
        >>> spec.default, spec.metadata["kind"].name, spec.metadata["help"]
        ((1, 5), 'cutoffs', 'cutoffs k of cmc@k')
    """
    return {f.name: f for f in fields(RetrievalOptions)}


def check_option(name: str, value: Any) -> Any:
    """Check one option on its own, as :meth:`RetrievalOptions.create` does, for the classes and adapters that take
    a few of the same options (``FNMRAtFMR``, pytorch-metric-learning's ``AccuracyCalculator``).

    Example:
        >>> check_option("chunk_size", 0)
        Traceback (most recent call last):
            ...
        ValueError: `chunk_size` must be an int >= 1, got 0.
    """
    return option_fields()[name].metadata["kind"].check(name, value)
