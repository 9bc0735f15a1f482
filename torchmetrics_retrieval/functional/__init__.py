"""Stateless core: exact kNN, relevance, ranking kernels, reductions and the metrics built on them."""

from torchmetrics_retrieval.functional.knn import KNNResult, distance_blocks, knn
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

__all__ = [
    "KNNResult",
    "RetrievalOptions",
    "RetrievalResult",
    "apply_empty_target_action",
    "average_precision",
    "cmc_at_k",
    "count_relevant",
    "distance_blocks",
    "grouped_mean",
    "knn",
    "label_match",
    "map_at_k",
    "map_at_r",
    "masked_mean",
    "ndcg_at_k",
    "precision_at_k",
    "r_precision",
    "recall_at_k",
    "reciprocal_rank",
    "relevance_matrix",
    "retrieval_metrics",
    "retrieval_per_query",
]
