"""Which retrieved items are relevant to their query, and how many relevant items each query has.

Relevance is decided by the labels. By default two samples match when their whole label rows are
equal (1-D labels: the values; 2-D labels: every column), compared in the labels' own dtype, so
int64 labels above 2**24 never collide. A custom ``label_comparison_fn`` follows
pytorch-metric-learning's convention: it is called on broadcast tensors,
``fn(query_labels[:, None], gallery_labels[None, :])`` (2-D labels keep their last dimension), and
must return a bool tensor of the broadcast shape (without the label dimension).

Each public function checks its arguments (cheap shape and dtype checks, one min/max for positions) and
calls its private ``_<name>_compute`` twin, which internal callers holding checked data call directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_callable,
    check_id_pair,
    check_label_shape,
    check_labels,
    check_same_length,
    check_self_index,
    describe,
)
from torchmetrics_retrieval.functional._search.types import Exclusions

__all__ = ["LabelComparisonFn", "count_relevant", "label_match", "relevance_matrix"]

LabelComparisonFn = Callable[[Tensor, Tensor], Tensor]

_DEFAULT_CHUNK_PAIRS = 1 << 24  # label pairs compared at once by the block-wise counting of a custom fn


def _checked_match(result: Tensor, shape: tuple[int, ...]) -> Tensor:
    if not isinstance(result, Tensor) or result.dtype != torch.bool:
        raise TypeError(f"`label_comparison_fn` must return a bool tensor, got {describe(result)}.")
    if tuple(result.shape) != shape:
        raise ValueError(
            f"`label_comparison_fn` must return a tensor of shape {shape} for these inputs, got {describe(result)}."
        )
    return result


def _check_label_pair(query_labels: object, gallery_labels: object, label_comparison_fn: object) -> None:
    """Both sides 1-D or 2-D, finite; the same label shape unless a custom comparison decides."""
    query_labels = check_labels("query_labels", query_labels, None)
    gallery_labels = check_labels("gallery_labels", gallery_labels, None)
    check_callable("label_comparison_fn", label_comparison_fn)
    if label_comparison_fn is None:
        check_label_shape("gallery_labels", gallery_labels, query_labels, "query_labels")


def label_match(
    query_labels: Tensor, gallery_labels: Tensor, label_comparison_fn: LabelComparisonFn | None = None
) -> Tensor:
    """All-pairs label match of a block of queries against a block of gallery items.

    Args:
        query_labels: ``(q,)`` or ``(q, L)`` labels.
        gallery_labels: ``(g,)`` or ``(g, L)`` labels, same label shape (unless ``label_comparison_fn`` is
            given) and a comparable dtype.
        label_comparison_fn: optional custom comparison (see the module docstring).

    Returns:
        ``(q, g)`` bool tensor, True where the gallery item is relevant to the query.

    Raises:
        TypeError, ValueError: labels not 1-D or 2-D tensors, or NaN; label shapes that differ;
            ``label_comparison_fn`` not callable or returning other than a ``(q, g)`` bool tensor.

    Example:
        >>> label_match(torch.tensor([1, 2]), torch.tensor([2, 2, 1]))
        tensor([[False, False,  True],
                [ True,  True, False]])
    """
    _check_label_pair(query_labels, gallery_labels, label_comparison_fn)
    return _label_match_compute(query_labels, gallery_labels, label_comparison_fn)


def _label_match_compute(
    query_labels: Tensor, gallery_labels: Tensor, label_comparison_fn: LabelComparisonFn | None
) -> Tensor:
    """:func:`label_match` of checked labels (the result of a custom comparison is still checked)."""
    shape = (query_labels.shape[0], gallery_labels.shape[0])
    if label_comparison_fn is not None:
        return _checked_match(label_comparison_fn(query_labels[:, None], gallery_labels[None, :]), shape)
    match = query_labels[:, None] == gallery_labels[None, :]
    return match.all(dim=-1) if query_labels.ndim == 2 else match


def relevance_matrix(
    query_labels: Tensor,
    gallery_labels: Tensor,
    indices: Tensor,
    valid: Tensor | None = None,
    label_comparison_fn: LabelComparisonFn | None = None,
) -> Tensor:
    """The ``(Q, K)`` hit matrix of a retrieval: is the k-th neighbour of query q relevant?

    Args:
        query_labels: ``(Q,)`` or ``(Q, L)`` labels of the queries.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels of the gallery (the label shape of ``query_labels``
            unless ``label_comparison_fn`` is given).
        indices: ``(Q, K)`` integer gallery positions of the retrieved items, in ``[0, G)``.
        valid: optional ``(Q, K)`` bool; invalid slots are never relevant.
        label_comparison_fn: optional custom comparison, called as ``fn(query_labels[:, None], retrieved_labels)``.

    Returns:
        ``(Q, K)`` bool tensor.

    Raises:
        TypeError, ValueError: bad labels (as :func:`label_match`); ``indices`` not a 2-D integer tensor with
            one row per query and positions in ``[0, G)``; ``valid`` not a bool tensor of the shape of ``indices``.

    Example:
        >>> relevance_matrix(torch.tensor([1, 2]), torch.tensor([2, 2, 1]), torch.tensor([[2, 0], [1, 2]]))
        tensor([[ True, False],
                [ True, False]])
    """
    _check_label_pair(query_labels, gallery_labels, label_comparison_fn)
    _check_retrieved(indices, valid, query_labels.shape[0], gallery_labels.shape[0])
    return _relevance_matrix_compute(query_labels, gallery_labels, indices, valid, label_comparison_fn)


def _check_retrieved(indices: object, valid: object, n_query: int, n_gallery: int) -> None:
    if not isinstance(indices, Tensor):
        raise TypeError(f"`indices` must be an integer torch.Tensor of shape (Q, K), got {describe(indices)}.")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise TypeError(f"`indices` must have an integer dtype, got {describe(indices)}.")
    if indices.ndim != 2:
        raise ValueError(f"`indices` must be 2-D of shape (Q, K), got {describe(indices)}.")
    check_same_length("indices", indices, n_query, "query_labels")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= n_gallery):
        raise ValueError(
            f"`indices` must hold gallery positions in [0, {n_gallery}) like the rows of `gallery_labels`, "
            f"got values in [{int(indices.min())}, {int(indices.max())}]."
        )
    if valid is None:
        return
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool:
        raise TypeError(f"`valid` must be a bool torch.Tensor, got {describe(valid)}.")
    if valid.shape != indices.shape:
        raise ValueError(f"`valid` must have the shape {tuple(indices.shape)} of `indices`, got {describe(valid)}.")


def _relevance_matrix_compute(
    query_labels: Tensor,
    gallery_labels: Tensor,
    indices: Tensor,
    valid: Tensor | None,
    label_comparison_fn: LabelComparisonFn | None,
) -> Tensor:
    """:func:`relevance_matrix` of checked arguments (the result of a custom comparison is still checked)."""
    retrieved = gallery_labels[indices]
    if label_comparison_fn is not None:
        hits = _checked_match(label_comparison_fn(query_labels[:, None], retrieved), tuple(indices.shape))
    else:
        hits = query_labels[:, None] == retrieved
        hits = hits.all(dim=-1) if query_labels.ndim == 2 else hits
    return hits & valid if valid is not None else hits


def _encode_rows(*columns: Tensor) -> Tensor:
    """Map rows made of the given columns (1-D or 2-D each, same length) to dense int64 ids."""
    parts = [c.reshape(c.shape[0], -1) for c in columns]
    if len(parts) == 1 and parts[0].shape[1] == 1:
        return torch.unique(parts[0][:, 0], return_inverse=True)[1]
    if any(p.dtype != parts[0].dtype for p in parts):
        # Encode each column on its own first: ids are int64, so no value is ever cast to another dtype.
        parts = [_encode_rows(p)[:, None] for p in parts]
    return torch.unique(torch.cat(parts, dim=1), dim=0, return_inverse=True)[1]


def _count_relevant_by_equality(
    query_labels: Tensor,
    gallery_labels: Tensor,
    self_index: Tensor,
    sequence_ids: tuple[Tensor, Tensor] | None,
    search_groups: tuple[Tensor, Tensor] | None,
    camera_labels: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Exact counts for the default comparison by sorting-based encoding (no pair is ever formed).

    Relevant items share the query's label (and group). Those sharing its sequence, or (being of its label) its
    camera, are left out, by inclusion-exclusion over the two rules; the query itself is one of them.
    """
    n_query = query_labels.shape[0]
    columns = [torch.cat([query_labels, gallery_labels])]
    if search_groups is not None:
        columns.append(torch.cat(search_groups))
    key = _encode_rows(*columns)

    def sharing(*rules: tuple[Tensor, Tensor]) -> Tensor:
        combined = _encode_rows(key, *(torch.cat(rule) for rule in rules)) if rules else key
        return torch.bincount(combined[n_query:], minlength=int(combined.max()) + 1)[combined[:n_query]]

    rules = [rule for rule in (sequence_ids, camera_labels) if rule is not None]
    counts = sharing()
    if not rules:
        return counts - (self_index >= 0).long()
    counts = counts - sum((sharing(rule) for rule in rules), torch.zeros_like(counts))
    return counts + sharing(*rules) if len(rules) == 2 else counts


