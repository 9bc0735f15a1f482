"""retrieval_metrics end to end: hand-computed cases, the slow reference, pytorch-metric-learning, errors."""

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import reference
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchmetrics_retrieval.functional import retrieval_metrics, retrieval_per_query
from torchmetrics_retrieval.functional.retrieval import RetrievalOptions

ALL_RANKING = {
    "cmc_top_k": (1, 2),
    "precision_top_k": (2,),
    "map_top_k": (2,),
    "recall_top_k": (2,),
    "ndcg_top_k": (2,),
    "map_at_r": True,
    "r_precision": True,
    "mrr": True,
    "map_full": True,
}
#: What the kNN search serves: with full ``map`` and no per-query table every value comes from the full ranks.
SEARCHED = {key: value for key, value in ALL_RANKING.items() if key != "map_full"}

# Five 1-D points with exact ties (integer distances are exact in float32) and a duplicate pair.
X = torch.tensor([[0.0], [0.0], [1.0], [1.0], [3.0]])
DISCOUNT_2 = 1 / math.log2(3)
Y = torch.tensor([0, 1, 0, 1, 0])


def test_hand_computed_leave_one_out_with_ties() -> None:
    # Full rankings (ties by gallery position), relevance of each rank:
    # q0 [F,T,F,T] n=2; q1 [F,F,T,F] n=1; q2 [F,T,F,T] n=2; q3 [F,F,T,F] n=1; q4 [T,F,T,F] n=2.
    m = retrieval_metrics(X, Y, **ALL_RANKING)
    expected = {
        "cmc/1": 1 / 5,
        "cmc/2": 3 / 5,
        "precision/2": (0.5 + 0 + 0.5 + 0 + 0.5) / 5,
        "map/2": (0.5 + 0 + 0.5 + 0 + 1) / 5,
        "recall/2": (0.5 + 0 + 0.5 + 0 + 0.5) / 5,
        "ndcg/2": (2 * DISCOUNT_2 + 1) / (1 + DISCOUNT_2) / 5,  # q0, q2 hit at rank 2; q4 at rank 1; n = 2
        "map_at_r": (0.25 + 0 + 0.25 + 0 + 0.5) / 5,
        "r_precision": (0.5 + 0 + 0.5 + 0 + 0.5) / 5,
        "mrr": (0.5 + 1 / 3 + 0.5 + 1 / 3 + 1) / 5,
        "map": (0.5 + 1 / 3 + 0.5 + 1 / 3 + 5 / 6) / 5,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key].item() == pytest.approx(value, abs=1e-6), key


def test_mrr_beyond_retrieved_k_is_exact() -> None:
    # Only cmc@1 is retrieved; q1's first relevant item is third in its ranking.
    _m, res = retrieval_metrics(X, Y, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), mrr=True, return_per_query=True)
    assert res.values["mrr"].tolist() == pytest.approx([0.5, 1 / 3, 0.5, 1 / 3, 1.0])


def test_duplicate_of_the_query_is_a_real_neighbour() -> None:
    x = torch.tensor([[2.0, 2.0], [2.0, 2.0], [9.0, 9.0]])
    _, res = retrieval_metrics(
        x, torch.tensor([4, 4, 5]), cmc_top_k=(1,), precision_top_k=(), map_top_k=(), return_per_query=True
    )
    assert res.indices[:2, 0].tolist() == [1, 0]  # each duplicate finds the other, never itself
    assert res.distances[:2, 0].tolist() == [0.0, 0.0]
    assert res.values["cmc/1"][:2].tolist() == [1.0, 1.0]


