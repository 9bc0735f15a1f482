"""Full float32 precision for our matrix products, whatever the user's global matmul precision.

``torch.set_float32_matmul_precision("high")`` or ``("medium")`` (common in Lightning training scripts)
lets torch compute float32 products in TF32 or bfloat16, on CPUs too (through oneDNN, where the hardware
has it). The exactness certificates of :func:`~torchmetrics_retrieval.functional.knn` and of the
contrastive accuracy assume IEEE float32 rounding, so every product they certify runs inside
:func:`ieee_float32_matmul`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

__all__ = ["ieee_float32_matmul", "ieee_sqrt"]


def ieee_sqrt(x: Tensor, out: Tensor | None = None) -> Tensor:
    """The correctly rounded square root of every entry (IEEE 754), in ``out`` if given (``out=x``: in place).

    The canonical distances must not depend on how a torch build implements ``sqrt``: torch 2.13's CPU kernel
    was measured one unit in the last place off on about 1% of float32 and float64 inputs
    (``sqrt(2.0)`` gave ``1.414213562373095``), so on the CPU the IEEE square root of numpy (the hardware
    instruction, as in the compiled kernels) is taken. On other devices torch's, which CUDA rounds correctly.

    Example:
        >>> ieee_sqrt(torch.tensor([2.0], dtype=torch.float64)).item()
        1.4142135623730951
    """
    if x.device.type != "cpu" or x.requires_grad or x.dtype not in (torch.float32, torch.float64):
        return torch.sqrt(x, out=out) if out is not None else torch.sqrt(x)
    target = torch.empty_like(x) if out is None else out
    np.sqrt(x.numpy(), out=target.numpy())
    return target


@contextlib.contextmanager
def ieee_float32_matmul() -> Iterator[None]:
    """Run the block with IEEE float32 matrix products; the previous settings are restored after it.

    Example:
        >>> torch.set_float32_matmul_precision("medium")
        >>> with ieee_float32_matmul():
        ...     exact = torch.ones(2, 3) @ torch.ones(3, 2)
        >>> torch.set_float32_matmul_precision("highest")
    """
    backends = [
        matmul
        for matmul in (getattr(torch.backends.mkldnn, "matmul", None), getattr(torch.backends.cuda, "matmul", None))
        if matmul is not None and hasattr(matmul, "fp32_precision")
    ]
    if not backends:  # torch < 2.9: one global setting
        saved_global = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(saved_global)
        return
    saved = [matmul.fp32_precision for matmul in backends]
    for matmul in backends:
        matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        for matmul, precision in zip(backends, saved, strict=True):
            matmul.fp32_precision = precision