def count_relevant(
    query_labels: Tensor,
    gallery_labels: Tensor,
    *,
    self_index: Tensor | None = None,
    sequence_ids: tuple[Tensor, Tensor] | None = None,
    search_groups: tuple[Tensor, Tensor] | None = None,
    label_comparison_fn: LabelComparisonFn | None = None,
) -> Tensor:
    """n(q): the number of relevant items in the gallery of each query, G(q).

    G(q) is the gallery minus the query itself (``self_index[q]``, its gallery position or -1),
    minus items sharing its sequence id, restricted to its search group (see docs/definitions.md).
    With the default comparison the counts come from a sort-based encoding of the labels (no
    query x gallery pairs); a custom ``label_comparison_fn`` is evaluated block by block.

    Args:
        query_labels: ``(Q,)`` or ``(Q, L)`` labels of the queries.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels of the gallery (the label shape of ``query_labels``
            unless ``label_comparison_fn`` is given).
        self_index: optional ``(Q,)`` int64 gallery position of each query, -1 when it is not in the gallery.
        sequence_ids: optional ``(query side (Q,), gallery side (G,))`` pair of integer ids.
        search_groups: optional ``(query side (Q,), gallery side (G,))`` pair of integer ids.
        label_comparison_fn: optional custom comparison (see the module docstring).

    Returns:
        ``(Q,)`` int64 counts, on the device of ``query_labels``.

    Raises:
        TypeError, ValueError: bad labels (as :func:`label_match`); ``self_index``, ``sequence_ids`` or
            ``search_groups`` not of the form above.

    Example:
        >>> labels = torch.tensor([7, 7, 7, 3])
        >>> count_relevant(labels, labels, self_index=torch.arange(4)).tolist()
        [2, 2, 2, 0]
    """
    _check_label_pair(query_labels, gallery_labels, label_comparison_fn)
    n_query, n_gallery, device = query_labels.shape[0], gallery_labels.shape[0], query_labels.device
    if self_index is not None:
        self_index = check_self_index("self_index", self_index, n_query, n_gallery, "query_labels").to(device)
    sides = ("query_labels", "gallery_labels")
    sequence_ids = check_id_pair("sequence_ids", sequence_ids, n_query, n_gallery, device, sides=sides, when="")
    search_groups = check_id_pair("search_groups", search_groups, n_query, n_gallery, device, sides=sides, when="")
    return _count_relevant_compute(
        query_labels, gallery_labels, self_index, sequence_ids, search_groups, label_comparison_fn
    )