def test_lone_queries_follow_empty_target_action() -> None:
    x = torch.tensor([[0.0], [1.0], [5.0]])
    y = torch.tensor([0, 0, 1])  # the third query is alone in its class
    skip = retrieval_metrics(x, y, cmc_top_k=(1,), precision_top_k=(), map_top_k=())
    assert skip["cmc/1"].item() == 1.0
    assert retrieval_metrics(x, y, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), empty_target_action="neg")[
        "cmc/1"
    ].item() == pytest.approx(2 / 3)
    assert (
        retrieval_metrics(x, y, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), empty_target_action="pos")[
            "cmc/1"
        ].item()
        == 1.0
    )
    with pytest.raises(ValueError, match="1 of 3 queries"):
        retrieval_metrics(x, y, cmc_top_k=(1,), empty_target_action="error")
    with pytest.warns(UserWarning, match="skipped"):
        assert math.isnan(retrieval_metrics(x, torch.tensor([0, 1, 2]), cmc_top_k=(1,))["cmc/1"].item())


def test_query_gallery_overlap_by_masks() -> None:
    # Samples 0..3: queries 0, 1, 2; gallery 1, 2, 3. Queries 1 and 2 are also gallery items.
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    y = torch.tensor([0, 0, 1, 1])
    is_query = torch.tensor([True, True, True, False])
    is_gallery = torch.tensor([False, True, True, True])
    _, res = retrieval_metrics(
        x,
        y,
        is_query=is_query,
        is_gallery=is_gallery,
        cmc_top_k=(3,),
        precision_top_k=(),
        map_top_k=(),
        return_per_query=True,
    )
    assert res.indices.tolist() == [[1, 2, 3], [2, 3, 0], [1, 3, 0]]  # positions in the input set
    assert res.valid.tolist() == [[True] * 3, [True, True, False], [True, True, False]]
    assert res.n_relevant.tolist() == [1, 0, 1]


def test_sequence_ids_exclude_same_sequence() -> None:
    x = torch.tensor([[0.0], [0.5], [1.0], [5.0]])
    y = torch.tensor([0, 0, 0, 1])
    seq = torch.tensor([7, 7, 8, 9])
    _, res = retrieval_metrics(
        x, y, sequence_ids=seq, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), return_per_query=True
    )
    assert res.indices[:, 0].tolist() == [2, 2, 1, 2]
    assert res.n_relevant.tolist() == [1, 1, 2, 0]


def test_separate_gallery_and_search_groups() -> None:
    q = torch.tensor([[0.0], [10.0]])
    g = torch.tensor([[1.0], [9.0], [11.0]])
    groups = (torch.tensor([0, 1]), torch.tensor([1, 1, 1]))
    _, res = retrieval_metrics(
        q,
        torch.tensor([3, 3]),
        g,
        torch.tensor([3, 4, 3]),
        search_groups=groups,
        cmc_top_k=(2,),
        precision_top_k=(),
        map_top_k=(),
        return_per_query=True,
    )
    assert res.valid[0].tolist() == [False, False]  # query 0 has no item of its group
    assert res.indices[1].tolist() == [1, 2]
    assert res.n_relevant.tolist() == [0, 2]


def test_categories_per_class_and_avg_of_avgs() -> None:
    m = retrieval_metrics(
        X, Y, categories=torch.tensor([5, 5, 6, 6, 6]), cmc_top_k=(2,), precision_top_k=(), map_top_k=(), per_class=True
    )
    # per query cmc@2: [1, 0, 1, 0, 1]
    assert m["cmc/2"].item() == pytest.approx(0.6)
    assert m["5/cmc/2"].item() == pytest.approx(0.5)
    assert m["6/cmc/2"].item() == pytest.approx(2 / 3)
    assert m["cmc/2/class/0"].item() == 1.0
    assert m["cmc/2/class/1"].item() == 0.0
    avg = retrieval_metrics(X, Y, cmc_top_k=(2,), precision_top_k=(), map_top_k=(), avg_of_avgs=True)
    assert avg["cmc/2"].item() == pytest.approx(0.5)


