"""Every public function and class: bad input raises ``ValueError``/``TypeError`` naming that function's own argument.

A registry lists, for every public callable (``torchmetrics_retrieval.functional.__all__``, the metric classes'
constructors and ``update``, the compat adapters), one call that works and the bad variants of it, each with the
argument the message must name in backticks, as the package does (``"`query`"``). The variants cover: wrong ndim,
length mismatch, NaN/inf embeddings, an empty set, bad cutoffs (< 1, not an int), fractions outside [0, 1], wrong
dtype, unknown string choices. A metric whose ``update`` fails keeps its state: the same ``metric_state`` after the
error, and a failed first update leaves nothing that changes a later ``compute``.

Only public API is used. ``test_registry_covers_the_public_api`` fails when a public callable has no entry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

import torchmetrics_retrieval.functional as F
import torchmetrics_retrieval.metrics as M
from torchmetrics_retrieval.compat import nidl, oml, pml
from torchmetrics_retrieval.compat.sentence_transformers import information_retrieval_scores
from torchmetrics_retrieval.metrics import (
    PCF,
    ContrastiveAccuracy,
    CrossModalRetrieval,
    EmbeddingMetrics,
    FNMRAtFMR,
    TrialMetrics,
)

# ---- data ------------------------------------------------------------------------------------------------------------

X = torch.tensor(
    [[0.0, 1.0, 2.0], [1.0, 0.5, 0.0], [2.0, 2.0, 1.0], [0.5, 3.0, 1.5], [3.0, 0.0, 2.5], [1.5, 1.0, 3.0]]
)  # (6, 3), distinct rows
Y = torch.tensor([0, 0, 1, 1, 2, 2])
HITS = torch.tensor([[True, False], [False, True], [False, False]])
N_RELEVANT = torch.tensor([1, 1, 2])


def with_nan(x: Tensor) -> Tensor:
    x = x.clone()
    x[1, 1] = float("nan")
    return x


def with_inf(x: Tensor) -> Tensor:
    x = x.clone()
    x[2, 0] = float("inf")
    return x


def wrong_shape(x: Tensor) -> Tensor:
    """One row fewer."""
    return x[:-1]


# ---- registry --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """One bad variant of a good call: the keyword arguments it overrides and the argument its error must name."""

    what: str
    overrides: dict[str, Any]
    name: str


@dataclass
class Entry:
    """A public callable, the keyword arguments of a call that works, and bad variants of that call."""

    function: Callable[..., Any]
    good: dict[str, Any]
    bad: list[Bad] = field(default_factory=list)

    def __call__(self, **kwargs: Any) -> Any:
        result = self.function(**kwargs)
        return list(result) if isinstance(result, Iterator) else result  # knn_chunks, distance_blocks: consume


def bad(what: str, name: str, **overrides: Any) -> Bad:
    return Bad(what, overrides, name)


def embedding_cases(arg: str, x: Tensor = X) -> list[Bad]:
    """The bad variants of an ``(N, D)`` floating, finite, non-empty embeddings argument."""
    return [
        bad(f"{arg} 1-D", arg, **{arg: x[:, 0]}),
        bad(f"{arg} 3-D", arg, **{arg: x[None]}),
        bad(f"{arg} NaN", arg, **{arg: with_nan(x)}),
        bad(f"{arg} inf", arg, **{arg: with_inf(x)}),
        bad(f"{arg} int dtype", arg, **{arg: x.long()}),
        bad(f"{arg} empty", arg, **{arg: x[:0]}),
        bad(f"{arg} a list", arg, **{arg: x.tolist()}),
    ]


def ranking_cases(with_top_k: bool = True) -> list[Bad]:
    cases = [
        bad("is_relevant 1-D", "is_relevant", is_relevant=HITS[:, 0]),
        bad("is_relevant float", "is_relevant", is_relevant=HITS.float()),
        bad("n_relevant length", "n_relevant", n_relevant=N_RELEVANT[:2]),
        bad("n_relevant 2-D", "n_relevant", n_relevant=N_RELEVANT[:, None]),
        bad("n_relevant float", "n_relevant", n_relevant=N_RELEVANT.float()),
    ]
    if with_top_k:
        cases += [
            bad("top_k 0", "top_k", top_k=0),
            bad("top_k (0,)", "top_k", top_k=(1, 0)),
            bad("top_k 1.5", "top_k", top_k=(1.5,)),
            bad("top_k str", "top_k", top_k="1"),
        ]
    return cases


SET_CASES = [  # the whole-set form (gallery None) of retrieval_metrics, retrieval_per_query, fnmr_at_fmr, det_curve
    *embedding_cases("query"),
    bad("query_labels length", "query_labels", query_labels=Y[:5]),
    bad("query_labels length, with is_query", "query_labels", query_labels=Y[:5], is_query=torch.ones(6, dtype=bool)),
    bad("query_labels 3-D", "query_labels", query_labels=Y[:, None, None]),
    bad("query_labels NaN", "query_labels", query_labels=with_nan(X)[:, 1]),
    bad("is_query length", "is_query", is_query=torch.ones(5, dtype=torch.bool)),
    bad("is_query int", "is_query", is_query=torch.ones(6, dtype=torch.long)),
    bad("is_query selects none", "is_query", is_query=torch.zeros(6, dtype=torch.bool)),
    bad("is_gallery selects none", "is_gallery", is_gallery=torch.zeros(6, dtype=torch.bool)),
    bad("sequence_ids length", "sequence_ids", sequence_ids=Y[:5]),
    bad("sequence_ids 2-D", "sequence_ids", sequence_ids=Y[:, None]),
    bad("sequence_ids a pair without gallery", "sequence_ids", sequence_ids=(Y, Y)),
    bad("search_groups length", "search_groups", search_groups=Y[:5]),
    bad("gallery_labels without gallery", "gallery_labels", gallery_labels=Y),
]
CAMERA_CASES = [  # camera_ids, where the camera protocol applies
    bad("camera_ids length", "camera_ids", camera_ids=Y[:5]),
    bad("camera_ids float", "camera_ids", camera_ids=Y.float()),
    bad("camera_ids a pair without gallery", "camera_ids", camera_ids=(Y, Y)),
    bad(
        "camera_ids[1] length with gallery",
        "camera_ids[1]",
        query=X[:3],
        query_labels=Y[:3],
        gallery=X[3:],
        gallery_labels=Y[3:],
        camera_ids=(Y[:3], Y[:2]),
    ),
]
GALLERY_CASES = [  # the separate-gallery form
    *[
        Bad(case.what, {"query": X[:3], "query_labels": Y[:3], "gallery_labels": Y[3:], **case.overrides}, case.name)
        for case in embedding_cases("gallery", X[3:])
    ],
    bad("gallery columns", "gallery", query=X[:3], query_labels=Y[:3], gallery=X[3:, :2], gallery_labels=Y[3:]),
    bad("gallery_labels length", "gallery_labels", query=X[:3], query_labels=Y[:3], gallery=X[3:], gallery_labels=Y),
    bad("gallery_labels None", "gallery_labels", query=X[:3], query_labels=Y[:3], gallery=X[3:]),
    bad(
        "gallery_labels 2-D",
        "gallery_labels",
        query=X[:3],
        query_labels=Y[:3],
        gallery=X[3:],
        gallery_labels=Y[3:, None],
    ),
    bad(
        "sequence_ids one tensor with gallery",
        "sequence_ids",
        query=X[:3],
        query_labels=Y[:3],
        gallery=X[3:],
        gallery_labels=Y[3:],
        sequence_ids=Y[:3],
    ),
]
RATE_CASES = [  # eer / min_dcf options, wherever FNMR@FMR is computed
    bad("eer str", "eer", eer="yes"),
    bad("roc_auc int", "roc_auc", roc_auc=1),
    bad("min_dcf_p_target 0", "min_dcf_p_target", min_dcf_p_target=(0.0,)),
    bad("min_dcf_p_target 1", "min_dcf_p_target", min_dcf_p_target=(1.0,)),
    bad("min_dcf_p_target str", "min_dcf_p_target", min_dcf_p_target="0.5"),
    bad("dcf_costs negative", "dcf_costs", dcf_costs=(1.0, -2.0)),
    bad("dcf_costs zero", "dcf_costs", dcf_costs=(0.0, 1.0)),
    bad("dcf_costs three", "dcf_costs", dcf_costs=(1.0, 1.0, 1.0)),
]
PAIR_OPTION_CASES = [
    bad("distance unknown", "distance", distance="manhattan"),
    bad("chunk_size 0", "chunk_size", chunk_size=0),
    bad("chunk_size 1.5", "chunk_size", chunk_size=1.5),
    bad("label_comparison_fn not callable", "label_comparison_fn", label_comparison_fn=3),
]
OPTION_CASES = [  # the options of retrieval_metrics (RetrievalOptions fields)
    bad("fpir_vals 1.5", "fpir_vals", fpir_vals=(1.5,)),
    bad("progress str", "progress", progress="yes"),
    *RATE_CASES,
    bad("confidence_level 1", "confidence_level", confidence_level=1.0),
    bad("confidence_level str", "confidence_level", confidence_level="0.95"),
    bad("n_bootstrap 0", "n_bootstrap", n_bootstrap=0),
    bad("seed -1", "seed", seed=-1),
    bad("cmc_top_k 0", "cmc_top_k", cmc_top_k=(0,)),
    bad("cmc_top_k 1.5", "cmc_top_k", cmc_top_k=(1.5,)),
    bad("precision_top_k str", "precision_top_k", precision_top_k="5"),
    bad("map_top_k -1", "map_top_k", map_top_k=(-1,)),
    bad("recall_top_k True", "recall_top_k", recall_top_k=(True,)),
    bad("ndcg_top_k 0", "ndcg_top_k", ndcg_top_k=0),
    bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
    bad("fmr_vals -0.1", "fmr_vals", fmr_vals=-0.1),
    bad("fmr_vals NaN", "fmr_vals", fmr_vals=(float("nan"),)),
    bad("pcf_variance 2", "pcf_variance", pcf_variance=(2,)),
    bad("pcf_variance str", "pcf_variance", pcf_variance="0.5"),
    bad("map_at_r not a bool", "map_at_r", map_at_r="yes"),
    bad("normalize not a bool", "normalize", normalize=1),
    bad("empty_target_action unknown", "empty_target_action", empty_target_action="ignore"),
    bad("precision_mode unknown", "precision_mode", precision_mode="macro"),
    bad("knn_backend unknown", "knn_backend", knn_backend="gpu"),
    *PAIR_OPTION_CASES,
]
CATEGORY_CASES = [bad("categories length", "categories", categories=Y[:5])]


def _knn_relevance(rows: Tensor, items: Tensor) -> Tensor:
    return torch.zeros(items.shape, dtype=torch.bool)


def _wrong_shape_fn(a: Tensor, b: Tensor) -> Tensor:
    return (a == b)[..., :1]


def _float_fn(a: Tensor, b: Tensor) -> Tensor:
    return (a == b).float()


def _one_cluster(x: Tensor, n_clusters: int) -> Tensor:
    return torch.zeros(x.shape[0] - 1, dtype=torch.long)


SUMS = F.covariance_sums(X)
KNN_EXCLUSIONS = [
    bad("exclude_self length", "exclude_self", exclude_self=torch.tensor([0, 1])),
    bad("exclude_self float", "exclude_self", exclude_self=torch.arange(6.0)),
    bad("exclude_self str", "exclude_self", exclude_self="yes"),
    bad("sequence_ids length", "sequence_ids", sequence_ids=Y[:5]),
    bad("sequence_ids float", "sequence_ids", sequence_ids=Y.float()),
    bad("sequence_ids 2-D", "sequence_ids", sequence_ids=Y[:, None]),
    bad("search_groups length", "search_groups", search_groups=Y[:5]),
    bad("search_groups float", "search_groups", search_groups=Y.float()),
    bad("gallery columns", "gallery", gallery=X[:, :2]),
    bad("gallery NaN", "gallery", gallery=with_nan(X)),
    bad("gallery empty", "gallery", gallery=X[:0]),
    bad("sequence_ids one tensor with gallery", "sequence_ids", gallery=X, sequence_ids=Y),
    bad("sequence_ids[1] length", "sequence_ids[1]", gallery=X, sequence_ids=(Y, Y[:5])),
]
KNN_OPTIONS = [
    bad("k 0", "k", k=0),
    bad("k -1", "k", k=-1),
    bad("k 1.5", "k", k=1.5),
    bad("k True", "k", k=True),
    bad("k str", "k", k="2"),
    bad("distance unknown", "distance", distance="manhattan"),
    bad("backend unknown", "backend", backend="gpu"),
    bad("chunk_size 0", "chunk_size", chunk_size=0),
    bad("exact_distances not a bool", "exact_distances", exact_distances="yes"),
]

# search_precision: knn's own argument, and the option of the same name wherever the options are taken
SEARCH_PRECISION_CASES = [
    bad("search_precision unknown", "search_precision", search_precision="float16"),
    bad("search_precision a dtype", "search_precision", search_precision=torch.bfloat16),
]
KNN_OPTIONS += SEARCH_PRECISION_CASES
OPTION_CASES += SEARCH_PRECISION_CASES

FUNCTIONS: dict[str, Entry] = {
    # search
    "F.knn": Entry(F.knn, {"query": X, "k": 2}, [*embedding_cases("query"), *KNN_OPTIONS, *KNN_EXCLUSIONS]),
    "F.knn_chunks": Entry(
        F.knn_chunks,
        {"query": X, "k": 2, "rows_per_chunk": 2},
        [
            *embedding_cases("query"),
            *KNN_OPTIONS,
            *KNN_EXCLUSIONS,
            bad("rows_per_chunk 0", "rows_per_chunk", rows_per_chunk=0),
            bad("rows_per_chunk 1.5", "rows_per_chunk", rows_per_chunk=1.5),
            bad("relevance not callable", "relevance", relevance=3, exact_distances=False),
            bad("relevance with exact distances", "relevance", relevance=_knn_relevance),
        ],
    ),
    "F.distance_blocks": Entry(
        F.distance_blocks,
        {"query": X, "gallery": X},
        [
            *embedding_cases("query"),
            *[Bad(c.what, c.overrides, c.name) for c in embedding_cases("gallery")],
            bad("gallery columns", "gallery", gallery=X[:, :2]),
            bad("distance unknown", "distance", distance="manhattan"),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
            bad("exact not a bool", "exact", exact="yes"),
            bad("self_index float", "self_index", self_index=torch.arange(6.0)),
            bad("self_index length", "self_index", self_index=torch.arange(5)),
            bad("self_index out of range", "self_index", self_index=torch.arange(6) + 1),
            bad("sequence_ids one tensor", "sequence_ids", sequence_ids=Y),
            bad("search_groups[0] length", "search_groups[0]", search_groups=(Y[:5], Y)),
        ],
    ),
    # the entry points
    "F.retrieval_metrics": Entry(
        F.retrieval_metrics,
        {"query": X, "query_labels": Y, "mrr": True, "fmr_vals": (0.1,), "pcf_variance": (0.5,)},
        [
            *SET_CASES,
            *CAMERA_CASES,
            *GALLERY_CASES,
            *OPTION_CASES,
            *CATEGORY_CASES,
            bad("return_per_query not a bool", "return_per_query", return_per_query="yes"),
        ],
    ),
    "F.retrieval_per_query": Entry(
        F.retrieval_per_query,
        {"query": X, "query_labels": Y},
        [
            *SET_CASES,
            *CAMERA_CASES,
            *GALLERY_CASES,
            *CATEGORY_CASES,
            bad("options a dict", "options", options={"cmc_top_k": (1,)}),
            bad("keep_neighbours not a bool", "keep_neighbours", keep_neighbours="yes"),
        ],
    ),
    "F.RetrievalOptions.create": Entry(F.RetrievalOptions.create, {}, OPTION_CASES),
    "RetrievalResult.worst_queries": Entry(
        F.retrieval_per_query(X, Y).worst_queries,
        {"key": "cmc/1", "n": 2},
        [
            bad("key unknown", "key", key="cmc/7"),
            bad("n 0", "n", n=0),
            bad("n 1.5", "n", n=1.5),
        ],
    ),
    # verification
    "F.fnmr_at_fmr": Entry(
        F.fnmr_at_fmr,
        {"query": X, "query_labels": Y},
        [
            *SET_CASES,
            *GALLERY_CASES,
            *PAIR_OPTION_CASES,
            *RATE_CASES,
            bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
            bad("fmr_vals -0.1", "fmr_vals", fmr_vals=-0.1),
            bad("fmr_vals str", "fmr_vals", fmr_vals="0.1"),
        ],
    ),
    "F.det_curve": Entry(
        F.det_curve,
        {"query": X, "query_labels": Y, "fmr_grid": (0.1, 0.5)},
        [
            *SET_CASES,
            *GALLERY_CASES,
            *PAIR_OPTION_CASES,
            bad("fmr_grid 1.5", "fmr_grid", fmr_grid=(0.1, 1.5)),
            bad("fmr_grid -1", "fmr_grid", fmr_grid=-1),
        ],
    ),
    "F.score_metrics": Entry(
        F.score_metrics,
        {"scores": torch.tensor([0.9, 0.2, 0.4, 0.1]), "is_target": torch.tensor([True, False, True, False])},
        [
            *RATE_CASES,
            bad("scores 2-D", "scores", scores=torch.ones(2, 2)),
            bad("scores a list", "scores", scores=[0.9, 0.2, 0.4, 0.1]),
            bad("scores NaN", "scores", scores=torch.tensor([0.9, float("nan"), 0.4, 0.1])),
            bad("scores bool", "scores", scores=torch.tensor([True, False, True, False])),
            bad("is_target int", "is_target", is_target=torch.tensor([1, 0, 1, 0])),
            bad("is_target length", "is_target", is_target=torch.tensor([True, False])),
            bad("is_target no non-target", "is_target", is_target=torch.ones(4, dtype=torch.bool)),
            bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
            bad("cllr str", "cllr", cllr="yes"),
            bad("act_dcf_p_target 1", "act_dcf_p_target", act_dcf_p_target=(1.0,)),
            bad("far_rule unknown", "far_rule", far_rule="nearest"),
        ],
    ),
    "F.trial_metrics": Entry(
        F.trial_metrics,
        {
            "embeddings": X,
            "trials": (torch.tensor([0, 0, 2, 4]), torch.tensor([1, 2, 3, 5]), Y[[0, 0, 2, 4]] == Y[[1, 2, 3, 5]]),
        },
        [
            *embedding_cases("embeddings"),
            *RATE_CASES,
            bad("trials a tensor", "trials", trials=torch.zeros(3, 4, dtype=torch.long)),
            bad("trials two parts", "trials", trials=(torch.tensor([0, 1]), torch.tensor([1, 2]))),
            bad(
                "trials float index",
                "trials",
                trials=(torch.tensor([0.0, 2.0]), torch.tensor([1, 3]), torch.tensor([True, False])),
            ),
            bad(
                "trials index 6",
                "trials",
                trials=(torch.tensor([0, 6]), torch.tensor([1, 3]), torch.tensor([True, False])),
            ),
            bad(
                "trials lengths",
                "trials",
                trials=(torch.tensor([0, 2]), torch.tensor([1]), torch.tensor([True, False])),
            ),
            bad(
                "trials int flags", "trials", trials=(torch.tensor([0, 2]), torch.tensor([1, 3]), torch.tensor([1, 0]))
            ),
            bad("distance unknown", "distance", distance="manhattan"),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
            bad("cllr int", "cllr", cllr=1),
            bad("act_dcf_p_target 0", "act_dcf_p_target", act_dcf_p_target=0.0),
            bad("far_rule unknown", "far_rule", far_rule="closest"),
            bad("score_norm unknown", "score_norm", score_norm="zt", cohort=X + 0.5),
            bad("score_norm without cohort", "cohort", score_norm="s"),
            bad("cohort without score_norm", "cohort", cohort=X + 0.5),
            bad("top_n without score_norm", "top_n", top_n=2),
            bad("embedding_ids without score_norm", "embedding_ids", embedding_ids=Y),
            bad("as without top_n", "top_n", score_norm="as", cohort=X + 0.5),
            bad("cohort columns", "cohort", score_norm="z", cohort=X[:, :2]),
            bad("cohort_ids without embedding_ids", "embedding_ids", score_norm="z", cohort=X, cohort_ids=Y),
            bad("media_ids without template_ids", "media_ids", media_ids=Y),
            bad("template_ids float", "template_ids", template_ids=Y.float()),
            bad("template_ids length", "template_ids", template_ids=Y[:5]),
            bad("trials name an unknown template", "trials", template_ids=Y),
        ],
    ),
    "F.fnmr_at_fmr_from_distances": Entry(
        F.fnmr_at_fmr_from_distances,
        {"pos_dist": torch.tensor([0.1, 0.2, 0.4]), "neg_dist": torch.tensor([0.3, 0.5, 0.6])},
        [
            bad("pos_dist 2-D", "pos_dist", pos_dist=torch.ones(2, 2)),
            bad("pos_dist a list", "pos_dist", pos_dist=[0.1, 0.2]),
            bad("neg_dist NaN", "neg_dist", neg_dist=torch.tensor([0.3, float("nan")])),
            bad("neg_dist inf", "neg_dist", neg_dist=torch.tensor([0.3, float("inf")])),
            bad("neg_dist bool", "neg_dist", neg_dist=torch.tensor([True, False])),
            bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
            bad("fmr_vals -0.5", "fmr_vals", fmr_vals=-0.5),
        ],
    ),
    # templates and score normalisation
    "F.pool_templates": Entry(
        F.pool_templates,
        {"embeddings": X, "template_ids": Y, "media_ids": torch.tensor([0, 1, 0, 1, 0, 1])},
        [
            *embedding_cases("embeddings"),
            bad("embeddings zero row", "embeddings", embeddings=X * torch.tensor([1.0, 0, 1, 1, 1, 1])[:, None]),
            bad("template_ids length", "template_ids", template_ids=Y[:5]),
            bad("template_ids float", "template_ids", template_ids=Y.float()),
            bad("template_ids 2-D", "template_ids", template_ids=Y[:, None]),
            bad("media_ids length", "media_ids", media_ids=Y[:4]),
            bad("media_ids float", "media_ids", media_ids=Y.float()),
        ],
    ),
    "F.normalize_scores": Entry(
        F.normalize_scores,
        {
            "scores": torch.zeros(4),
            "embeddings": X,
            "enrol_index": torch.tensor([0, 1, 2, 3]),
            "test_index": torch.tensor([1, 2, 3, 4]),
            "cohort": X + 0.5,
            "method": "as",
            "top_n": 2,
        },
        [
            *embedding_cases("embeddings"),
            *embedding_cases("cohort"),
            bad("cohort columns", "cohort", cohort=X[:, :2]),
            bad("scores length", "enrol_index", scores=torch.zeros(3)),
            bad("scores 2-D", "scores", scores=torch.zeros(4, 1)),
            bad("scores int", "scores", scores=torch.zeros(4, dtype=torch.long)),
            bad("scores NaN", "scores", scores=torch.tensor([0.0, float("nan"), 0.0, 0.0])),
            bad("scores positive with cosine", "scores", scores=torch.full((4,), 0.5)),
            bad("enrol_index out of range", "enrol_index", enrol_index=torch.tensor([0, 1, 2, 6])),
            bad("enrol_index negative", "enrol_index", enrol_index=torch.tensor([0, -1, 2, 3])),
            bad("test_index float", "test_index", test_index=torch.tensor([1.0, 2.0, 3.0, 4.0])),
            bad("test_index length", "test_index", test_index=torch.tensor([1, 2])),
            bad("method unknown", "method", method="zt"),
            bad("top_n None with as", "top_n", top_n=None),
            bad("top_n above the cohort", "top_n", top_n=7),
            bad("top_n 0", "top_n", top_n=0),
            bad("top_n with z", "top_n", method="z", top_n=2),
            bad("distance unknown", "distance", distance="manhattan"),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
            bad("embedding_ids without cohort_ids", "cohort_ids", embedding_ids=Y),
            bad("embedding_ids length", "embedding_ids", embedding_ids=Y[:5], cohort_ids=Y),
            bad("cohort_ids float", "cohort_ids", embedding_ids=Y, cohort_ids=Y.float()),
        ],
    ),
    # topology
    "F.pcf": Entry(
        F.pcf,
        {"embeddings": X, "pcf_variance": (0.5,)},
        [
            *embedding_cases("embeddings"),
            bad("embeddings one row", "embeddings", embeddings=X[:1]),
            bad("pcf_variance 1.5", "pcf_variance", pcf_variance=(1.5,)),
            bad("pcf_variance -1", "pcf_variance", pcf_variance=-1),
            bad("pcf_variance str", "pcf_variance", pcf_variance="0.5"),
        ],
    ),
    "F.covariance_sums": Entry(
        F.covariance_sums,
        {"embeddings": X},
        [c for c in embedding_cases("embeddings") if c.what != "embeddings empty"],  # empty is allowed (zeros)
    ),
    "F.pcf_from_sums": Entry(
        F.pcf_from_sums,
        {"count": SUMS[0], "sum": SUMS[1], "outer_sum": SUMS[2]},
        [
            bad("count two numbers", "count", count=torch.tensor([6, 6])),
            bad("count 1", "count", count=torch.tensor(1)),
            bad("count an int", "count", count=6),
            bad("sum 2-D", "sum", sum=SUMS[1][None]),
            bad("outer_sum shape", "outer_sum", outer_sum=SUMS[2][:2]),
            bad("pcf_variance 1.5", "pcf_variance", pcf_variance=(1.5,)),
        ],
    ),
    "F.alignment": Entry(
        F.alignment,
        {"x": X, "y": X + 1},
        [
            *embedding_cases("x"),
            bad("y shape", "y", y=wrong_shape(X)),
            bad("y NaN", "y", y=with_nan(X)),
            bad("alpha 0", "alpha", alpha=0),
            bad("alpha NaN", "alpha", alpha=float("nan")),
            bad("alpha str", "alpha", alpha="2"),
        ],
    ),
    "F.uniformity": Entry(
        F.uniformity,
        {"x": X},
        [
            *embedding_cases("x"),
            bad("x one row", "x", x=X[:1]),
            bad("t 0", "t", t=0),
            bad("t inf", "t", t=float("inf")),
            bad("t str", "t", t="2"),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
        ],
    ),
    # clustering
    "F.kmeans": Entry(
        F.kmeans,
        {"embeddings": X, "n_clusters": 2},
        [
            *embedding_cases("embeddings"),
            bad("n_clusters 0", "n_clusters", n_clusters=0),
            bad("n_clusters above N", "n_clusters", n_clusters=7),
            bad("n_clusters 1.5", "n_clusters", n_clusters=1.5),
            bad("seed -1", "seed", seed=-1),
            bad("seed str", "seed", seed="0"),
            bad("n_iter 0", "n_iter", n_iter=0),
            bad("n_redo 1.5", "n_redo", n_redo=1.5),
        ],
    ),
    "F.clustering_scores": Entry(
        F.clustering_scores,
        {"embeddings": X, "labels": Y},
        [
            *embedding_cases("embeddings"),
            bad("labels length", "labels", labels=Y[:5]),
            bad("labels 3-D", "labels", labels=Y[:, None, None]),
            bad("seed -1", "seed", seed=-1),
            bad("kmeans_fn wrong shape", "kmeans_fn", kmeans_fn=_one_cluster),
            bad("kmeans_fn not callable", "kmeans_fn", kmeans_fn=3),
        ],
    ),
    # contrastive
    "F.compare_models": Entry(
        F.compare_models,
        {"per_query_a": torch.tensor([0.1, 0.5, 0.3]), "per_query_b": torch.tensor([0.2, 0.5, 0.6]), "n_resamples": 50},
        [
            bad("per_query_a not a tensor", "per_query_a", per_query_a=[0.1, 0.5, 0.3]),
            bad("per_query_a 2-D", "per_query_a", per_query_a=torch.zeros(3, 1)),
            bad("per_query_b length", "per_query_b", per_query_b=torch.tensor([0.1, 0.2])),
            bad("per_query_b NaN", "per_query_b", per_query_b=torch.tensor([0.1, float("nan"), 0.3])),
            bad(
                "per_query_b ids misaligned",
                "per_query_b",
                per_query_a=(torch.tensor([0, 1, 2]), torch.tensor([0.1, 0.5, 0.3])),
                per_query_b=(torch.tensor([0, 1, 5]), torch.tensor([0.2, 0.5, 0.6])),
            ),
            bad(
                "per_query_a ids repeated",
                "per_query_a",
                per_query_a=(torch.tensor([0, 1, 1]), torch.tensor([0.1, 0.5, 0.3])),
                per_query_b=(torch.tensor([0, 1, 2]), torch.tensor([0.2, 0.5, 0.6])),
            ),
            bad(
                "per_query_b a tensor beside a pair",
                "per_query_b",
                per_query_a=(torch.tensor([0, 1, 2]), torch.tensor([0.1, 0.5, 0.3])),
            ),
            bad(
                "per_query_a ids float",
                "per_query_a",
                per_query_a=(torch.tensor([0.0, 1, 2]), torch.tensor([0.1, 0.5, 0.3])),
                per_query_b=(torch.tensor([0, 1, 2]), torch.tensor([0.2, 0.5, 0.6])),
            ),
            bad("test unknown", "test", test="wilcoxon"),
            bad("confidence_level 1", "confidence_level", confidence_level=1.0),
            bad("n_resamples 0", "n_resamples", n_resamples=0),
            bad("seed -1", "seed", seed=-1),
        ],
    ),
    "F.contrastive_accuracy": Entry(
        F.contrastive_accuracy,
        {"z1": X, "z2": X + 0.1},
        [
            *embedding_cases("z1"),
            bad("z2 shape", "z2", z2=wrong_shape(X)),
            bad("z2 NaN", "z2", z2=with_nan(X)),
            bad("top_k 0", "top_k", top_k=0),
            bad("top_k 1.5", "top_k", top_k=1.5),
            bad("normalize not a bool", "normalize", normalize="yes"),
            bad("eps -1", "eps", eps=-1.0),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
        ],
    ),
    # relevance
    "F.label_match": Entry(
        F.label_match,
        {"query_labels": Y, "gallery_labels": Y},
        [
            bad("query_labels 3-D", "query_labels", query_labels=Y[:, None, None]),
            bad("gallery_labels label shape", "gallery_labels", gallery_labels=Y[:, None]),
            bad("label_comparison_fn wrong shape", "label_comparison_fn", label_comparison_fn=_wrong_shape_fn),
            bad("label_comparison_fn float result", "label_comparison_fn", label_comparison_fn=_float_fn),
            bad("label_comparison_fn not callable", "label_comparison_fn", label_comparison_fn=3),
        ],
    ),
    "F.count_relevant": Entry(
        F.count_relevant,
        {"query_labels": Y, "gallery_labels": Y},
        [
            bad("query_labels 3-D", "query_labels", query_labels=Y[:, None, None]),
            bad("gallery_labels label shape", "gallery_labels", gallery_labels=Y[:, None]),
            bad("self_index length", "self_index", self_index=torch.arange(5)),
            bad("self_index float", "self_index", self_index=torch.arange(6.0)),
            bad("sequence_ids one tensor", "sequence_ids", sequence_ids=Y),
            bad("sequence_ids[1] length", "sequence_ids[1]", sequence_ids=(Y, Y[:5])),
            bad("search_groups[0] length", "search_groups[0]", search_groups=(Y[:5], Y)),
            bad("label_comparison_fn float result", "label_comparison_fn", label_comparison_fn=_float_fn),
        ],
    ),
    "F.relevance_matrix": Entry(
        F.relevance_matrix,
        {"query_labels": Y[:3], "gallery_labels": Y, "indices": torch.tensor([[0, 1], [2, 3], [4, 5]])},
        [
            bad("indices float", "indices", indices=torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])),
            bad("indices 1-D", "indices", indices=torch.tensor([0, 1, 2])),
            bad("indices rows", "indices", indices=torch.tensor([[0, 1], [2, 3]])),
            bad("indices out of range", "indices", indices=torch.tensor([[0, 1], [2, 3], [4, 6]])),
            bad("valid shape", "valid", valid=torch.ones(3, 1, dtype=torch.bool)),
            bad("valid int", "valid", valid=torch.ones(3, 2, dtype=torch.long)),
            bad("gallery_labels label shape", "gallery_labels", gallery_labels=Y[:, None]),
            bad("label_comparison_fn wrong shape", "label_comparison_fn", label_comparison_fn=_wrong_shape_fn),
        ],
    ),
    # ranking kernels
    **{
        f"F.{name}": Entry(getattr(F, name), {"is_relevant": HITS, "n_relevant": N_RELEVANT, "top_k": (1, 2)})
        for name in ("cmc_at_k", "map_at_k", "ndcg_at_k", "recall_at_k")
    },
    "F.precision_at_k": Entry(
        F.precision_at_k,
        {"is_relevant": HITS, "n_relevant": N_RELEVANT, "top_k": (1, 2)},
        [
            bad("mode unknown", "mode", mode="macro"),
            bad("n_candidates length", "n_candidates", mode="standard", n_candidates=torch.tensor([2, 2])),
            bad("n_candidates float", "n_candidates", mode="standard", n_candidates=torch.tensor([2.0, 2.0, 2.0])),
        ],
    ),
    **{
        f"F.{name}": Entry(getattr(F, name), {"is_relevant": HITS, "n_relevant": N_RELEVANT})
        for name in ("average_precision", "map_at_r", "r_precision")
    },
    "F.reciprocal_rank": Entry(
        F.reciprocal_rank,
        {"is_relevant": HITS},
        [
            bad("is_relevant 1-D", "is_relevant", is_relevant=HITS[:, 0]),
            bad("is_relevant float", "is_relevant", is_relevant=HITS.float()),
        ],
    ),
    # reductions
    "F.apply_empty_target_action": Entry(
        F.apply_empty_target_action,
        {"values": torch.tensor([0.5, 0.0]), "n_relevant": torch.tensor([2, 0])},
        [
            bad("empty_target_action unknown", "empty_target_action", empty_target_action="ignore"),
            bad("n_relevant length", "n_relevant", n_relevant=torch.tensor([2, 0, 1])),
            bad("n_relevant float", "n_relevant", n_relevant=torch.tensor([2.0, 0.0])),
            bad("values 3-D", "values", values=torch.zeros(2, 1, 1)),
        ],
    ),
    "F.masked_mean": Entry(
        F.masked_mean,
        {"values": torch.tensor([1.0, 0.0, 0.5]), "counted": torch.tensor([True, False, True])},
        [
            bad("counted length", "counted", counted=torch.tensor([True, False])),
            bad("counted int", "counted", counted=torch.tensor([1, 0, 1])),
            bad("values 0-D", "values", values=torch.tensor(1.0)),
        ],
    ),
    "F.grouped_mean": Entry(
        F.grouped_mean,
        {
            "values": torch.tensor([1.0, 0.0, 0.5]),
            "counted": torch.tensor([True, False, True]),
            "groups": torch.tensor([4, 4, 9]),
        },
        [
            bad("counted length", "counted", counted=torch.tensor([True, False])),
            bad("counted int", "counted", counted=torch.tensor([1, 0, 1])),
            bad("groups length", "groups", groups=torch.tensor([4, 9])),
            bad("groups 3-D", "groups", groups=torch.zeros(3, 1, 1)),
        ],
    ),
    # compat adapters
    "compat.pml.AccuracyCalculator": Entry(
        pml.AccuracyCalculator,
        {"include": ("precision_at_1",), "k": 3},
        [
            bad("k 0", "k", k=0),
            bad("k str", "k", k="most"),
            bad("k 1.5", "k", k=1.5),
            bad("include unknown", "include", include=("precision_at_2",)),
            bad("include a str", "include", include="precision_at_1"),  # PML: a tuple or a list
            bad("exclude unknown", "exclude", exclude=("nmi",)),
            bad("label_comparison_fn not callable", "label_comparison_fn", label_comparison_fn=3),
            bad("device unknown", "device", device="gpu7"),
            bad("avg_of_avgs not a bool", "avg_of_avgs", avg_of_avgs="yes"),
        ],
    ),
    "compat.pml.AccuracyCalculator.get_accuracy": Entry(
        pml.AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"), k=3).get_accuracy,
        {"query": X, "query_labels": Y},
        [
            *[c for c in embedding_cases("query") if c.what != "query int dtype"],  # cast to float32, as PML does
            bad("query_labels length", "query_labels", query_labels=Y[:5]),
            bad("query_labels 3-D", "query_labels", query_labels=Y[:, None, None]),
            bad("reference columns", "reference", reference=X[:, :2], reference_labels=Y),
            bad("reference NaN", "reference", reference=with_nan(X), reference_labels=Y),
            bad("reference_labels length", "reference_labels", reference=X, reference_labels=Y[:5]),
            bad("reference_labels None", "reference_labels", reference=X),
            bad("include unknown", "include", include=("precision_at_2",)),
        ],
    ),
    **{
        f"compat.oml.{name}": Entry(
            getattr(oml, name),
            {"gt_tops": [torch.tensor([True, False]), torch.tensor([False, True])], "n_gts": [1, 2], "top_k": (1, 2)},
            [
                bad("top_k 0", "top_k", top_k=(1, 0)),
                bad("top_k empty", "top_k", top_k=()),
                bad("top_k 1.5", "top_k", top_k=(1.5,)),
                bad("n_gts length", "n_gts", n_gts=[1]),
                bad("gt_tops 2-D row", "gt_tops", gt_tops=[torch.ones(2, 2, dtype=torch.bool), torch.tensor([True])]),
            ],
        )
        for name in ("calc_cmc", "calc_precision", "calc_map")
    },
    "compat.oml.calc_retrieval_metrics": Entry(
        oml.calc_retrieval_metrics,
        {"retrieved_ids": [torch.tensor([0, 1]), torch.tensor([2])], "gt_ids": [torch.tensor([1]), torch.tensor([2])]},
        [
            bad("cmc_top_k 0", "cmc_top_k", cmc_top_k=(0,)),
            bad("precision_top_k 1.5", "precision_top_k", precision_top_k=(1.5,)),
            bad("map_top_k str", "map_top_k", map_top_k="5"),
            bad("gt_ids length", "gt_ids", gt_ids=[torch.tensor([1])]),
            bad("retrieved_ids float", "retrieved_ids", retrieved_ids=[torch.tensor([0.0, 1.0]), torch.tensor([2.0])]),
            bad("gt_ids 2-D row", "gt_ids", gt_ids=[torch.ones(1, 2, dtype=torch.long), torch.tensor([2])]),
            bad("query_categories length", "query_categories", query_categories=np.array([0, 1, 1])),
        ],
    ),
    "compat.oml.calc_fnmr_at_fmr": Entry(
        oml.calc_fnmr_at_fmr,
        {"pos_dist": np.array([0.1, 0.2, 0.4]), "neg_dist": np.array([0.3, 0.5, 0.6])},
        [
            bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
            bad("fmr_vals empty", "fmr_vals", fmr_vals=()),
            bad("pos_dist 2-D", "pos_dist", pos_dist=np.ones((2, 2))),
            bad("neg_dist NaN", "neg_dist", neg_dist=np.array([0.3, np.nan])),
        ],
    ),
    "compat.oml.calc_pcf": Entry(
        oml.calc_pcf,
        {"embeddings": X, "pcf_variance": (0.5,)},
        [
            bad("pcf_variance 1.5", "pcf_variance", pcf_variance=(1.5,)),
            bad("pcf_variance empty", "pcf_variance", pcf_variance=()),
        ],
    ),
    "compat.oml.calc_topological_metrics": Entry(
        oml.calc_topological_metrics,
        {"embeddings": X, "pcf_variance": (0.5,)},
        [
            bad("pcf_variance 1.5", "pcf_variance", pcf_variance=(1.5,)),
            bad("categories length", "categories", categories=np.array([0, 1, 1])),
        ],
    ),
    "compat.oml.to_oml_nested": Entry(
        oml.to_oml_nested,
        {"flat_metrics": {"cmc/1": torch.tensor(0.5)}},
        [
            bad("flat_metrics per-class key", "flat_metrics", flat_metrics={"cmc/1/class/0": torch.tensor(0.5)}),
            bad("flat_metrics without the prefix", "flat_metrics", prefix="val/"),
        ],
    ),
    "compat.nidl.contrastive_accuracy_score": Entry(
        nidl.contrastive_accuracy_score,
        {"z1": X, "z2": X + 0.1},
        [
            bad("z1 1-D", "z1", z1=X[:, 0], z2=X[:, 0]),
            bad("z2 shape", "z2", z2=wrong_shape(X)),
            bad("z1 NaN", "z1", z1=with_nan(X)),
            bad("z2 inf", "z2", z2=with_inf(X)),
            bad("z1 numpy NaN", "z1", z1=with_nan(X).numpy(), z2=X.numpy()),
            bad("z1 empty", "z1", z1=X[:0], z2=X[:0]),
            bad("z2 a list", "z2", z2=X.tolist()),
            bad("topk 0", "topk", topk=0),
            bad("topk str", "topk", topk="1"),
        ],
    ),
}


# graded relevance with qrels (issue 42)
QRELS_GOOD = {
    "query": X[:3],
    "query_ids": ["a", "b", "c"],
    "corpus": X,
    "corpus_ids": ["u", "v", "w", "x", "y", "z"],
    "qrels": {"a": {"u": 2, "v": 0}, "b": {"w": 1}},
    "mrr": True,
}
FUNCTIONS["F.qrels_metrics"] = Entry(
    F.qrels_metrics,
    QRELS_GOOD,
    [
        *embedding_cases("query", X[:3]),
        *embedding_cases("corpus"),
        bad("corpus columns", "corpus", corpus=X[:, :2]),
        bad("query_ids length", "query_ids", query_ids=["a", "b"]),
        bad("query_ids repeated", "query_ids", query_ids=["a", "a", "c"]),
        bad("query_ids floats", "query_ids", query_ids=[0.5, 1.5, 2.5]),
        bad("query_ids a str", "query_ids", query_ids="abc"),
        bad("corpus_ids float tensor", "corpus_ids", corpus_ids=torch.arange(6.0)),
        bad("corpus_ids length", "corpus_ids", corpus_ids=["u"]),
        bad("qrels a list", "qrels", qrels=[("a", "u", 1)]),
        bad("qrels inner not a dict", "qrels", qrels={"a": ["u"]}),
        bad("qrels negative grade", "qrels", qrels={"a": {"u": -1}}),
        bad("qrels float grade", "qrels", qrels={"a": {"u": 1.0}}),
        bad("qrels lengths", "qrels", qrels=(["a"], ["u", "v"], [1])),
        bad("qrels pair twice", "qrels", qrels=(["a", "a"], ["u", "u"], [1, 2])),
        bad("ndcg_top_k 0", "ndcg_top_k", ndcg_top_k=0),
        bad("map_top_k 1.5", "map_top_k", map_top_k=(1.5,)),
        bad("recall_top_k str", "recall_top_k", recall_top_k="1"),
        bad("precision_top_k (0,)", "precision_top_k", precision_top_k=(1, 0)),
        bad("mrr not a bool", "mrr", mrr="yes"),
        bad("r_precision not a bool", "r_precision", r_precision=1),
        bad("no measure", "ndcg_top_k", ndcg_top_k=(), mrr=False),
        bad("distance sqeuclidean", "distance", distance="sqeuclidean"),
        bad("relevance_level 0", "relevance_level", relevance_level=0),
        bad("relevance_level float", "relevance_level", relevance_level=1.0),
        bad("ignore_identical_ids not a bool", "ignore_identical_ids", ignore_identical_ids="yes"),
        bad("ties unknown", "ties", ties="random"),
        bad("confidence_level 1", "confidence_level", confidence_level=1.0),
        bad("n_bootstrap 0", "n_bootstrap", n_bootstrap=0),
        bad("seed -1", "seed", seed=-1),
        bad("knn_backend unknown", "knn_backend", knn_backend="annoy"),
        bad("chunk_size 0", "chunk_size", chunk_size=0),
        bad("return_per_query not a bool", "return_per_query", return_per_query="yes"),
    ],
)
FUNCTIONS["compat.sentence_transformers.information_retrieval_scores"] = Entry(
    information_retrieval_scores,
    {key: QRELS_GOOD[key] for key in ("query", "query_ids", "corpus", "corpus_ids")}
    | {"relevant_docs": {"a": {"u"}, "b": {"w", "x"}}},
    [
        *embedding_cases("query", X[:3]),
        bad("query_ids repeated", "query_ids", query_ids=["a", "a", "c"]),
        bad("relevant_docs a list", "relevant_docs", relevant_docs=[("a", "u")]),
        bad("relevant_docs a str per query", "relevant_docs", relevant_docs={"a": "u"}),
        bad("accuracy_at_k 0", "accuracy_at_k", accuracy_at_k=0),
        bad("precision_recall_at_k 1.5", "precision_recall_at_k", precision_recall_at_k=(1.5,)),
        bad("mrr_at_k str", "mrr_at_k", mrr_at_k="1"),
        bad("ndcg_at_k (0,)", "ndcg_at_k", ndcg_at_k=(1, 0)),
        bad("map_at_k -1", "map_at_k", map_at_k=-1),
        bad("score_function euclidean", "score_function", score_function="euclidean"),
        Bad("name not a str", {"name": 1}, "name"),
    ],
)
for key in ("F.cmc_at_k", "F.map_at_k", "F.ndcg_at_k", "F.recall_at_k", "F.precision_at_k"):
    FUNCTIONS[key].bad[:0] = ranking_cases()
for key in ("F.average_precision", "F.map_at_r", "F.r_precision"):
    FUNCTIONS[key].bad[:0] = ranking_cases(with_top_k=False)


# ---- metric classes --------------------------------------------------------------------------------------------------


@dataclass
class MetricEntry:
    """A metric class, constructor arguments that work, a batch ``update`` accepts, and bad variants of both."""

    cls: type
    init: dict[str, Any]
    batch: dict[str, Any]
    bad_init: list[Bad]
    bad_update: list[Bad]


def update_embedding_cases(arg: str) -> list[Bad]:
    """:func:`embedding_cases` without the empty batch, which ``update`` accepts (a rank may have no sample)."""
    return [case for case in embedding_cases(arg) if case.what != f"{arg} empty"]


UPDATE_SET_CASES = [  # update(embeddings, labels, is_query, is_gallery, sequence_ids, search_groups, indexes)
    *update_embedding_cases("embeddings"),
    bad("embeddings columns unlike the stored", "embeddings", embeddings=X[:, :2]),
    bad("labels length", "labels", labels=Y[:5]),
    bad("labels 3-D", "labels", labels=Y[:, None, None]),
    bad("labels shape unlike the stored", "labels", labels=Y[:, None]),
    bad("labels dtype unlike the stored", "labels", labels=Y.float()),
    bad("is_query length", "is_query", is_query=torch.ones(5, dtype=torch.bool)),
    bad("is_query int", "is_query", is_query=torch.ones(6, dtype=torch.long)),
    bad("is_gallery length", "is_gallery", is_gallery=torch.ones(5, dtype=torch.bool)),
    bad("sequence_ids length", "sequence_ids", sequence_ids=Y[:5]),
    bad("search_groups 2-D", "search_groups", search_groups=Y[:, None]),
    bad("indexes length", "indexes", indexes=torch.arange(5)),
    bad("indexes float", "indexes", indexes=torch.arange(6.0)),
]

METRICS: dict[str, MetricEntry] = {
    "EmbeddingMetrics": MetricEntry(
        EmbeddingMetrics,
        {"cmc_top_k": (1,), "precision_top_k": (2,), "map_top_k": (2,), "mrr": True, "fmr_vals": (0.1,)},
        {"embeddings": X, "labels": Y},
        [
            *OPTION_CASES,
            bad("storage_dtype int", "storage_dtype", storage_dtype=torch.int64),
            bad("storage_dtype str", "storage_dtype", storage_dtype="float16"),
            bad("prefix not a str", "prefix", prefix=3),
        ],
        [
            *UPDATE_SET_CASES,
            bad("categories length", "categories", categories=Y[:5]),
            bad("camera_ids length", "camera_ids", camera_ids=Y[:5]),
            bad("camera_ids float", "camera_ids", camera_ids=Y.float()),
        ],
    ),
    "FNMRAtFMR": MetricEntry(
        FNMRAtFMR,
        {"fmr_vals": (0.1, 0.5)},
        {"embeddings": X, "labels": Y},
        [
            *PAIR_OPTION_CASES,
            *RATE_CASES,
            bad("progress str", "progress", progress="yes"),
            bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
            bad("fmr_vals empty", "fmr_vals", fmr_vals=()),
            bad("fmr_vals str", "fmr_vals", fmr_vals="0.1"),
        ],
        UPDATE_SET_CASES,
    ),
    "PCF": MetricEntry(
        PCF,
        {"pcf_variance": (0.5, 0.9)},
        {"embeddings": X},
        [
            bad("pcf_variance 1.5", "pcf_variance", pcf_variance=(1.5,)),
            bad("pcf_variance empty", "pcf_variance", pcf_variance=()),
            bad("pcf_variance str", "pcf_variance", pcf_variance="0.5"),
        ],
        [
            *update_embedding_cases("embeddings"),
            bad("embeddings columns unlike the stored", "embeddings", embeddings=X[:, :2]),
            bad("indexes length", "indexes", indexes=torch.arange(5)),
            bad("indexes float", "indexes", indexes=torch.arange(6.0)),
        ],
    ),
    "CrossModalRetrieval": MetricEntry(
        CrossModalRetrieval,
        {"cmc_top_k": (1, 2), "mrr": True},
        {"embeddings_a": X, "ids_a": Y, "embeddings_b": X + 0.1, "ids_b": Y},
        [*OPTION_CASES, bad("prefix not a str", "prefix", prefix=3)],
        [
            *update_embedding_cases("embeddings_a"),
            bad("embeddings_b columns unlike the stored", "embeddings_b", embeddings_b=X[:, :2]),
            bad("ids_a float", "ids_a", ids_a=Y.float()),
            bad("ids_b length", "ids_b", ids_b=Y[:5]),
            bad("ids_a without embeddings_a", "embeddings_a", embeddings_a=None),
            bad("embeddings_b without ids_b", "ids_b", ids_b=None),
            bad("indexes_a float", "indexes_a", indexes_a=torch.arange(6.0)),
        ],
    ),
    "TrialMetrics": MetricEntry(
        TrialMetrics,
        {"trials": (torch.tensor([0, 2, 0]), torch.tensor([1, 3, 4]), torch.tensor([True, True, False])), "eer": True},
        {"embeddings": X, "indexes": torch.arange(6)},
        [
            bad("trials not a triple", "trials", trials=(torch.tensor([0]), torch.tensor([1]))),
            bad("trials no non-target", "trials", trials=(torch.tensor([0]), torch.tensor([1]), torch.tensor([True]))),
            bad(
                "trials negative index",
                "trials",
                trials=(torch.tensor([-1, 0]), torch.tensor([1, 2]), torch.tensor([True, False])),
            ),
            bad("distance unknown", "distance", distance="manhattan"),
            bad("fmr_vals 1.5", "fmr_vals", fmr_vals=(1.5,)),
            bad("far_rule unknown", "far_rule", far_rule="nearest"),
            bad("act_dcf_p_target 1", "act_dcf_p_target", act_dcf_p_target=(1.0,)),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
            bad("distributed unknown", "distributed", distributed="all"),
        ],
        [
            *update_embedding_cases("embeddings"),
            bad("embeddings columns unlike the stored", "embeddings", embeddings=X[:, :2]),
            bad("indexes length", "indexes", indexes=torch.arange(5)),
            bad("indexes float", "indexes", indexes=torch.arange(6.0)),
        ],
    ),
    "ContrastiveAccuracy": MetricEntry(
        ContrastiveAccuracy,
        {"top_k": (1, 2)},
        {"z1": X, "z2": X + 0.1},
        [
            bad("top_k 0", "top_k", top_k=0),
            bad("top_k empty", "top_k", top_k=()),
            bad("top_k 1.5", "top_k", top_k=(1.5,)),
            bad("normalize not a bool", "normalize", normalize="yes"),
            bad("eps -1", "eps", eps=-1.0),
            bad("eps NaN", "eps", eps=float("nan")),
            bad("chunk_size 0", "chunk_size", chunk_size=0),
        ],
        [
            *update_embedding_cases("z1"),
            bad("z2 shape", "z2", z2=wrong_shape(X)),
            bad("z2 NaN", "z2", z2=with_nan(X)),
            bad("z1 columns unlike the stored", "z1", z1=X[:, :2], z2=X[:, :2]),
            bad("indexes length", "indexes", indexes=torch.arange(5)),
        ],
    ),
}


# graded relevance with qrels (issue 42)
METRICS["QrelsMetrics"] = MetricEntry(
    M.QrelsMetrics,
    {"qrels": {"10": {"100": 2, "101": 0}, "11": {"102": 1}}, "mrr": True},
    {"query": X[:3], "query_ids": torch.arange(10, 13), "corpus": X, "corpus_ids": torch.arange(100, 106)},
    [
        bad("qrels a list", "qrels", qrels=[("10", "100", 1)]),
        bad("qrels negative grade", "qrels", qrels={"10": {"100": -1}}),
        bad("ndcg_top_k 0", "ndcg_top_k", ndcg_top_k=0),
        bad("map_top_k 1.5", "map_top_k", map_top_k=(1.5,)),
        bad("mrr not a bool", "mrr", mrr="yes"),
        bad("no measure", "ndcg_top_k", ndcg_top_k=(), mrr=False),
        bad("distance sqeuclidean", "distance", distance="sqeuclidean"),
        bad("relevance_level 0", "relevance_level", relevance_level=0),
        bad("ignore_identical_ids not a bool", "ignore_identical_ids", ignore_identical_ids=1),
        bad("ties unknown", "ties", ties="random"),
        bad("confidence_level 2", "confidence_level", confidence_level=2.0),
        bad("knn_backend unknown", "knn_backend", knn_backend="annoy"),
        bad("chunk_size 0", "chunk_size", chunk_size=0),
        bad("prefix not a str", "prefix", prefix=1),
    ],
    [
        *update_embedding_cases("query"),
        *update_embedding_cases("corpus"),
        bad("query columns unlike the stored", "query", query=X[:3, :2]),
        bad("query_ids length", "query_ids", query_ids=torch.arange(2)),
        bad("query_ids float", "query_ids", query_ids=torch.arange(3.0)),
        bad("corpus_ids length", "corpus_ids", corpus_ids=torch.arange(5)),
        bad("corpus without ids", "corpus", corpus_ids=None),
    ],
)


# audit of an approximate index (issue 43)
AUDIT_TABLE = torch.tensor([[1, 2], [0, -1], [3, 3], [2, 4], [5, 3], [4, 0]])
FUNCTIONS["F.audit_neighbours"] = Entry(
    F.audit_neighbours,
    {"query": X, "neighbours": AUDIT_TABLE},
    [
        *embedding_cases("query"),
        bad("gallery columns", "gallery", gallery=X[:, :2]),
        bad("gallery NaN", "gallery", gallery=with_nan(X)),
        bad("neighbours numpy", "neighbours", neighbours=AUDIT_TABLE.numpy()),
        bad("neighbours 1-D", "neighbours", neighbours=AUDIT_TABLE[:, 0]),
        bad("neighbours float", "neighbours", neighbours=AUDIT_TABLE.float()),
        bad("neighbours bool", "neighbours", neighbours=AUDIT_TABLE > 0),
        bad("neighbours rows", "neighbours", neighbours=AUDIT_TABLE[:5]),
        bad("neighbours no column", "neighbours", neighbours=AUDIT_TABLE[:, :0]),
        bad("neighbours -2", "neighbours", neighbours=AUDIT_TABLE - 2),
        bad("neighbours beyond the gallery", "neighbours", neighbours=AUDIT_TABLE + 6),
        bad("k 0", "k", k=0),
        bad("k 1.5", "k", k=1.5),
        bad("k wider than the table", "k", k=3),
        bad("distance unknown", "distance", distance="manhattan"),
        bad("backend unknown", "backend", backend="gpu"),
        bad("chunk_size 0", "chunk_size", chunk_size=0),
        bad("exclude_self str", "exclude_self", exclude_self="yes"),
        bad("sequence_ids length", "sequence_ids", sequence_ids=Y[:5]),
        bad("search_groups float", "search_groups", search_groups=Y.float()),
        bad("return_per_query not a bool", "return_per_query", return_per_query="yes"),
    ],
)

# retrieval_metrics on given neighbour lists (issue 43)
FUNCTIONS["F.retrieval_metrics"].bad.extend(
    [
        bad("neighbours numpy", "neighbours", neighbours=AUDIT_TABLE.numpy()),
        bad("neighbours float", "neighbours", neighbours=AUDIT_TABLE.float()),
        bad("neighbours 1-D", "neighbours", neighbours=AUDIT_TABLE[:, 0]),
        bad("neighbours rows", "neighbours", neighbours=AUDIT_TABLE[:4]),
        bad("neighbours beyond the set", "neighbours", neighbours=AUDIT_TABLE + 6),
        bad("neighbours with full map", "neighbours", neighbours=AUDIT_TABLE, map_full=True),
    ]
)

# approximate evaluation with an exact audit (issue 43)
APPROXIMATE_CASES = [
    bad("approximate_index int", "approximate_index", approximate_index=3),
    bad("approximate_index empty", "approximate_index", approximate_index=" "),
    bad("approximate_params int", "approximate_params", approximate_params=32),
    bad("audit_queries 0", "audit_queries", audit_queries=0),
    bad("audit_queries 1.5", "audit_queries", audit_queries=1.5),
]
FUNCTIONS["F.retrieval_metrics"].bad.extend(
    [
        *APPROXIMATE_CASES,
        bad("approximate_index unknown", "approximate_index", approximate_index="IVF2,Nonsense"),
        bad("approximate_params unknown", "approximate_params", approximate_index="Flat", approximate_params="x=1"),
        bad("neighbours with approximate_index", "approximate_index", neighbours=AUDIT_TABLE, approximate_index="Flat"),
    ]
)
FUNCTIONS["F.RetrievalOptions.create"].bad.extend(APPROXIMATE_CASES)
METRICS["EmbeddingMetrics"].bad_init.extend(APPROXIMATE_CASES)
METRICS["CrossModalRetrieval"].bad_init.extend(
    [*APPROXIMATE_CASES, bad("approximate_index not supported", "approximate_index", approximate_index="Flat")]
)

# ---- the tests -------------------------------------------------------------------------------------------------------


def _public_callables() -> set[str]:
    names = {f"F.{name}" for name in F.__all__ if inspect.isfunction(getattr(F, name))}
    names |= {"F.RetrievalOptions.create", "RetrievalResult.worst_queries"}
    names |= {f"compat.oml.{name}" for name in oml.__all__ if inspect.isfunction(getattr(oml, name))}
    names |= {f"compat.nidl.{name}" for name in nidl.__all__ if inspect.isfunction(getattr(nidl, name))}
    names |= {"compat.pml.AccuracyCalculator", "compat.pml.AccuracyCalculator.get_accuracy"}
    return names


def test_registry_covers_the_public_api() -> None:
    assert _public_callables() <= set(FUNCTIONS), sorted(_public_callables() - set(FUNCTIONS))
    assert set(M.__all__) == {*METRICS, "ShardedComputeError"}  # the one export that is not a metric class
    for entry in FUNCTIONS.values():  # every argument a case overrides is one of the function's own
        parameters = inspect.signature(entry.function).parameters
        takes_options = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        for case in entry.bad:
            for arg in case.overrides:
                assert arg in parameters or takes_options, (entry.function, arg)


@pytest.mark.parametrize("key", sorted(FUNCTIONS))
def test_the_good_call_works(key: str) -> None:
    """Each bad case differs from a working call only by its bad argument(s)."""
    entry = FUNCTIONS[key]
    entry(**entry.good)


def _cases() -> Iterable[Any]:
    for key, entry in FUNCTIONS.items():
        for case in entry.bad:
            yield pytest.param(key, case, id=f"{key}[{case.what}]")


def _assert_names(error: BaseException, name: str) -> None:
    message = str(error)
    assert f"`{name}`" in message, f"the message does not name `{name}`: {type(error).__name__}: {message}"


@pytest.mark.parametrize(("key", "case"), list(_cases()))
def test_bad_argument_is_named(key: str, case: Bad) -> None:
    entry = FUNCTIONS[key]
    with pytest.raises((ValueError, TypeError)) as info:
        entry(**{**entry.good, **case.overrides})
    _assert_names(info.value, case.name)


@pytest.mark.parametrize(
    ("key", "case"), [pytest.param(k, c, id=f"{k}[{c.what}]") for k, e in METRICS.items() for c in e.bad_init]
)
def test_bad_constructor_argument_is_named(key: str, case: Bad) -> None:
    entry = METRICS[key]
    entry.cls(**entry.init)  # works without the bad argument
    with pytest.raises((ValueError, TypeError)) as info:
        entry.cls(**{**entry.init, **case.overrides})
    _assert_names(info.value, case.name)


def _snapshot(metric: Any) -> dict[str, Any]:
    def copy(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value.clone()
        if isinstance(value, list):
            return [copy(v) for v in value]
        return value

    return {name: copy(value) for name, value in metric.metric_state.items()}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


UPDATE_CASES = [pytest.param(k, c, id=f"{k}[{c.what}]") for k, e in METRICS.items() for c in e.bad_update]


@pytest.mark.parametrize(("key", "case"), UPDATE_CASES)
def test_bad_update_is_named_and_leaves_the_state(key: str, case: Bad) -> None:
    entry = METRICS[key]
    metric = entry.cls(**entry.init)
    metric.update(**entry.batch)
    before = _snapshot(metric)
    with pytest.raises((ValueError, TypeError)) as info:
        metric.update(**{**entry.batch, **case.overrides})
    _assert_names(info.value, case.name)
    after = _snapshot(metric)
    assert before.keys() == after.keys()
    changed = [name for name in before if not _same(before[name], after[name])]
    assert not changed, f"state changed by the failed update: {changed}"


def _values(result: Any) -> dict[str, float]:
    if isinstance(result, Tensor):
        return {"": float(result)}
    return {key: float(value) for key, value in result.items()}


@pytest.mark.parametrize(
    ("key", "case"),
    [p for p in UPDATE_CASES if "unlike the stored" not in p.values[1].what],  # those need a stored batch
)
def test_failed_first_update_leaves_no_trace(key: str, case: Bad) -> None:
    """A metric whose first update failed computes what a fresh metric computes from the next batch."""
    entry = METRICS[key]
    metric = entry.cls(**entry.init)
    with pytest.raises((ValueError, TypeError)):
        metric.update(**{**entry.batch, **case.overrides})
    metric.update(**entry.batch)
    fresh = entry.cls(**entry.init)
    fresh.update(**entry.batch)
    assert _values(metric.compute()) == pytest.approx(_values(fresh.compute()), nan_ok=True)
