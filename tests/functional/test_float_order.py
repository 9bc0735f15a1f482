"""The one order-preserving key of a float32 (``_search.float_order``), the same in numpy, torch and the kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.functional._search.float_order import ordered_key
from torchmetrics_retrieval.functional._search.keys import order_key


def _floats() -> np.ndarray:
    g = torch.Generator().manual_seed(1)
    special = [0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, np.inf, -np.inf, 3.4e38, -3.4e38]
    scales = 10.0 ** torch.randint(-30, 30, (3000,), generator=g).numpy()
    return np.concatenate([torch.randn(3000, generator=g).numpy() * scales, special]).astype(np.float32)


def test_keys_sort_like_the_floats_and_signed_zeros_share_a_key() -> None:
    values = _floats()
    keys = ordered_key(values.view(np.int32).astype(np.int64))
    order = np.argsort(values, kind="stable")
    steps, gaps = np.diff(keys[order]), np.diff(values[order])
    assert (steps[gaps > 0] > 0).all() and (steps[gaps == 0] == 0).all()
    assert ordered_key(np.array([np.float32(-0.0).view(np.int32)], dtype=np.int64)).tolist() == [0]


def test_torch_and_numpy_give_the_same_keys() -> None:
    values = _floats()
    bits = values.view(np.int32).astype(np.int64)
    from_torch = order_key(torch.from_numpy(values), torch.zeros(values.size, dtype=torch.long)) // 2**32
    assert np.array_equal(from_torch.numpy(), ordered_key(bits))


def test_the_search_kernels_encode_and_decode_with_the_same_key() -> None:
    kernels = pytest.importorskip("torchmetrics_retrieval.functional._search.compiled.kernels")
    values = _floats()
    bits = values.view(np.int32)
    codes = np.array([kernels.encode(b, 7) for b in bits], dtype=np.int64)
    assert np.array_equal(codes >> 31, ordered_key(bits.astype(np.int64)) + 2**31)
    decoded = np.array([kernels.decode(c)[0] for c in codes], dtype=np.int32).view(np.float32)
    assert np.array_equal(decoded, values)  # -0.0 decodes as +0.0, equal to it