def test_2d_labels_and_custom_comparison_keep_dtype() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    labels = torch.tensor([[1, 3], [1, 4], [2, 3], [1, 3]])

    def rule(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a[..., 0] == b[..., 0]) & (a[..., 1] != b[..., 1])

    _, res = retrieval_metrics(
        x,
        labels,
        label_comparison_fn=rule,
        cmc_top_k=(3,),
        precision_top_k=(),
        map_top_k=(),
        per_class=True,
        return_per_query=True,
    )
    assert res.n_relevant.tolist() == [1, 2, 0, 1]
    assert res.is_relevant[1].tolist() == [True, False, True]  # neighbours of q1: 0, 2, 3


def _as_dict(res, i):  # type: ignore[no-untyped-def]
    return {key: float(v[i]) for key, v in res.values.items()}


@pytest.mark.filterwarnings("ignore:Every query was skipped")
@given(
    data=st.data(),
    n=st.integers(2, 14),
    n_labels=st.integers(1, 4),
    distance=st.sampled_from(["euclidean", "sqeuclidean", "cosine", "dot"]),
    chunk_size=st.sampled_from([None, 1, 3]),
    backend=st.sampled_from(["torch", "faiss"]),
    mode=st.sampled_from(["loo", "masks", "separate"]),
    with_seq=st.booleans(),
)
def test_matches_slow_reference(data, n, n_labels, distance, chunk_size, backend, mode, with_seq) -> None:  # type: ignore[no-untyped-def]
    ints = st.lists(st.integers(-3, 3), min_size=2 * n, max_size=2 * n)
    x = torch.tensor(data.draw(ints), dtype=torch.float32).reshape(n, 2)  # small integers: exact ties
    if distance == "cosine":
        x[x.norm(dim=1) == 0] = 1.0
    y = torch.tensor(data.draw(st.lists(st.integers(0, n_labels - 1), min_size=n, max_size=n)))
    seq = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))) if with_seq else None
    opts = {**ALL_RANKING, "distance": distance, "chunk_size": chunk_size, "knn_backend": backend}
    if mode == "loo":
        _, res = retrieval_metrics(x, y, sequence_ids=seq, return_per_query=True, **opts)
        refs = reference.rankings(
            x, y, x, y, self_index=list(range(n)), distance=distance, sequence_ids=None if seq is None else (seq, seq)
        )
    elif mode == "masks":
        is_query = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        is_gallery = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        is_query[0] = is_gallery[-1] = True
        _, res = retrieval_metrics(
            x, y, is_query=is_query, is_gallery=is_gallery, sequence_ids=seq, return_per_query=True, **opts
        )
        qi, gi = torch.nonzero(is_query).flatten(), torch.nonzero(is_gallery).flatten()
        self_index = [int((gi == i).nonzero()[0]) if bool(is_gallery[i]) else -1 for i in qi]
        refs = reference.rankings(
            x[qi],
            y[qi],
            x[gi],
            y[gi],
            self_index=self_index,
            distance=distance,
            sequence_ids=None if seq is None else (seq[qi], seq[gi]),
        )
    else:
        half = n // 2 or 1
        pair = None if seq is None else (seq[:half], seq[half:])
        _, res = retrieval_metrics(
            x[:half], y[:half], x[half:], y[half:], sequence_ids=pair, return_per_query=True, **opts
        )
        refs = reference.rankings(x[:half], y[:half], x[half:], y[half:], distance=distance, sequence_ids=pair)
    assert res.n_relevant.tolist() == [r.n_relevant for r in refs]
    for i, r in enumerate(refs):
        k = res.indices.shape[1]
        got = res.indices[i][res.valid[i]].tolist()
        positions = res.query_positions  # noqa: F841 - documents that indices are input-set positions
        assert len(got) == min(k, len(r.positions))
        expected = {
            "cmc/1": reference.cmc(r, 1),
            "cmc/2": reference.cmc(r, 2),
            "precision/2": reference.precision(r, 2),
            "map/2": reference.map_at_k(r, 2),
            "recall/2": reference.recall(r, 2),
            "ndcg/2": reference.ndcg(r, 2),
            "map_at_r": reference.map_at_r(r),
            "r_precision": reference.r_precision(r),
            "mrr": reference.reciprocal_rank(r),
            "map": reference.average_precision(r),
        }
        assert _as_dict(res, i) == pytest.approx(expected, abs=1e-5), (i, r)
        assert res.distances[i][res.valid[i]].tolist() == pytest.approx(r.distances[: len(got)], abs=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_pytorch_metric_learning(seed: int) -> None:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 12, (300,), generator=g)
    x = torch.randn(300, 16, generator=g) + 2.0 * torch.nn.functional.one_hot(labels % 16, 16).float()
    names = (
        "precision_at_1",
        "r_precision",
        "mean_average_precision_at_r",
        "mean_average_precision",
        "mean_reciprocal_rank",
    )
    pml = AccuracyCalculator(include=names, k=None, device=torch.device("cpu")).get_accuracy(
        x, labels, x, labels, ref_includes_query=True
    )
    ours = retrieval_metrics(
        x,
        labels,
        cmc_top_k=(),
        precision_top_k=(1,),
        map_top_k=(),
        map_at_r=True,
        r_precision=True,
        map_full=True,
        mrr=True,
        precision_mode="standard",
    )
    pairs = {
        "precision_at_1": "precision/1",
        "r_precision": "r_precision",
        "mean_average_precision_at_r": "map_at_r",
        "mean_average_precision": "map",
        "mean_reciprocal_rank": "mrr",
    }
    for pml_name, our_name in pairs.items():
        assert ours[our_name].item() == pytest.approx(pml[pml_name], abs=1e-5), pml_name


