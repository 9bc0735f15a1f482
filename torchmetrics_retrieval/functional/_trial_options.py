"""The options of :func:`~torchmetrics_retrieval.functional.trial_metrics` beyond plain rows: templates pooled
first (:func:`~torchmetrics_retrieval.functional.pool_templates`), and trial scores normalised against a cohort
(:func:`~torchmetrics_retrieval.functional.normalize_scores`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_choice, check_ids
from torchmetrics_retrieval.functional.score_norm import SCORE_NORMS, normalize_scores
from torchmetrics_retrieval.functional.templates import pool_templates

__all__ = ["check_norm_options", "normalised_scores", "pooled_embeddings"]


def check_norm_options(score_norm: Any, cohort: Any, top_n: Any, embedding_ids: Any, cohort_ids: Any) -> None:
    """``score_norm`` one of the methods or None; the cohort options given with it only, a cohort required by it."""
    if score_norm is None:
        given = {"cohort": cohort, "top_n": top_n, "embedding_ids": embedding_ids, "cohort_ids": cohort_ids}
        for name, value in given.items():
            if value is not None:
                raise ValueError(
                    f"`{name}` is used with `score_norm` only (the normalisation of the trial scores), "
                    f"got `{name}` with score_norm=None."
                )
        return
    check_choice("score_norm", score_norm, SCORE_NORMS)
    if (top_n is None) == (score_norm == "as"):  # the messages of normalize_scores would say `method`
        need = "must be given with score_norm='as'" if top_n is None else "is used with score_norm='as' only"
        raise ValueError(
            f"`top_n` {need} (the highest cohort scores kept per side), got top_n={top_n!r} with "
            f"score_norm={score_norm!r}."
        )
    if cohort is None:
        raise ValueError(
            f"`cohort` must be given with `score_norm` (the embeddings the scores are normalised against), "
            f"got None with score_norm={score_norm!r}."
        )


def pooled_embeddings(
    embeddings: Tensor, template_ids: Any, media_ids: Any, embedding_ids: Any
) -> tuple[Tensor, Tensor | None, Any]:
    """``(embeddings, ids, embedding_ids)``: the rows of the trials. With ``template_ids``, the pooled templates,
    their sorted ids, and ``embedding_ids`` (one per embedding, one per template) reduced to one per template."""
    if template_ids is None:
        if media_ids is not None:
            raise ValueError("`media_ids` is used with `template_ids` only (the media of each template), got None.")
        return embeddings, None, embedding_ids
    pooled, ids = pool_templates(embeddings, template_ids, media_ids)
    if embedding_ids is not None:
        embedding_ids = _template_ids_of(embedding_ids, template_ids, embeddings)
    return pooled, ids, embedding_ids


def _template_ids_of(embedding_ids: Any, template_ids: Tensor, embeddings: Tensor) -> Tensor:
    """One identity per template (in the order of the sorted template ids): the one its embeddings share."""
    values = check_ids("embedding_ids", embedding_ids, embeddings.shape[0], "embeddings").to(embeddings.device)
    values = values.to(torch.long)
    _, group = torch.unique(template_ids.to(embeddings.device), sorted=True, return_inverse=True)
    n = int(group.max()) + 1
    low = torch.full((n,), torch.iinfo(torch.long).max, device=values.device).scatter_reduce(0, group, values, "amin")
    high = torch.full((n,), torch.iinfo(torch.long).min, device=values.device).scatter_reduce(0, group, values, "amax")
    mixed = (low != high).nonzero().flatten()
    if mixed.numel():
        row = int((group == mixed[0]).nonzero()[0])
        raise ValueError(
            f"`embedding_ids` must give every embedding of a template one identity, got {int(low[mixed[0]])} and "
            f"{int(high[mixed[0]])} in the template of `template_ids` {template_ids[row].item()!r}."
        )
    return low


def normalised_scores(
    scores: Tensor,
    embeddings: Tensor,
    enrol: Tensor,
    test: Tensor,
    cohort: Tensor,
    options: dict[str, Any],
) -> Tensor:
    """:func:`normalize_scores` of the trial scores; a trial whose normalised score is NaN is an error here."""
    out = normalize_scores(scores, embeddings, enrol, test, cohort, **options)
    n_undefined = int(out.isnan().sum())
    if n_undefined:
        raise ValueError(
            f"`cohort` must give every normalised side a spread, got {n_undefined} trial(s) of {out.numel()} whose "
            f"normalised score is NaN (all cohort scores of one side equal: a cohort of one item, or top_n=1)."
        )
    return out
