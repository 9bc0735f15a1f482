"""Both directions of a cross-modal evaluation (every A item against B, every B item against A) from one search.

Each distance between an A item and a B item serves both directions: the two sets, stacked, are searched as a
*bipartite* problem (``make_problem(split=...)``), whose symmetric pass computes the rectangle between them once
and keeps the candidates of every row of either side. Each direction takes its rows of that result (the
neighbours its own exact search finds, in the same order) and goes on as ``retrieval_metrics`` does.

The search reads its float64 rows from the stack on demand (``make_problem(lazy64=True)``: the values of a
float64 copy, without the copy), so it holds the stack, the float32 rows of its first stage and its candidates.

Each direction is searched on its own when the stacked search does not apply: with ``knn_backend="faiss"``
(faiss cannot leave a side out of a search), when the candidates of every row do not fit the symmetric buffer,
and with the metrics that look past the ranking (pair metrics, PCF, clustering) of each direction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._evaluate import evaluate, ranking_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import count_relevant, search_depth
from torchmetrics_retrieval.functional._progress import section, shown
from torchmetrics_retrieval.functional._search.plan import symmetric_search_fits
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions, KNNResult
from torchmetrics_retrieval.functional._sets import QueryGallery, split_query_gallery
from torchmetrics_retrieval.functional.relevance import _relevance_matrix_compute

__all__ = ["cross_modal_metrics", "stacked_cross_modal_metrics"]


def cross_modal_metrics(
    embeddings_a: Tensor, ids_a: Tensor, embeddings_b: Tensor, ids_b: Tensor, opts: RetrievalOptions
) -> dict[str, dict[str, Tensor]]:
    """``{"a_to_b": metrics, "b_to_a": metrics}`` of two sets whose items are relevant to the other set's items of
    the same id.

    Example:
        >>> images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> captions = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.1, 0.9]])
        >>> opts = RetrievalOptions.create(cmc_top_k=(1,), precision_top_k=(), map_top_k=(), distance="cosine")
        >>> both = cross_modal_metrics(images, torch.tensor([0, 1]), captions, torch.tensor([0, 1, 1, 1]), opts)
        >>> {direction: float(metrics["cmc/1"]) for direction, metrics in both.items()}
        {'a_to_b': 1.0, 'b_to_a': 0.75}
    """
    if _separately(opts):
        sets = ((embeddings_a, ids_a, embeddings_b, ids_b), (embeddings_b, ids_b, embeddings_a, ids_a))
        return {
            direction: evaluate(*one_set, opts, keep_neighbours=False)[0]
            for direction, one_set in zip(("a_to_b", "b_to_a"), sets, strict=True)
        }
    return stacked_cross_modal_metrics(torch.cat([embeddings_a, embeddings_b]), ids_a, ids_b, opts)


def stacked_cross_modal_metrics(
    stacked: Tensor, ids_a: Tensor, ids_b: Tensor, opts: RetrievalOptions
) -> dict[str, dict[str, Tensor]]:
    """:func:`cross_modal_metrics` of A stacked on B (``stacked[:len(ids_a)]`` is A): the caller's one copy of both
    sets serves the search, whose float64 rows are read from it on demand."""
    n_a = ids_a.shape[0]
    if _separately(opts):
        return cross_modal_metrics(stacked[:n_a], ids_a, stacked[n_a:], ids_b, opts)
    if opts.normalize:
        stacked = torch.nn.functional.normalize(stacked, dim=1)
    a, b = stacked[:n_a], stacked[n_a:]
    a_to_b, b_to_a = split_query_gallery(a, ids_a, b, ids_b), split_query_gallery(b, ids_b, a, ids_a)
    depths = (search_depth(opts, count_relevant(a_to_b, opts)), search_depth(opts, count_relevant(b_to_a, opts)))
    neighbours: tuple[KNNResult | None, KNNResult | None] = (None, None)
    with shown(opts.progress):
        if symmetric_search_fits(stacked.shape[0], max(depths)):
            with section("kNN search (both directions)", stacked.shape[0], unit="query"):
                neighbours = _stacked_search(stacked, a_to_b, opts, depths)
        return {
            direction: ranking_metrics(qg, opts, keep_neighbours=False, neighbours=found)[0]
            for direction, qg, found in zip(("a_to_b", "b_to_a"), (a_to_b, b_to_a), neighbours, strict=True)
        }


def _separately(opts: RetrievalOptions) -> bool:
    """Whether each direction is evaluated on its own (see the module docstring)."""
    beyond_ranking = bool(opts.needs_pairs or opts.pcf_variance or opts.clustering)
    return beyond_ranking or not opts.needs_ranking or opts.knn_backend == "faiss"


def _stacked_search(
    stacked: Tensor, a_to_b: QueryGallery, opts: RetrievalOptions, depths: tuple[int, int]
) -> tuple[KNNResult, KNNResult]:
    """The top ``depths`` neighbours of each direction from one bipartite search of ``stacked`` (A on B), in the
    order of ``retrieval_metrics``'s search wherever the values can see it (exact up to ties of one relevance)."""
    n_a, n_b = a_to_b.query.shape[0], a_to_b.gallery.shape[0]
    labels = torch.cat([a_to_b.query_labels, a_to_b.gallery_labels])
    names = ("embeddings_a", "embeddings_b")
    problem = make_problem(stacked, stacked, opts.distance, Exclusions(None, None, None), True, names, n_a, True)

    def relevance(rows: Tensor, items: Tensor) -> Tensor:
        return _relevance_matrix_compute(labels[rows], labels, items, None, opts.label_comparison_fn)

    search = Search.prepare(
        problem,
        max(depths),
        chunk_size=opts.chunk_size,
        exact_distances=False,
        relevance=relevance,
        precision=opts.search_precision,
    )
    found = search(torch.arange(stacked.shape[0], device=stacked.device))
    del problem, search  # the stage rows and candidate buffers

    def side(rows: slice, offset: int, depth: int, n_gallery: int) -> KNNResult:
        """The rows of one direction as its own search returns them: items numbered in its gallery, and its K
        columns (``min(depth, gallery size)``)."""
        width = min(depth, n_gallery, found.indices.shape[1])
        indices = (found.indices[rows, :width] - offset).clamp(min=0)
        return KNNResult(found.distances[rows, :width], indices, found.valid[rows, :width])

    return side(slice(None, n_a), n_a, depths[0], n_b), side(slice(n_a, None), 0, depths[1], n_a)
