r"""Set-to-set verification: pool the embeddings of a template (IJB-B/C) into one vector.

A *template* is a set of images and video frames of one identity; the frames of one video form one *media*.
IJB evaluation pools them in two steps, so that a long video counts as much as one still image:

.. math::
    m_{t,k} = \frac{1}{|M_{t,k}|} \sum_{i \in M_{t,k}} \frac{x_i}{\|x_i\|}, \qquad
    \bar t = \frac{1}{K_t} \sum_{k=1}^{K_t} m_{t,k}, \qquad
    \mathrm{pooled}_t = \frac{\bar t}{\|\bar t\|},

where :math:`M_{t,k}` holds the embeddings of media ``k`` of template ``t`` and :math:`K_t` is the number of
media of template ``t``. Definitions and the reason for the last step: docs/definitions.md, section Templates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_embeddings, check_ids

__all__ = ["pool_templates"]


def _template_tensor_validation(
    embeddings: Any, template_ids: Any, media_ids: Any
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Checked inputs, the ids on the embeddings' device, and the row norms (float64) of the embeddings."""
    embeddings = check_embeddings("embeddings", embeddings)
    n = embeddings.shape[0]
    template_ids = check_ids("template_ids", template_ids, n, "embeddings").to(embeddings.device)
    if media_ids is not None:
        media_ids = check_ids("media_ids", media_ids, n, "embeddings").to(embeddings.device)
    # float64: a float32 row of tiny values can have a norm that underflows to 0 in float32 but not here.
    norms = torch.linalg.vector_norm(embeddings.to(torch.float64), dim=1)
    zero = (norms == 0).nonzero().flatten()
    if zero.numel():
        raise ValueError(
            f"`embeddings` must have no zero row (it has no direction to normalise), got {zero.numel()} zero "
            f"row(s), the first at position {int(zero[0])} of {n}."
        )
    return embeddings, template_ids, media_ids, norms


def pool_templates(embeddings: Tensor, template_ids: Tensor, media_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""Pool embeddings into one unit vector per template: the mean of the media means of the L2-normalised
    embeddings, as IJB-B/C evaluation does, normalised again to unit L2 norm.

    Every embedding is scaled to unit norm; the embeddings of one ``(template, media)`` pair are averaged into a
    media mean; the media means of a template are averaged (each media counts once, however many frames it
    has); the result is scaled to unit norm. Without ``media_ids`` every embedding is a media of its own, so the
    template vector is the normalised mean of its normalised embeddings.

    The last normalisation is what the IJB scripts do before cosine scoring. Cosine distance does not see it,
    but the other distances do: with unit vectors ``euclidean`` is :math:`\sqrt{2 - 2\cos}`, ``sqeuclidean``
    :math:`2 - 2\cos` and ``dot`` :math:`-\cos`, so every distance ranks template pairs exactly as the
    protocol's cosine score does. Without it a template whose media disagree would have a shorter mean
    vector, and euclidean or dot scores would judge it by that length too.

    Sums are accumulated in float64 (``index_add_`` over the inverse indices of ``torch.unique``, no loop over
    templates or media), then cast to the dtype of ``embeddings``.

    Args:
        embeddings: ``(N, D)`` floating, finite, no zero row.
        template_ids: ``(N,)`` integer (or bool) template id of each embedding.
        media_ids: ``(N,)`` integer (or bool) media id of each embedding, or None (each embedding its own
            media). Media ids are read within a template: the same media id in two templates is two media.

    Returns:
        ``(pooled (T, D), ids (T,))``: one unit vector per distinct template id, in the dtype and on the device
        of ``embeddings``, and the template ids sorted ascending (dtype of ``template_ids``); row ``j`` of
        ``pooled`` is template ``ids[j]``.

    Raises:
        TypeError, ValueError: naming the argument, for malformed inputs (wrong shape or dtype, a length that
            differs from the rows of ``embeddings``, no rows, NaN or inf, a zero row), and a ``ValueError``
            naming the template whose media means add up to the zero vector.

    Example:
        Template 7 has a still image (media 0) and two frames of one video (media 1); template 9 one image.

        >>> x = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 5.0], [-2.0, 0.0]])
        >>> pooled, ids = pool_templates(x, torch.tensor([7, 7, 7, 9]), torch.tensor([0, 1, 1, 0]))
        >>> ids.tolist()
        [7, 9]
        >>> pooled  # template 7: the mean of (1, 0) and (0, 1), normalised
        tensor([[ 0.7071,  0.7071],
                [-1.0000,  0.0000]])
    """
    embeddings, template_ids, media_ids, norms = _template_tensor_validation(embeddings, template_ids, media_ids)
    unit = embeddings.to(torch.float64) / norms[:, None]
    ids, template_of_row = torch.unique(template_ids, sorted=True, return_inverse=True)
    if media_ids is None:
        media_means, template_of_media = unit, template_of_row
    else:
        # One (template, media) pair per distinct column: the same media id in two templates stays two media.
        pairs, media_of_row = torch.unique(
            torch.stack([template_of_row, media_ids.to(torch.int64)]), dim=1, return_inverse=True
        )
        media_means = _group_mean(unit, media_of_row, pairs.shape[1])
        template_of_media = pairs[0]
    means = _group_mean(media_means, template_of_media, ids.numel())
    lengths = torch.linalg.vector_norm(means, dim=1)
    zero = (lengths == 0).nonzero().flatten()
    if zero.numel():
        raise ValueError(
            f"`embeddings` of template {ids[zero[0]].item()!r} (of `template_ids`) average to the zero vector, "
            f"which has no direction; {zero.numel()} template(s) do."
        )
    return (means / lengths[:, None]).to(embeddings.dtype), ids


def _group_mean(rows: Tensor, group: Tensor, n_groups: int) -> Tensor:
    """``(n_groups, D)``: the mean of the ``rows`` of each group (every group has at least one row)."""
    sums = torch.zeros(n_groups, rows.shape[1], dtype=rows.dtype, device=rows.device).index_add_(0, group, rows)
    counts = torch.bincount(group, minlength=n_groups).to(rows.dtype)
    return sums / counts[:, None]
