"""Our certified products stay IEEE float32 under a reduced global matmul precision (TF32 / bfloat16)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional.contrastive import contrastive_accuracy
from torchmetrics_retrieval.functional.search import distance_blocks, knn


@pytest.fixture
def medium_precision() -> Iterator[None]:
    """``torch.set_float32_matmul_precision("medium")``: bfloat16 products where the CPU has them."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    yield
    torch.set_float32_matmul_precision(saved)


def float32_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The worst-case rounding of IEEE float32 inner products of length D: D * 2**-24 * |a| |b|."""
    return a.shape[1] * 2.0**-24 * a.double().norm(dim=1)[:, None] * b.double().norm(dim=1)[None, :]


@pytest.mark.usefixtures("medium_precision")
def test_products_inside_are_ieee_and_the_setting_is_restored() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 128, generator=g), torch.randn(256, 128, generator=g)
    with ieee_float32_matmul():
        error = ((a @ b.T).double() - a.double() @ b.double().T).abs()
    assert bool((error <= float32_bound(a, b)).all())
    assert torch.get_float32_matmul_precision() == "medium"


@pytest.mark.usefixtures("medium_precision")
def test_knn_stays_exact() -> None:
    # Without the guard, bfloat16 products break the certificate's rounding bound: neighbours go wrong.
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(3000, 64, generator=g), dim=1)
    result = knn(x, k=10, backend="torch")
    d = torch.cdist(x.double(), x.double()).fill_diagonal_(float("inf"))
    expected = torch.sort(d, dim=1, stable=True).indices[:, :10]
    assert torch.equal(result.indices, expected)


@pytest.mark.usefixtures("medium_precision")
def test_distance_blocks_and_contrastive_accuracy_stay_ieee() -> None:
    g = torch.Generator().manual_seed(1)
    q, x = torch.randn(64, 128, generator=g), torch.randn(300, 128, generator=g)
    (block,) = distance_blocks(q, x, distance="dot")
    assert bool(((block.distances.double() + q.double() @ x.double().T).abs() <= float32_bound(q, x)).all())
    z1, z2 = x, x + 0.5 * torch.randn(300, 128, generator=g)
    got = contrastive_accuracy(z1, z2, top_k=1)
    torch.set_float32_matmul_precision("highest")
    assert torch.equal(got, contrastive_accuracy(z1, z2, top_k=1))
