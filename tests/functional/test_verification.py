"""Tests of torchmetrics_retrieval.functional.verification against a direct computation over all pairs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.functional.conftest import KernelCalls
from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional.verification import det_curve, fnmr_at_fmr, fnmr_at_fmr_from_distances

FMRS = (0.0, 0.01, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0)


def pair_distance(a: np.ndarray, b: np.ndarray, distance: str) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    if distance == "sqeuclidean":
        return float(((a - b) ** 2).sum())
    if distance == "euclidean":
        return math.sqrt(float(((a - b) ** 2).sum()))
    if distance == "dot":
        return -float((a * b).sum())
    return 1.0 - float((a * b).sum()) / float(np.linalg.norm(a) * np.linalg.norm(b))


def reference_pairs(
    x: torch.Tensor,
    labels: torch.Tensor,
    gallery: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    *,
    is_query: torch.Tensor | None = None,
    is_gallery: torch.Tensor | None = None,
    sequence_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    search_groups: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    distance: str = "euclidean",
    label_comparison_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative distances as docs/definitions.md defines the pairs, pair by pair."""
    Side = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]
    if gallery is None:
        n = x.shape[0]
        queries = [i for i in range(n) if is_query is None or bool(is_query[i])]
        items = [j for j in range(n) if is_gallery is None or bool(is_gallery[j])]
        assert not isinstance(sequence_ids, tuple) and not isinstance(search_groups, tuple)
        q_side: Side = (x, labels, sequence_ids, search_groups)
        g_side: Side = q_side
    else:
        assert gallery_labels is not None
        assert not isinstance(sequence_ids, torch.Tensor) and not isinstance(search_groups, torch.Tensor)
        queries, items = list(range(x.shape[0])), list(range(gallery.shape[0]))
        seq_q, seq_g = sequence_ids if sequence_ids is not None else (None, None)
        grp_q, grp_g = search_groups if search_groups is not None else (None, None)
        q_side, g_side = (x, labels, seq_q, grp_q), (gallery, gallery_labels, seq_g, grp_g)
    positives: list[float] = []
    negatives: list[float] = []
    for i in queries:
        for j in items:
            if gallery is None and i == j:
                continue
            seq_i, seq_j, grp_i, grp_j = q_side[2], g_side[2], q_side[3], g_side[3]
            if seq_i is not None and seq_j is not None and int(seq_i[i]) == int(seq_j[j]):
                continue
            if grp_i is not None and grp_j is not None and int(grp_i[i]) != int(grp_j[j]):
                continue
            li, lj = q_side[1][i], g_side[1][j]
            if label_comparison_fn is not None:
                match = bool(label_comparison_fn(li, lj))
            else:
                match = bool((li == lj).all())
            d = pair_distance(q_side[0][i].numpy(), g_side[0][j].numpy(), distance)
            (positives if match else negatives).append(d)
    return np.array(positives), np.array(negatives)


def reference_fnmr(positives: np.ndarray, negatives: np.ndarray, fmrs: tuple[float, ...]) -> list[float]:
    thresholds = np.quantile(negatives, fmrs)  # numpy's default: linear
    return [float((positives >= t).mean()) for t in thresholds]


def check_against_reference(
    calls: KernelCalls, x: torch.Tensor, labels: torch.Tensor, *args: object, **kwargs: object
) -> None:
    """Both paths against the reference: the compiled pair kernels (checked to be called) and the torch passes. A
    custom label comparison always takes the torch passes (the kernels compare label ids): checked too."""
    distance = kwargs.get("distance", "euclidean")
    positives, negatives = reference_pairs(x, labels, *args, **kwargs)  # type: ignore[arg-type]
    expected = reference_fnmr(positives, negatives, FMRS)
    for chunk_size, compiled in ((None, True), (None, False), (1, False), (3, True)):
        kernels = compiled and kwargs.get("label_comparison_fn") is None
        with plan.force_compiled(compiled), calls.expect(kernels, "pairs.histogram"):
            got = fnmr_at_fmr(x, labels, *args, fmr_vals=FMRS, chunk_size=chunk_size, **kwargs)  # type: ignore[arg-type]
        assert [got[f"fnmr@fmr/{f}"].item() for f in FMRS] == pytest.approx(expected, abs=1e-6), compiled
        assert [got[f"tar@far/{f}"].item() for f in FMRS] == pytest.approx([1 - e for e in expected], abs=1e-6)
        with plan.force_compiled(compiled), calls.expect(kernels, "pairs.histogram"):
            fmr, fnmr, thresholds = det_curve(x, labels, *args, fmr_grid=FMRS, chunk_size=chunk_size, **kwargs)  # type: ignore[arg-type]
        assert fmr.tolist() == list(FMRS)
        assert fnmr.tolist() == pytest.approx(expected, abs=1e-6)
        tol = 1e-9 if distance in ("sqeuclidean", "dot") else 1e-5
        assert thresholds.tolist() == pytest.approx(np.quantile(negatives, FMRS).tolist(), abs=tol)