def _count_relevant_compute(
    query_labels: Tensor,
    gallery_labels: Tensor,
    self_index: Tensor | None,
    sequence_ids: tuple[Tensor, Tensor] | None,
    search_groups: tuple[Tensor, Tensor] | None,
    label_comparison_fn: LabelComparisonFn | None,
    camera_labels: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """:func:`count_relevant` of checked arguments, all on the device of ``query_labels``."""
    n_query = query_labels.shape[0]
    if self_index is None:
        self_index = torch.full((n_query,), -1, dtype=torch.long, device=query_labels.device)
    if label_comparison_fn is None:
        return _count_relevant_by_equality(
            query_labels, gallery_labels, self_index, sequence_ids, search_groups, camera_labels
        )

    n_gallery = gallery_labels.shape[0]
    counts = torch.zeros(n_query, dtype=torch.long, device=query_labels.device)
    rows = max(1, min(n_query, _DEFAULT_CHUNK_PAIRS // max(1, n_gallery)))
    cols = max(1, min(n_gallery, _DEFAULT_CHUNK_PAIRS // rows))
    exclusions = Exclusions(self_index, sequence_ids, search_groups, camera_labels)
    for q0 in range(0, n_query, rows):
        q1 = min(q0 + rows, n_query)
        for g0 in range(0, n_gallery, cols):
            g1 = min(g0 + cols, n_gallery)
            match = _label_match_compute(query_labels[q0:q1], gallery_labels[g0:g1], label_comparison_fn)
            exclusions.fill_excluded_(match, slice(q0, q1), slice(g0, g1), False)
            counts[q0:q1] += match.sum(dim=1)
    return counts


def _dense_label_ids(query_labels: Tensor, gallery_labels: Tensor) -> tuple[Tensor, Tensor]:
    """Both sides' labels as int64 ids, equal exactly when the labels are equal (rows of 2-D labels as a whole)."""
    labels = torch.cat([query_labels, gallery_labels])
    _, ids = torch.unique(labels, dim=0 if labels.ndim == 2 else None, return_inverse=True)
    return ids[: query_labels.shape[0]], ids[query_labels.shape[0] :]
