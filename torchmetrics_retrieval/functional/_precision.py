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

import torch

__all__ = ["ieee_float32_matmul"]


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