def integer_data(n: int, dim: int, n_labels: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Small integer coordinates: squared Euclidean and dot distances are exact, with many ties."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (n, dim), generator=g).float(), torch.randint(0, n_labels, (n,), generator=g)


# ------------------------------------------------------------------------------------------ given distances


def test_oml_documented_example() -> None:
    pos = torch.tensor([0, 0, 1, 1, 2, 2, 5, 5, 9, 9])
    neg = torch.tensor([3, 3, 4, 4, 6, 6, 7, 7, 8, 8])
    got = fnmr_at_fmr_from_distances(pos, neg, fmr_vals=(0.1, 0.5))
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx([0.4, 0.2])


def test_hand_computed_interpolation() -> None:
    # negatives 1, 2, 4: the 0.75-quantile is 2 + 0.5 * (4 - 2) = 3; positives >= 3: 3, 5 -> 2 of 4.
    got = fnmr_at_fmr_from_distances(
        torch.tensor([0.0, 2.9, 3.0, 5.0]), torch.tensor([4.0, 1.0, 2.0]), (0.75, 0.0, 1.0)
    )
    assert got.tolist() == pytest.approx([0.5, 0.75, 0.25])


@settings(max_examples=60, deadline=None)
@given(
    pos=st.lists(st.integers(-5, 5) | st.floats(-3, 3, width=32), min_size=1, max_size=40),
    neg=st.lists(st.integers(-5, 5) | st.floats(-3, 3, width=32), min_size=1, max_size=40),
    fmrs=st.lists(st.floats(0, 1), min_size=1, max_size=5),
    n_buckets=st.sampled_from([1, 2, 3, 16, 2**16]),
)
def test_given_distances_match_numpy(pos: list[float], neg: list[float], fmrs: list[float], n_buckets: int) -> None:
    # float32 values, interpolated in float64 (as the implementation does)
    pos64 = np.array(pos, dtype=np.float32).astype(np.float64)
    neg64 = np.array(neg, dtype=np.float32).astype(np.float64)
    expected = reference_fnmr(pos64, neg64, tuple(fmrs))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pairs_plan, "N_BUCKETS", n_buckets)  # few buckets: many values and ranks per bucket
        mp.setattr(pairs_plan, "MERGE_EVERY", 3)
        got = fnmr_at_fmr_from_distances(torch.tensor(pos, dtype=torch.float32), torch.tensor(neg), fmrs)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_given_integer_and_float64_distances() -> None:
    pos, neg = torch.arange(10, dtype=torch.int64), torch.arange(5, 25, dtype=torch.int64)
    expected = reference_fnmr(pos.numpy(), neg.numpy(), (0.0, 0.3))
    assert fnmr_at_fmr_from_distances(pos, neg, (0.0, 0.3)).tolist() == pytest.approx(expected)
    assert fnmr_at_fmr_from_distances(pos.double(), neg.double(), (0.0, 0.3)).tolist() == pytest.approx(expected)


# ------------------------------------------------------------------------------------------ all pairs


@pytest.mark.parametrize("distance", ["sqeuclidean", "dot"])
def test_leave_one_out_with_ties(distance: str, kernel_calls: KernelCalls) -> None:
    x, labels = integer_data(23, 3, 4, seed=0)
    check_against_reference(kernel_calls, x, labels, distance=distance)


def test_duplicates_and_lone_queries(kernel_calls: KernelCalls) -> None:
    x, labels = integer_data(20, 2, 3, seed=1)
    x[5:9] = x[4]  # exact duplicates: distance 0 to each other
    labels[19] = 99  # a lone query: all its pairs are negatives
    check_against_reference(kernel_calls, x, labels, distance="sqeuclidean")


