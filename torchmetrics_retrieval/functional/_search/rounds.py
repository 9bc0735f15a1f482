"""A prepared search (:class:`Search`: the problem, its stage, K and the candidates per query) and its rounds:
stage 1 then stage 2 over the uncertified queries, with twice the candidates each round, until every query
is certified exact."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._progress import advance
from torchmetrics_retrieval.functional._search import low_precision, plan
from torchmetrics_retrieval.functional._search.certify import rank
from torchmetrics_retrieval.functional._search.faiss_stage import FaissStage
from torchmetrics_retrieval.functional._search.half_rows import half_rows
from torchmetrics_retrieval.functional._search.problem import Problem
from torchmetrics_retrieval.functional._search.torch_stage import TorchStage
from torchmetrics_retrieval.functional._search.types import KNNResult, RelevanceFn

__all__ = ["Search"]


class Search(NamedTuple):
    """A search of a checked problem, ready to answer any subset of its queries."""

    problem: Problem
    stage: TorchStage | FaissStage | None  # None: no query has an eligible item (K = 0)
    k: int
    kp: int
    chunk_size: int | None
    exact_distances: bool
    relevance: RelevanceFn | None = None

    @classmethod
    def prepare(
        cls,
        problem: Problem,
        k: int,
        *,
        backend: str = "auto",
        chunk_size: int | None = None,
        exact_distances: bool = True,
        relevance: RelevanceFn | None = None,
        precision: str = "auto",
    ) -> Search:
        """Choose the stage (``plan.resolve_backend``) and prepare the gallery for it; nothing is checked here.

        ``K = min(k, G, the largest number of eligible items of any query)``. ``precision`` (``"auto"``,
        ``"float32"``, ``"bfloat16"``) is the precision of the torch stage's products (``low_precision``); the
        faiss stage and capped searches (whose first thresholds assume float32 keys) take float32.
        """
        # a cap is compared with each item's canonical distance, which only exact distances give
        assert problem.caps is None or exact_distances, "a capped search needs exact_distances=True"
        n_query, n_gallery = problem.query.shape[0], problem.gallery.shape[0]
        k = min(k, n_gallery, int(problem.n_eligible.max()) if n_query else 0)
        if k == 0:
            return cls(problem, None, 0, 0, chunk_size, exact_distances, relevance)
        kp = plan.candidates_per_query(k, n_gallery)
        bf16 = low_precision.resolve(precision, problem.query.device) == "bfloat16" and problem.caps is None
        if bf16 and backend == "auto":  # faiss searches in float32 only
            backend = "torch"
        engine = plan.resolve_backend(
            backend,
            problem.query.device,
            n_query,
            n_gallery,
            kp,
            symmetric=problem.symmetric,
            # faiss cannot restrict a search to a group, nor to the other side of a bipartite search
            groups=problem.exclusions.search_groups is not None or problem.split is not None,
            half=half_rows(problem.gallery64),  # faiss would need a float32 copy of the gallery
        )
        stage: TorchStage | FaissStage
        if engine == "torch" and bf16:
            low_precision.counters["bfloat16_searches"] += 1
            kp = plan.bf16_candidates_per_query(k, n_gallery)
            stage = TorchStage(problem, chunk_size, "bfloat16")
            # distances taken from bfloat16 keys would differ from float32's: only metrics (``relevance``) skip them
            exact_distances = exact_distances or relevance is None
        elif engine == "torch":
            stage = TorchStage(problem, chunk_size)
        else:
            stage = FaissStage(problem, use_gpu=engine == "faiss-gpu")
        return cls(problem, stage, k, kp, chunk_size, exact_distances, relevance)

    def __call__(self, queries: Tensor) -> KNNResult:
        """The result of the queries at the positions ``queries``."""
        if self.stage is None:
            n, dtype, device = queries.numel(), self.problem.dtype, self.problem.query.device
            return KNNResult(
                torch.zeros((n, 0), dtype=dtype, device=device),
                torch.zeros((n, 0), dtype=torch.long, device=device),
                torch.zeros((n, 0), dtype=torch.bool, device=device),
            )
        return _search_rounds(self, self.stage, queries)


@ieee_float32_matmul()  # the certificate's rounding bound assumes IEEE float32 products
@low_precision.float32_accumulation()  # and bfloat16 products accumulated in float32
def _search_rounds(search: Search, stage: TorchStage | FaissStage, queries: Tensor) -> KNNResult:
    """Rounds of stage 1 + stage 2 over the uncertified ``queries``, doubling the candidates each round."""
    problem, k, kp, chunk_size = search.problem, search.k, search.kp, search.chunk_size
    n_gallery, device = problem.gallery.shape[0], problem.query.device
    distances = torch.empty((queries.numel(), k), dtype=problem.dtype, device=device)
    indices = torch.empty((queries.numel(), k), dtype=torch.long, device=device)
    valid = torch.empty((queries.numel(), k), dtype=torch.bool, device=device)
    pending = torch.arange(queries.numel(), device=device)  # positions within ``queries``
    first_round = True
    while pending.numel():
        group_rows = max(1, min(plan.ROUND_PAIRS // kp, chunk_size or queries.numel()))
        failed = []
        rank_rows = max(1, plan.RANK_PAIRS // kp)
        for start in range(0, pending.numel(), group_rows):
            group = pending[start : start + group_rows]
            found = stage(queries[group], kp, first_round)
            for part in range(0, group.numel(), rank_rows):  # stage 2 in smaller parts: its arrays are wider
                part_rows = slice(part, part + rank_rows)
                rows, candidates = group[part_rows], found.take(part_rows)
                ranked = rank(problem, queries[rows], candidates, k, search.exact_distances, search.relevance)
                done = rows[ranked.certified]
                distances[done] = ranked.distances[ranked.certified]
                indices[done] = ranked.indices[ranked.certified]
                valid[done] = ranked.valid[ranked.certified]
                failed.append(rows[~ranked.certified])
                advance(done.numel())
        pending = torch.cat(failed)
        if first_round:  # what the first round left undecided, by precision (low_precision.counters)
            low = isinstance(stage, TorchStage) and stage.precision == "bfloat16"
            prefix = "" if low else "float32_"
            low_precision.counters[f"{prefix}first_round_queries"] += queries.numel()
            low_precision.counters[f"{prefix}first_round_undecided"] += pending.numel()
        if first_round and isinstance(stage, TorchStage) and _falls_back(stage, pending.numel(), queries.numel()):
            stage.fall_back()
            low_precision.counters["fallbacks"] += 1
        kp = min(n_gallery, 2 * kp)
        first_round = False
    return KNNResult(distances, indices, valid)


def _falls_back(stage: TorchStage, undecided: int, n_queries: int) -> bool:
    """Whether a bfloat16 stage continues in float32: its first round left more than ``plan.BF16_FALLBACK_SHARE`` of
    the queries undecided (its bound is too wide for these data; they would take round after round)."""
    return stage.precision == "bfloat16" and undecided > plan.BF16_FALLBACK_SHARE * n_queries
