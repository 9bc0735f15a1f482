"""Turn the user's description of a retrieval problem into one query set and one gallery set.

Two ways to describe it, as in ``retrieval_metrics``:

* ``gallery=None``: the first pair of arguments is the whole set; ``is_query`` / ``is_gallery``
  (missing = all True) pick the queries and the gallery items. A sample that is both is
  excluded from its own gallery *by position* (``self_index``), never by comparing vectors.
* ``gallery`` given: two disjoint sets; no self exclusion.

Per-sample ``sequence_ids``, ``search_groups`` and ``categories`` follow the same rule: with
``gallery=None`` one tensor for the whole set, otherwise a ``(query_side, gallery_side)`` pair
(``categories`` only concern queries, so with a separate gallery it is a query-side tensor).
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_embeddings,
    check_id_pair,
    check_ids,
    check_labels,
    check_mask,
    describe,
)
from torchmetrics_retrieval.functional._search.types import Exclusions

__all__ = ["PairedIds", "QueryGallery", "SampleFields", "split_query_gallery"]

PairedIds = Tensor | tuple[Tensor, Tensor]


class SampleFields(TypedDict, total=False):
    """The optional per-sample fields of :func:`split_query_gallery`, for the internal callers that pass them on."""

    is_query: Tensor | None
    is_gallery: Tensor | None
    sequence_ids: PairedIds | None
    search_groups: PairedIds | None
    categories: Tensor | None
    camera_ids: PairedIds | None


class QueryGallery(NamedTuple):
    """A retrieval problem in canonical form.

    Attributes:
        query: ``(Q, D)`` query embeddings.
        query_labels: ``(Q,)`` or ``(Q, L)`` labels of the queries.
        gallery: ``(G, D)`` gallery embeddings.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels of the gallery items.
        self_index: ``(Q,)`` int64: position of each query inside the gallery, -1 if it is not there.
        query_positions: ``(Q,)`` int64 positions of the queries in the input set.
        gallery_positions: ``(G,)`` int64 positions of the gallery items in the input set.
        sequence_ids: ``(query_side, gallery_side)`` or None.
        search_groups: ``(query_side, gallery_side)`` or None.
        camera_labels: ``(query_side, gallery_side)`` ids of (label, camera), equal when both are (the camera
            protocol: such an item is left out of the query's gallery), or None.
        query_categories: ``(Q,)`` categories of the queries or None.
        same_set: one set searched against itself (every sample a query and a gallery item, in order):
            ``query`` and ``gallery`` hold the same rows, and a search may take its symmetric path.
    """

    query: Tensor
    query_labels: Tensor
    gallery: Tensor
    gallery_labels: Tensor
    self_index: Tensor
    query_positions: Tensor
    gallery_positions: Tensor
    sequence_ids: tuple[Tensor, Tensor] | None
    search_groups: tuple[Tensor, Tensor] | None
    query_categories: Tensor | None
    same_set: bool
    camera_labels: tuple[Tensor, Tensor] | None = None

    def exclusions(self) -> Exclusions:
        """The exclusion rules of the search (no self rule when no query is in the gallery)."""
        own = self.self_index if bool((self.self_index >= 0).any()) else None
        identity = self.same_set and own is not None  # then query i is gallery item i
        return Exclusions(own, self.sequence_ids, self.search_groups, self.camera_labels, self_is_identity=identity)

    def take(self, rows: Tensor) -> QueryGallery:
        """The problem restricted to the queries ``rows`` (the gallery is unchanged; no longer ``same_set``)."""
        return self._replace(
            query=self.query[rows],
            query_labels=self.query_labels[rows],
            self_index=self.self_index[rows],
            query_positions=self.query_positions[rows],
            sequence_ids=None if self.sequence_ids is None else (self.sequence_ids[0][rows], self.sequence_ids[1]),
            search_groups=None if self.search_groups is None else (self.search_groups[0][rows], self.search_groups[1]),
            camera_labels=None if self.camera_labels is None else (self.camera_labels[0][rows], self.camera_labels[1]),
            query_categories=None if self.query_categories is None else self.query_categories[rows],
            same_set=False,
        )


def _split_ids(
    name: str, value: PairedIds | None, query_rows: Tensor, gallery_rows: Tensor, n: int
) -> tuple[Tensor, Tensor] | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        raise TypeError(f"`{name}` must be one tensor for the whole set when `gallery` is None, got a tuple.")
    check_ids(name, value, n, "query")
    value = value.to(query_rows.device)
    return value[query_rows], value[gallery_rows]


def split_query_gallery(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    categories: Tensor | None = None,
    camera_ids: PairedIds | None = None,
) -> QueryGallery:
    """Validate the inputs (named as ``retrieval_metrics`` names them) and return the :class:`QueryGallery`.

    Raises:
        TypeError, ValueError: naming the argument and the value, for any malformed input, an
            empty query set or an empty gallery.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> qg = split_query_gallery(x, torch.tensor([0, 0, 1]), is_query=torch.tensor([True, False, True]))
        >>> qg.query.shape, qg.gallery.shape, qg.self_index.tolist()
        (torch.Size([2, 1]), torch.Size([3, 1]), [0, 2])
    """
    check_embeddings("query", query)
    check_labels("query_labels", query_labels, query.shape[0], "query")
    if categories is not None:
        check_ids("categories", categories, query.shape[0], "query", integer=False)
    if gallery is None:
        if gallery_labels is not None:
            raise ValueError("`gallery_labels` must be None when `gallery` is None, got a tensor.")
        qg = _split_one_set(query, query_labels, is_query, is_gallery, sequence_ids, search_groups, categories)
        cameras = _split_ids("camera_ids", camera_ids, qg.query_positions, qg.gallery_positions, query.shape[0])
    else:
        if is_query is not None or is_gallery is not None:
            raise ValueError(
                "`is_query` and `is_gallery` must be None when `gallery` is given (the sets are separate)."
            )
        qg = _two_sets(query, query_labels, gallery, gallery_labels, sequence_ids, search_groups, categories)
        n_gallery = qg.gallery.shape[0]
        cameras = None
        if camera_ids is not None:
            cameras = check_id_pair("camera_ids", camera_ids, query.shape[0], n_gallery, query.device)
    return qg if cameras is None else qg._replace(camera_labels=_label_cameras(qg, cameras))


def _label_cameras(qg: QueryGallery, cameras: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """One id per (label, camera) on both sides (a 2-D label compared as a whole), equal when both are."""
    labels = torch.cat([qg.query_labels, qg.gallery_labels])
    _, label_ids = torch.unique(labels, dim=0 if labels.ndim == 2 else None, return_inverse=True)
    _, camera_ids = torch.unique(torch.cat(cameras), return_inverse=True)
    # one int64 per (label, camera) pair: 1-D unique is far faster than unique over rows
    _, ids = torch.unique(label_ids * (int(camera_ids.max()) + 1) + camera_ids, return_inverse=True)
    n_query = qg.query.shape[0]
    return ids[:n_query], ids[n_query:]


def _split_one_set(
    x: Tensor,
    labels: Tensor,
    is_query: Tensor | None,
    is_gallery: Tensor | None,
    sequence_ids: PairedIds | None,
    search_groups: PairedIds | None,
    categories: Tensor | None,
) -> QueryGallery:
    """One set split by the masks; a sample that is both a query and a gallery item is its own ``self_index``."""
    n, device = x.shape[0], x.device
    query_rows = torch.ones(n, dtype=torch.bool, device=device)
    gallery_rows = torch.ones(n, dtype=torch.bool, device=device)
    if is_query is not None:
        query_rows = check_mask("is_query", is_query, n, "query").to(device)
    if is_gallery is not None:
        gallery_rows = check_mask("is_gallery", is_gallery, n, "query").to(device)
    query_positions = torch.nonzero(query_rows).flatten()
    gallery_positions = torch.nonzero(gallery_rows).flatten()
    if query_positions.numel() == 0:
        raise ValueError("`is_query` must select at least one sample, got none.")
    if gallery_positions.numel() == 0:
        raise ValueError("`is_gallery` must select at least one sample, got none.")
    position_in_gallery = torch.full((n,), -1, dtype=torch.long, device=device)
    position_in_gallery[gallery_positions] = torch.arange(gallery_positions.numel(), device=device)
    same_set = is_query is None and is_gallery is None  # then no copy of the rows: both sides are ``x``
    # a side that takes every sample is ``x`` itself, not a copy (e.g. a few queries against the whole set)
    every_query, every_item = same_set or query_positions.numel() == n, same_set or gallery_positions.numel() == n
    return QueryGallery(
        query=x if every_query else x[query_positions],
        query_labels=labels if every_query else labels[query_positions],
        gallery=x if every_item else x[gallery_positions],
        gallery_labels=labels if every_item else labels[gallery_positions],
        self_index=position_in_gallery[query_positions],
        query_positions=query_positions,
        gallery_positions=gallery_positions,
        sequence_ids=_split_ids("sequence_ids", sequence_ids, query_positions, gallery_positions, n),
        search_groups=_split_ids("search_groups", search_groups, query_positions, gallery_positions, n),
        query_categories=None if categories is None else categories.to(device)[query_positions],
        same_set=same_set,
    )


def _two_sets(
    query: Tensor,
    query_labels: Tensor,
    gallery: object,
    gallery_labels: Tensor | None,
    sequence_ids: PairedIds | None,
    search_groups: PairedIds | None,
    categories: Tensor | None,
) -> QueryGallery:
    """A query set and a separate gallery: no self exclusion."""
    n = query.shape[0]
    gallery = check_embeddings("gallery", gallery)
    if gallery_labels is None:
        raise ValueError("`gallery_labels` must be given with `gallery`, got None.")
    n_gallery = gallery.shape[0]
    check_labels("gallery_labels", gallery_labels, n_gallery, "gallery")
    if gallery.shape[1] != query.shape[1]:
        raise ValueError(f"`gallery` must have {query.shape[1]} columns like `query`, got {describe(gallery)}.")
    if gallery_labels.shape[1:] != query_labels.shape[1:]:
        raise ValueError(
            f"`gallery_labels` must have the label shape {tuple(query_labels.shape[1:])} of `query_labels`, "
            f"got {describe(gallery_labels)}."
        )
    device = query.device
    return QueryGallery(
        query=query,
        query_labels=query_labels,
        gallery=gallery.to(device),
        gallery_labels=gallery_labels.to(device),
        self_index=torch.full((n,), -1, dtype=torch.long, device=device),
        query_positions=torch.arange(n, device=device),
        gallery_positions=torch.arange(n_gallery, device=device),
        sequence_ids=None
        if sequence_ids is None
        else check_id_pair("sequence_ids", sequence_ids, n, n_gallery, device),
        search_groups=None
        if search_groups is None
        else check_id_pair("search_groups", search_groups, n, n_gallery, device),
        query_categories=categories,
        same_set=False,
    )