def test_query_gallery_masks(kernel_calls: KernelCalls) -> None:
    x, labels = integer_data(21, 2, 3, seed=2)
    g = torch.Generator().manual_seed(3)
    is_query = torch.rand(21, generator=g) < 0.6
    is_gallery = torch.rand(21, generator=g) < 0.7
    check_against_reference(kernel_calls, x, labels, is_query=is_query, is_gallery=is_gallery, distance="sqeuclidean")


def test_separate_gallery_with_sequences_and_groups(kernel_calls: KernelCalls) -> None:
    q, ql = integer_data(11, 3, 3, seed=4)
    gal, gl = integer_data(17, 3, 3, seed=5)
    g = torch.Generator().manual_seed(6)
    seq = (torch.randint(0, 4, (11,), generator=g), torch.randint(0, 4, (17,), generator=g))
    groups = (torch.randint(0, 2, (11,), generator=g), torch.randint(0, 2, (17,), generator=g))
    check_against_reference(kernel_calls, q, ql, gal, gl, sequence_ids=seq, search_groups=groups, distance="dot")


def test_leave_one_out_with_sequences_and_groups(kernel_calls: KernelCalls) -> None:
    x, labels = integer_data(24, 2, 4, seed=7)
    g = torch.Generator().manual_seed(8)
    seq = torch.randint(0, 6, (24,), generator=g)
    groups = torch.randint(0, 2, (24,), generator=g)
    check_against_reference(kernel_calls, x, labels, sequence_ids=seq, search_groups=groups, distance="sqeuclidean")


def test_two_dimensional_labels_and_custom_comparison(kernel_calls: KernelCalls) -> None:
    x, _ = integer_data(18, 2, 3, seed=9)
    g = torch.Generator().manual_seed(10)
    labels = torch.randint(0, 2, (18, 2), generator=g)
    check_against_reference(kernel_calls, x, labels, distance="sqeuclidean")

    def first_column(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[..., 0] == b[..., 0]

    check_against_reference(kernel_calls, x, labels, distance="sqeuclidean", label_comparison_fn=first_column)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_random_float_data(distance: str, kernel_calls: KernelCalls) -> None:
    g = torch.Generator().manual_seed(11)
    labels = torch.randint(0, 3, (30,), generator=g)
    x = torch.randn(30, 5, generator=g) + labels[:, None].float()
    check_against_reference(kernel_calls, x, labels, distance=distance)


def test_large_int_labels_are_not_cast(kernel_calls: KernelCalls) -> None:
    x, small = integer_data(16, 2, 2, seed=12)
    labels = small + 2**40  # float32 would merge 2**40 and 2**40 + 1
    check_against_reference(kernel_calls, x, labels, distance="sqeuclidean")


def test_many_buckets_collapsed() -> None:
    x, labels = integer_data(25, 2, 3, seed=13)
    positives, negatives = reference_pairs(x, labels, distance="sqeuclidean")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pairs_plan, "N_BUCKETS", 2)
        got = fnmr_at_fmr(x, labels, fmr_vals=FMRS, distance="sqeuclidean", chunk_size=4)
    assert [got[f"fnmr@fmr/{f}"].item() for f in FMRS] == pytest.approx(reference_fnmr(positives, negatives, FMRS))


def test_keys_print_fractions_as_python_does() -> None:
    x, labels = integer_data(10, 2, 2, seed=14)
    got = fnmr_at_fmr(x, labels, fmr_vals=(0.1, 1, 0.5))
    assert list(got) == ["fnmr@fmr/0.1", "fnmr@fmr/1", "fnmr@fmr/0.5", "tar@far/0.1", "tar@far/1", "tar@far/0.5"]
    assert all(v.shape == () and v.dtype == torch.float32 for v in got.values())


def test_default_det_grid() -> None:
    x, labels = integer_data(12, 2, 2, seed=15)
    fmr, fnmr, thresholds = det_curve(x, labels)
    assert fmr.shape == fnmr.shape == thresholds.shape == (51,)
    assert fmr[0].item() == pytest.approx(1e-5) and fmr[-1].item() == 1.0
    assert bool((thresholds[1:] >= thresholds[:-1]).all()) and bool((fnmr[1:] <= fnmr[:-1]).all())