def test_separate_gallery_matches_pytorch_metric_learning() -> None:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    g = torch.Generator().manual_seed(3)
    q, r = torch.randn(80, 8, generator=g), torch.randn(200, 8, generator=g)
    ql, rl = torch.randint(0, 6, (80,), generator=g), torch.randint(0, 5, (200,), generator=g)  # label 5: lone
    names = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
    pml = AccuracyCalculator(include=names, k="max_bin_count", device=torch.device("cpu")).get_accuracy(q, ql, r, rl)
    ours = retrieval_metrics(
        q, ql, r, rl, cmc_top_k=(), precision_top_k=(1,), map_top_k=(), map_at_r=True, r_precision=True
    )
    assert ours["precision/1"].item() == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["r_precision"].item() == pytest.approx(pml["r_precision"], abs=1e-6)
    assert ours["map_at_r"].item() == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-6)


def test_results_do_not_depend_on_query_order() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 4, generator=g), torch.randint(0, 5, (60,), generator=g)
    perm = torch.randperm(60, generator=g)
    a = retrieval_metrics(x, y, **ALL_RANKING)
    b = retrieval_metrics(x[perm], y[perm], **ALL_RANKING)
    assert {k: v.item() for k, v in a.items()} == pytest.approx({k: v.item() for k, v in b.items()}, abs=1e-6)


def test_worst_queries() -> None:
    _, res = retrieval_metrics(X, Y, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), return_per_query=True)
    assert res.worst_queries("cmc/1", 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="key"):
        res.worst_queries("cmc/9")


def test_per_query_api_and_options_object() -> None:
    res = retrieval_per_query(X, Y, options=RetrievalOptions.create(cmc_top_k=(1,), precision_top_k=(), map_top_k=()))
    assert res.values["cmc/1"].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


