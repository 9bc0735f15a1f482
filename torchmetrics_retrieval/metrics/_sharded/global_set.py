"""The de-duplicated global set of a sharded metric, as every rank sees it: which rank holds each sample, every
small per-sample field (labels, masks, ids), and the problem over the global set, split into queries and
gallery; the embeddings stay on their rank.

Only the small fields are gathered; from them every rank builds, identically, the de-duplicated global set (its
order: by dataset index, or the rank-ordered gather order).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.problem import Problem, make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional._sets import QueryGallery, split_query_gallery
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather, gather_rows
from torchmetrics_retrieval.metrics._state import _concat, _layout, _templates, deduplicate

__all__ = ["ShardedSet", "check_rows", "global_problem", "global_rows", "placeholder_problem", "restrict_gallery"]


class ShardedSet(NamedTuple):
    """The de-duplicated global set of a sharded metric, as every rank sees it."""

    qg: QueryGallery  # the problem over the global set: positions are global rows, the embeddings placeholders
    local: Tensor  # this rank's rows (checked)
    owner: Tensor  # the rank that holds each global row ...
    row: Tensor  # ... as its local row
    group: Any  # the process group

    def whole(self) -> contextlib.AbstractContextManager[None]:
        """Inside the block the engines plan each part of the work (a tile, a visiting block, a shard) as a part of
        the whole problem: a part takes the path one process would take for the whole (the compiled kernels or
        the torch passes), not the one its own size would pick."""
        return plan.part_of(self.qg.query.shape[0], self.qg.gallery.shape[0])


def restrict_gallery(qg: QueryGallery, rows: Tensor, gallery: Tensor) -> QueryGallery:
    """The problem with its gallery cut to ``rows`` (the embeddings ``gallery``), rules and self index remapped."""
    remap = torch.full((qg.gallery.shape[0],), -1, dtype=torch.long, device=rows.device)
    remap[rows] = torch.arange(rows.numel(), device=rows.device)
    own = torch.where(qg.self_index >= 0, remap[qg.self_index.clamp(min=0)], -1)

    def side(ids: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
        return None if ids is None else (ids[0], ids[1][rows])

    return qg._replace(
        gallery=gallery,
        gallery_labels=qg.gallery_labels[rows],
        self_index=own,
        gallery_positions=qg.gallery_positions[rows],
        sequence_ids=side(qg.sequence_ids),
        search_groups=side(qg.search_groups),
        camera_labels=side(qg.camera_labels),
        same_set=False,
    )


def global_rows(metric: Any, group: Any) -> tuple[Tensor, dict[str, Tensor | None], Tensor, Tensor, Tensor | None]:
    """``(local embeddings, small fields, owner, row, indexes)``: the samples of a :class:`SampleAccumulator` (its
    first field the embeddings) as one de-duplicated global set: the small fields of every sample by field
    name (every field but those of kind ``embeddings``, which stay local), the rank that holds each sample and
    its row there, and the dataset indexes (None without them)."""
    embeddings_name = metric._fields[0].name
    index_name = next((spec.name for spec in metric._fields if spec.kind == "indexes"), None)
    local = {spec.name: _concat(getattr(metric, spec.name)) for spec in metric._fields}
    layouts = torch.stack(gather(_layout(local, metric._fields, metric.device), group))
    templates = _templates(layouts, metric._fields)
    for spec in metric._fields:  # a rank without samples takes zero rows of the right shape and dtype
        template = templates[spec.name]
        if local[spec.name] is None and template is not None:
            local[spec.name] = torch.zeros((0, *template[1:]), dtype=template[0], device=metric.device)
    if templates[embeddings_name] is None:
        raise ValueError(
            f"{metric.__class__.__name__}.compute() needs at least one sample, got none: call update() with a "
            "non-empty batch first (on at least one process)."
        )
    counts = layouts[:, 0, 0].tolist()  # the first field's rows: the embeddings'
    owner = torch.cat([torch.full((c,), r, device=metric.device) for r, c in enumerate(counts)])
    row = torch.cat([torch.arange(c, device=metric.device) for c in counts])
    small: dict[str, Tensor | None] = {spec.name: None for spec in metric._fields if spec.kind != "embeddings"}
    small.update(gather_rows({name: value for name in small if (value := local[name]) is not None}, group))
    indexes = small.pop(index_name) if index_name is not None else None
    small.update(_owner=owner, _row=row)
    if indexes is not None:
        small, indexes = deduplicate(small, indexes)
    return local[embeddings_name], small, small.pop("_owner"), small.pop("_row"), indexes  # type: ignore[return-value]


def check_rows(local: Tensor, distance: str, group: Any, name: str = "embeddings") -> None:
    """The engine's checks of the rows (norms within float32 keys, no zero row for cosine), on every rank at
    once: a rank that found a bad row must not leave the others waiting in the next collective."""
    message = ""
    try:
        # (float64 rows read on demand: the checks need only the norms, not a float64 copy of the shard)
        make_problem(local, local, distance, Exclusions(None, None, None), True, names=(name, ""), lazy64=True)
    except ValueError as error:
        message = str(error)
    flags = torch.tensor([len(message) > 0], dtype=torch.long, device=local.device)
    all_reduce(flags, group)
    if int(flags):
        raise ValueError(message or f"`{name}` of {int(flags)} other process(es) failed the checks of the rows.")


def global_problem(metric: Any, group: Any, distance: str) -> tuple[ShardedSet, Tensor | None]:
    """``(sharded set, indexes)`` of a metric with ``embeddings``, ``labels`` and the optional fields of
    ``EmbeddingMetrics``: :func:`global_rows`, the local rows checked on every rank, and the global set split
    into queries and gallery by its small fields (``qg``'s embeddings are placeholders, its positions global)."""
    local, small, owner, row, indexes = global_rows(metric, group)
    check_rows(local, distance, group)
    labels = small.pop("labels")
    assert labels is not None
    placeholder = local.new_zeros((1, 1)).expand(owner.numel(), 1)  # the split needs no embedding
    qg = split_query_gallery(placeholder, labels, **{k: v for k, v in small.items() if v is not None})
    return ShardedSet(qg, local, owner, row, group), indexes


def placeholder_problem(qg: QueryGallery, distance: str, sq64: Tensor | None = None) -> Problem:
    """The problem of the global set ``qg``: its rules, self index, symmetry and dtype, for the passes that read
    pairs tile by tile; its rows are placeholders (a pass brings the rows of its tiles), and ``sq64`` the squared
    norms by global position, when the pass needs them."""
    ones = qg.query.new_ones((qg.query.shape[0], 1))
    gallery = ones if qg.same_set else qg.gallery.new_ones((qg.gallery.shape[0], 1))
    problem = make_problem(ones, gallery, distance, qg.exclusions(), qg.same_set)
    if sq64 is None:
        return problem
    query_sq = sq64[qg.query_positions]
    return problem._replace(query_sq64=query_sq, gallery_sq64=query_sq if qg.same_set else sq64[qg.gallery_positions])