# ------------------------------------------------------------------------------------------ edge cases, errors


def test_no_negative_pair_is_nan_with_warning() -> None:
    x = torch.randn(4, 2)
    with pytest.warns(UserWarning, match="no negative pair"):
        got = fnmr_at_fmr(x, torch.zeros(4, dtype=torch.long), fmr_vals=(0.1,))
    assert math.isnan(got["fnmr@fmr/0.1"].item()) and math.isnan(got["tar@far/0.1"].item())
    with pytest.warns(UserWarning, match="no negative pair"):
        assert torch.isnan(fnmr_at_fmr_from_distances(torch.ones(3), torch.ones(0))).all()


def test_no_positive_pair_is_nan_with_warning() -> None:
    with pytest.warns(UserWarning, match="no positive pair"):
        got = fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), fmr_vals=(0.1, 0.2))
    assert all(math.isnan(v.item()) for v in got.values())
    with pytest.warns(UserWarning, match="no positive pair"):
        _, fnmr, thresholds = det_curve(torch.randn(4, 2), torch.arange(4), fmr_grid=(0.5,))
    assert torch.isnan(fnmr).all() and torch.isnan(thresholds).all()


def test_empty_fmr_values() -> None:
    assert fnmr_at_fmr(torch.randn(4, 2), torch.tensor([0, 0, 1, 1]), fmr_vals=()) == {}


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), fmr_vals=(1.5,)), ValueError, "`fmr_vals`.*1.5"),
        (lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), fmr_vals=(-0.1,)), ValueError, "`fmr_vals`"),
        (lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), fmr_vals=cast(Any, ("a",))), TypeError, "`fmr_vals`"),
        (lambda: det_curve(torch.randn(4, 2), torch.arange(4), fmr_grid=(2.0,)), ValueError, "`fmr_grid`"),
        (lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), distance=cast(Any, "l1")), ValueError, "`distance`"),
        (lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(3)), ValueError, "labels"),
        (lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), chunk_size=0), ValueError, "`chunk_size`"),
        (
            lambda: fnmr_at_fmr(torch.randn(4, 2), torch.arange(4), sequence_ids=torch.arange(3)),
            ValueError,
            "`sequence_ids`",
        ),
        (lambda: fnmr_at_fmr(torch.tensor([[math.nan]]), torch.arange(1)), ValueError, "finite"),
        (lambda: fnmr_at_fmr_from_distances(cast(Any, [1.0]), torch.ones(2)), TypeError, "`pos_dist`"),
        (lambda: fnmr_at_fmr_from_distances(torch.ones(2), torch.ones(2, 1)), ValueError, "`neg_dist` must be 1-D"),
        (
            lambda: fnmr_at_fmr_from_distances(torch.ones(2), torch.tensor([math.inf])),
            ValueError,
            "`neg_dist` must be finite",
        ),
        (lambda: fnmr_at_fmr_from_distances(torch.ones(2), torch.ones(2, dtype=torch.bool)), TypeError, "real dtype"),
        (lambda: fnmr_at_fmr_from_distances(torch.ones(2), torch.ones(2), fmr_vals=1.01), ValueError, "`fmr_vals`"),
    ],
)
def test_errors(call: Callable[[], object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_compiled_kernels_and_torch_passes_agree_bit_for_bit(distance: str, kernel_calls: KernelCalls) -> None:
    """Both paths compute each pair's distance by the same float32 operations and its bucket in float64."""
    g = torch.Generator().manual_seed(13)
    labels = torch.randint(0, 7, (300,), generator=g)
    x = torch.randn(300, 6, generator=g) + labels[:, None].float() / 3
    x[50:60] = x[3]  # duplicates
    seq = torch.randint(0, 100, (300,), generator=g)
    results = []
    for compiled in (True, False):
        with kernel_calls.forced(compiled, "pairs.histogram"):
            results.append(fnmr_at_fmr(x, labels, fmr_vals=(0.0, 0.001, 0.1, 0.5), sequence_ids=seq, distance=distance))
    assert results[0].keys() == results[1].keys()
    for key in results[0]:
        assert torch.equal(results[0][key], results[1][key]), key