GOOD = (torch.zeros(3, 2), torch.tensor([0, 0, 1]))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.zeros(3), *GOOD[1:]), {}, ValueError, "`query` must be 2-D"),
        ((torch.zeros(3, 2, dtype=torch.long), GOOD[1]), {}, TypeError, "`query`"),
        ((torch.tensor([[0.0, float("nan")]] * 3), GOOD[1]), {}, ValueError, "finite"),
        ((torch.zeros(0, 2), torch.zeros(0)), {}, ValueError, "at least one row"),
        ((GOOD[0], torch.tensor([0, 1])), {}, ValueError, "`query_labels` must have 3 rows"),
        ((GOOD[0], np.array([0, 0, 1])), {}, TypeError, "`query_labels`"),
        (GOOD, {"cmc_top_k": (0,)}, ValueError, "cmc_top_k"),
        (GOOD, {"precision_top_k": 2.5}, TypeError, "precision_top_k"),
        (GOOD, {"fmr_vals": (1.5,)}, ValueError, "fmr_vals"),
        (GOOD, {"distance": "manhattan"}, ValueError, "distance"),
        (GOOD, {"knn_backend": "annoy"}, ValueError, "knn_backend"),
        (GOOD, {"empty_target_action": "ignore"}, ValueError, "empty_target_action"),
        (GOOD, {"precision_mode": "oml"}, ValueError, "precision_mode"),
        (GOOD, {"chunk_size": 0}, ValueError, "chunk_size"),
        (GOOD, {"mrr": 1}, TypeError, "mrr"),
        (GOOD, {"avg_of_avgs": True, "per_class": True}, ValueError, "avg_of_avgs"),
        (GOOD, {"label_comparison_fn": 3}, TypeError, "label_comparison_fn"),
        (GOOD, {"top_k": 3}, TypeError, "unexpected keyword argument .top_k."),
        (GOOD, {"is_query": torch.tensor([1, 0, 1])}, TypeError, "is_query"),
        (GOOD, {"is_query": torch.tensor([False] * 3)}, ValueError, "is_query"),
        (GOOD, {"is_gallery": torch.tensor([True, False])}, ValueError, "is_gallery"),
        (GOOD, {"sequence_ids": torch.tensor([0, 1])}, ValueError, "sequence_ids"),
        (GOOD, {"sequence_ids": (torch.tensor([0]), torch.tensor([0]))}, TypeError, "sequence_ids"),
        ((*GOOD, torch.zeros(2, 3), torch.tensor([0, 1])), {}, ValueError, "gallery"),
        ((*GOOD, torch.zeros(2, 2)), {}, ValueError, "gallery_labels"),
        ((*GOOD, torch.zeros(2, 2), torch.tensor([[0, 1], [1, 1]])), {}, ValueError, "gallery_labels"),
        (
            (*GOOD, torch.zeros(2, 2), torch.tensor([0, 1])),
            {"is_query": torch.ones(3, dtype=torch.bool)},
            ValueError,
            "is_query",
        ),
    ],
)
def test_bad_input_names_the_argument(args, kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        retrieval_metrics(*args, **kwargs)


@pytest.mark.parametrize("masks", [False, True])
def test_query_chunks_keep_only_per_query_values(monkeypatch: pytest.MonkeyPatch, masks: bool) -> None:
    from torchmetrics_retrieval.functional import _per_query

    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(90, 6, generator=g), torch.randint(0, 6, (90,), generator=g)
    seq = torch.randint(0, 30, (90,), generator=g)
    extra = {"is_query": torch.arange(90) % 3 != 0, "is_gallery": torch.arange(90) % 4 != 1} if masks else {}
    whole, _ = retrieval_metrics(x, y, sequence_ids=seq, return_per_query=True, **extra, **SEARCHED)
    monkeypatch.setattr(_per_query, "NEIGHBOUR_TABLE_BYTES", 2000)  # a few queries per chunk
    monkeypatch.setattr(_per_query, "symmetric_search_fits", lambda n, k: False)
    chunks: list[int] = []
    tables: list[torch.Tensor] = []
    search = _per_query._search

    def counting(*args: Any, **kwargs: Any) -> Callable[[torch.Tensor], Any]:
        prepared = search(*args, **kwargs)

        def chunk(rows: torch.Tensor) -> Any:
            chunks.append(rows.numel())
            found = prepared(rows)
            tables.extend(found)  # held here, so that no later tensor takes their memory
            return found

        return chunk

    monkeypatch.setattr(_per_query, "_search", counting)
    joined = _per_query._joined
    held: list[bool] = []

    def owning(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        # a chunk's value that is a view of its (rows, K) neighbour table would keep the whole table alive
        table_memory = {t.untyped_storage().data_ptr() for t in tables}
        held.extend(v.untyped_storage().data_ptr() in table_memory for p in parts for v in p.values())
        return joined(parts)

    monkeypatch.setattr(_per_query, "_joined", owning)
    chunked = retrieval_metrics(x, y, sequence_ids=seq, **extra, **SEARCHED)
    assert len(chunks) > 5
    assert held and not any(held)
    assert {k: v.item() for k, v in chunked.items()} == pytest.approx({k: v.item() for k, v in whole.items()})


def test_leave_one_out_takes_one_symmetric_pass_when_its_buffer_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchmetrics_retrieval.functional import _per_query

    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(90, 6, generator=g), torch.randint(0, 6, (90,), generator=g)
    whole, _ = retrieval_metrics(x, y, return_per_query=True, **SEARCHED)
    monkeypatch.setattr(_per_query, "NEIGHBOUR_TABLE_BYTES", 2000)  # the table alone would be chunked
    searches: list[tuple[bool, int]] = []
    search = _per_query._search

    def recording(*args: Any, **kwargs: Any) -> Callable[[torch.Tensor], Any]:
        prepared = search(*args, **kwargs)
        return lambda rows: searches.append((prepared.problem.symmetric, rows.numel())) or prepared(rows)

    monkeypatch.setattr(_per_query, "_search", recording)
    once = retrieval_metrics(x, y, **SEARCHED)
    assert searches == [(True, 90)]  # one symmetric search of every query
    assert {k: v.item() for k, v in once.items()} == pytest.approx({k: v.item() for k, v in whole.items()})


def test_metrics_only_path_skips_uniform_ties_and_keeps_every_value(monkeypatch: pytest.MonkeyPatch) -> None:
    # Gallery items on 8 circles around the queries (float32 keys cannot order a circle), 2-D labels and a
    # custom comparison, compiled kernels forced on: the metrics-only search orders only the runs of near
    # ties that mix relevant and irrelevant items (through retrieval's relevance function, which must see
    # each query's own labels), and every per-query value equals the exact search's.
    from torchmetrics_retrieval.functional import _per_query
    from torchmetrics_retrieval.functional._search import certify, plan

    monkeypatch.setattr(plan, "_forced", True)
    g = torch.Generator().manual_seed(13)
    level = torch.arange(8).repeat_interleave(60) + 1.0
    angle = torch.rand(480, generator=g) * 2 * torch.pi
    circles = torch.stack([level * angle.cos(), level * angle.sin()], dim=1)
    x = torch.cat([1e-3 * torch.randn(50, 2, generator=g), circles])
    # circle items labelled 0 or 1 at random, queries 0, 1 or 2: a circle is a mixed run for a query of label
    # 0 or 1 and a uniform one (all irrelevant) for a query of label 2
    first = torch.cat([torch.randint(0, 3, (50,), generator=g), torch.randint(0, 2, (480,), generator=g)])
    labels = torch.stack([first, torch.zeros(530, dtype=torch.long)], dim=1)
    split = {"is_query": torch.arange(530) < 50, "is_gallery": torch.arange(530) >= 50}
    options = RetrievalOptions.create(label_comparison_fn=lambda a, b: (a == b).all(dim=-1), **SEARCHED)
    exact = retrieval_per_query(x, labels, options=options, **split)
    monkeypatch.setattr(_per_query, "NEIGHBOUR_TABLE_BYTES", 40000)  # query chunks
    calls = []
    mixed_runs = certify.mixed_runs
    monkeypatch.setattr(certify, "mixed_runs", lambda *a: calls.append(1) or mixed_runs(*a))
    fast = retrieval_per_query(x, labels, options=options, keep_neighbours=False, **split)
    assert len(calls) > 1 and fast.indices.shape[1] == 0  # the chunked, metrics-only search
    for key, expected in exact.values.items():
        assert torch.allclose(fast.values[key], expected, rtol=0.0, atol=1e-6), key
