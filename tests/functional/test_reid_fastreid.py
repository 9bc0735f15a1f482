"""Person re-identification metrics against fast-reid's ``eval_market1501`` (the ``fastreid`` package on PyPI).

Only fast-reid's ``evaluation/rank.py`` is loaded, from its file: it needs numpy alone (its Cython extension is
optional and absent here), while the package's other modules import its training stack. fast-reid sorts
distances with an unstable ``argsort``, so the data here have no distance ties: every row's distances are apart
by more than float32 rounding (checked), and both sides rank the same way.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

import torchmetrics_retrieval.functional as F


def under_ci() -> bool:
    """Whether the tests run under CI (``CI`` set, to anything but ``0`` or ``false``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def fastreid_rank() -> ModuleType:
    """fast-reid's ``evaluation/rank.py``. Without fastreid the oracle is missing: a failure under CI (the
    comparison must run there), a skip on a developer's machine."""
    spec = importlib.util.find_spec("fastreid")
    if spec is None or spec.origin is None:
        message = "fastreid is not installed (pip install --no-deps fastreid==1.4.0)"
        if under_ci():
            pytest.fail(f"{message}: the fast-reid oracle must run under CI", pytrace=False)
        pytest.skip(message)
    path = Path(spec.origin).parent / "evaluation" / "rank.py"
    module_spec = importlib.util.spec_from_file_location("fastreid_rank", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cython rank evaluation is unavailable"
        module_spec.loader.exec_module(module)
    return module


def reid_data(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    query_ids, gallery_ids = torch.randint(0, 12, (40,), generator=g), torch.randint(0, 12, (150,), generator=g)
    centres = torch.randn(12, 16, generator=g)
    query = centres[query_ids] + 0.9 * torch.randn(40, 16, generator=g)
    gallery = centres[gallery_ids] + 0.9 * torch.randn(150, 16, generator=g)
    return query.double(), query_ids, gallery.double(), gallery_ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cmc_map_and_minp_match_eval_market1501(seed: int) -> None:
    rank = fastreid_rank()
    query, query_ids, gallery, gallery_ids = reid_data(seed)
    distmat = torch.cdist(query, gallery).numpy()
    gaps = np.diff(np.sort(distmat, axis=1), axis=1)
    assert gaps.min() > 1e-9 * distmat.max()  # no ties: both rankings are the same (float64 inputs here)
    # every gallery item seen by another camera than the queries: fast-reid removes nothing
    cmc, aps, inps = rank.eval_market1501(
        distmat, query_ids.numpy(), gallery_ids.numpy(), np.zeros(40, int), np.ones(150, int), 10
    )
    ours = F.retrieval_metrics(
        query, query_ids, gallery, gallery_ids, cmc_top_k=(1, 5, 10), precision_top_k=(), map_top_k=(),
        map_full=True, minp=True,
    )  # fmt: skip
    assert [ours[f"cmc/{k}"].item() for k in (1, 5, 10)] == pytest.approx([cmc[0], cmc[4], cmc[9]], abs=1e-6)
    assert ours["map"].item() == pytest.approx(np.mean(aps), abs=1e-6)
    assert ours["minp"].item() == pytest.approx(np.mean(inps), abs=1e-6)


@pytest.mark.parametrize("seed", [3, 4])
def test_camera_protocol_matches_eval_market1501(seed: int) -> None:
    """Several cameras per identity: an item with the query's identity and camera is left out of its gallery
    (items of other identities from that camera stay); queries left without a match are skipped by both."""
    rank = fastreid_rank()
    query, query_ids, gallery, gallery_ids = reid_data(seed)
    g = torch.Generator().manual_seed(50 + seed)
    query_cams, gallery_cams = torch.randint(0, 3, (40,), generator=g), torch.randint(0, 3, (150,), generator=g)
    distmat = torch.cdist(query, gallery).numpy()
    assert np.diff(np.sort(distmat, axis=1), axis=1).min() > 1e-9 * distmat.max()
    cmc, aps, inps = rank.eval_market1501(
        distmat, query_ids.numpy(), gallery_ids.numpy(), query_cams.numpy(), gallery_cams.numpy(), 10
    )
    ours = F.retrieval_metrics(
        query, query_ids, gallery, gallery_ids, camera_ids=(query_cams, gallery_cams), cmc_top_k=(1, 5, 10),
        precision_top_k=(), map_top_k=(), map_full=True, minp=True,
    )  # fmt: skip
    assert [ours[f"cmc/{k}"].item() for k in (1, 5, 10)] == pytest.approx([cmc[0], cmc[4], cmc[9]], abs=1e-6)
    assert ours["map"].item() == pytest.approx(np.mean(aps), abs=1e-6)
    assert ours["minp"].item() == pytest.approx(np.mean(inps), abs=1e-6)
