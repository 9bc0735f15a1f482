"""Stateless core: exact kNN, relevance, ranking kernels, reductions and the metrics built on them."""

from torchmetrics_retrieval.functional.audit import audit_neighbours
from torchmetrics_retrieval.functional.clustering import clustering_scores, kmeans
from torchmetrics_retrieval.functional.comparison import compare_models
from torchmetrics_retrieval.functional.contrastive import contrastive_accuracy
from torchmetrics_retrieval.functional.qrels import qrels_metrics
from torchmetrics_retrieval.functional.ranking import (
    average_precision,
    cmc_at_k,
    map_at_k,
    map_at_r,
    ndcg_at_k,
    precision_at_k,
    r_precision,
    recall_at_k,
    reciprocal_rank,
)
from torchmetrics_retrieval.functional.reduction import apply_empty_target_action, grouped_mean, masked_mean
from torchmetrics_retrieval.functional.relevance import count_relevant, label_match, relevance_matrix
from torchmetrics_retrieval.functional.retrieval import (
    RetrievalOptions,
    RetrievalResult,
    retrieval_metrics,
    retrieval_per_query,
)
from torchmetrics_retrieval.functional.score_norm import normalize_scores
from torchmetrics_retrieval.functional.search import DistanceBlock, KNNResult, distance_blocks, knn, knn_chunks
from torchmetrics_retrieval.functional.templates import pool_templates
from torchmetrics_retrieval.functional.topology import alignment, covariance_sums, pcf, pcf_from_sums, uniformity
from torchmetrics_retrieval.functional.trials import score_metrics, trial_metrics
from torchmetrics_retrieval.functional.verification import det_curve, fnmr_at_fmr, fnmr_at_fmr_from_distances

__all__ = [
    "DistanceBlock",
    "KNNResult",
    "RetrievalOptions",
    "RetrievalResult",
    "alignment",
    "apply_empty_target_action",
    "audit_neighbours",
    "average_precision",
    "clustering_scores",
    "cmc_at_k",
    "compare_models",
    "contrastive_accuracy",
    "count_relevant",
    "covariance_sums",
    "det_curve",
    "distance_blocks",
    "fnmr_at_fmr",
    "fnmr_at_fmr_from_distances",
    "grouped_mean",
    "kmeans",
    "knn",
    "knn_chunks",
    "label_match",
    "map_at_k",
    "map_at_r",
    "masked_mean",
    "ndcg_at_k",
    "normalize_scores",
    "pcf",
    "pcf_from_sums",
    "pool_templates",
    "precision_at_k",
    "r_precision",
    "recall_at_k",
    "reciprocal_rank",
    "relevance_matrix",
    "retrieval_metrics",
    "retrieval_per_query",
    "score_metrics",
    "trial_metrics",
    "uniformity",
]

# graded relevance with qrels (issue 42)
__all__ += ["qrels_metrics"]
