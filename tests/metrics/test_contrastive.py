"""ContrastiveAccuracy: class == functional == the full similarity matrix; errors; state; Lightning; sharded DDP.

Lightning and scikit-learn are imported inside the test that needs them: the gloo workers of the sharded tests
import this module, and should not spend seconds on it.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MetricCollection

from tests.metrics._distributed import run_distributed, sampler_rows
from tests.metrics._helpers import split_points
from torchmetrics_retrieval.functional._search.keys import largest_norm
from torchmetrics_retrieval.functional.contrastive import (
    _count_above,
    _count_more_similar,
    _pair_dots,
    _prepare,
    _rounding_bound,
    contrastive_accuracy,
)
from torchmetrics_retrieval.metrics.contrastive import ContrastiveAccuracy


def full_matrix(z1: Tensor, z2: Tensor, k: int, normalize: bool = True) -> float:
    """Both directions from the whole float64 similarity matrix: a hit when fewer than k are strictly better.

    Rows are normalised in their own dtype first (the definition: similarities of the normalised float32 rows).
    """
    if normalize:
        z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
    sim = z1.double() @ z2.double().T
    partner = sim.diagonal()
    forward = ((sim > partner[:, None]).sum(dim=1) < k).double().mean()
    backward = ((sim > partner[None, :]).sum(dim=0) < k).double().mean()
    return float((forward + backward) / 2)


def tied_views(n: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    """Small-integer views: exact similarities and many ties (no zero row)."""
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randint(-2, 3, (n, d), generator=g).float()
    z2 = z1 + torch.randint(-1, 2, (n, d), generator=g).float()
    z1[(z1 == 0).all(dim=1)] = 1.0
    z2[(z2 == 0).all(dim=1)] = 1.0
    return z1, z2


def feed(metric: ContrastiveAccuracy, z1: Tensor, z2: Tensor, mode: str, seed: int = 0) -> ContrastiveAccuracy:
    for start, end in split_points(z1.shape[0], mode, seed):
        metric.update(z1[start:end], z2[start:end])
    return metric


# ---- values ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["one", "single", "random"])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_functional_and_full_matrix(split: str, normalize: bool) -> None:
    z1, z2 = tied_views(30, 3, seed=int(normalize))
    single = feed(ContrastiveAccuracy(normalize=normalize, chunk_size=7), z1, z2, split, seed=2).compute()
    assert single.ndim == 0
    torch.testing.assert_close(single, contrastive_accuracy(z1, z2, normalize=normalize), rtol=0, atol=0)
    assert float(single) == pytest.approx(full_matrix(z1, z2, 1, normalize), abs=1e-7)
    several = feed(ContrastiveAccuracy(top_k=(5, 1, 3), normalize=normalize), z1, z2, split, seed=2).compute()
    assert list(several) == ["contrastive_accuracy/1", "contrastive_accuracy/3", "contrastive_accuracy/5"]
    for k in (1, 3, 5):
        assert float(several[f"contrastive_accuracy/{k}"]) == pytest.approx(full_matrix(z1, z2, k, normalize), abs=1e-7)


def test_hand_computed() -> None:
    # cosine similarities s(z1[i], z2[j]): row 0 (0.995, 1, 0.707), row 1 (0.0995, 0, 0.707), row 2 (0.774, 0.707, 1).
    # z1 -> z2: candidates above the partner: 1, 2, 0; z2 -> z1 (columns): 0, 2, 0.
    # k = 1: (1/3 + 2/3) / 2 = 0.5; k = 2: (2/3 + 2/3) / 2.
    metric = ContrastiveAccuracy(top_k=(1, 2))
    metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
    metric.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0]]))
    values = {key: float(value) for key, value in metric.compute().items()}
    assert values == pytest.approx({"contrastive_accuracy/1": 0.5, "contrastive_accuracy/2": 2 / 3})


def test_nidl_documented_example() -> None:
    # nidl: z1 = randn(8, 128), z2 = z1 + 0.1 * randn(8, 128) -> tensor(1.)
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(8, 128, generator=g)
    z2 = z1 + 0.1 * torch.randn(8, 128, generator=g)
    metric = ContrastiveAccuracy(top_k=1)
    metric.update(z1[:5], z2[:5])
    metric.update(z1[5:], z2[5:])
    torch.testing.assert_close(metric.compute(), torch.tensor(1.0))


def test_pairs_are_scored_against_every_accumulated_sample() -> None:
    # each batch alone is perfect (one pair); together, cosines s(z1[i], z2[j]) are
    # row 0: (0.965, 0.995) -> miss, row 1: (0.447, 0.0995) -> miss; columns: z2[0] hits, z2[1] misses -> 1 of 4
    metric = ContrastiveAccuracy()
    metric.update(torch.tensor([[1.0, 0.2]]), torch.tensor([[1.0, 0.5]]))
    metric.update(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.1]]))
    assert float(metric.compute()) == 0.25


def test_indexes_deduplicate_and_dtypes() -> None:
    z1, z2 = tied_views(16, 4, seed=5)
    metric = ContrastiveAccuracy(top_k=(1, 2))
    for rows in (torch.arange(10), torch.arange(6, 16), torch.tensor([3, 15])):  # overlapping: duplicates dropped
        metric.update(z1[rows].double(), z2[rows], indexes=rows)
    assert metric.z1[0].dtype == metric.z2[0].dtype == torch.float64  # both views in the promoted dtype
    expected = contrastive_accuracy(z1.double(), z2.double(), top_k=(1, 2))
    for key, value in metric.compute().items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0)


def test_forward_gives_the_batch_value() -> None:
    z1, z2 = tied_views(12, 3, seed=7)
    metric = ContrastiveAccuracy()
    batch_value = metric(z1[:6], z2[:6])
    torch.testing.assert_close(batch_value, contrastive_accuracy(z1[:6], z2[:6]), rtol=0, atol=0)
    metric(z1[6:], z2[6:])
    torch.testing.assert_close(metric.compute(), contrastive_accuracy(z1, z2), rtol=0, atol=0)


# ---- bad input ---------------------------------------------------------------------------------------------------


BAD_UPDATES: dict[str, tuple[dict[str, Any], type, str]] = {
    "z1 1-D": ({"z1": torch.ones(2)}, ValueError, "`z1` must be 2-D"),
    "z2 3-D": ({"z2": torch.ones(2, 3, 1)}, ValueError, "`z2` must be 2-D"),
    "z2 rows": ({"z2": torch.ones(3, 3)}, ValueError, r"`z2` must have the shape \(2, 3\) of `z1`"),
    "z2 ints": ({"z2": torch.ones(2, 3, dtype=torch.long)}, TypeError, "`z2` must have a floating"),
    "z1 NaN": ({"z1": torch.full((2, 3), float("nan"))}, ValueError, "`z1` must be finite"),
    "z2 inf": ({"z2": torch.full((2, 3), float("inf"))}, ValueError, "`z2` must be finite"),
    "dimension changes": ({"z1": torch.ones(2, 4), "z2": torch.ones(2, 4)}, ValueError, "`z1` must have 3 columns"),
    "z2 list": ({"z2": [[1.0] * 3] * 2}, TypeError, "`z2` must be a torch.Tensor"),
    "indexes switch": ({"indexes": torch.arange(2)}, ValueError, "`indexes` must be None in every batch"),
}


@pytest.mark.parametrize("case", list(BAD_UPDATES))
def test_bad_update_raises_and_leaves_state_untouched(case: str) -> None:
    changes, error, message = BAD_UPDATES[case]
    metric = ContrastiveAccuracy()
    metric.update(torch.ones(3, 3), torch.ones(3, 3))
    before = {name: [t.clone() for t in getattr(metric, name)] for name in metric._defaults}
    with pytest.raises(error, match=message):
        metric.update(**{"z1": torch.ones(2, 3), "z2": torch.ones(2, 3), **changes})
    for name, tensors in before.items():
        assert len(getattr(metric, name)) == len(tensors)
        assert all(torch.equal(a, b) for a, b in zip(getattr(metric, name), tensors, strict=True))


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("top_k", 0, ValueError),
        ("top_k", (1, -2), ValueError),
        ("top_k", (), ValueError),
        ("top_k", 1.5, TypeError),
        ("normalize", "yes", TypeError),
        ("eps", -1e-3, ValueError),
        ("eps", "small", TypeError),
        ("chunk_size", 0, ValueError),
        ("distributed", "all", ValueError),
    ],
)
def test_bad_option_names_itself(option: str, value: Any, error: type) -> None:
    with pytest.raises(error, match=f"`{option}`"):
        ContrastiveAccuracy(**{option: value})


def test_unknown_keyword_and_empty() -> None:
    with pytest.raises(ValueError, match="Unexpected keyword arguments: `topk`"):
        ContrastiveAccuracy(topk=1)
    metric = ContrastiveAccuracy()
    metric.update(torch.zeros(0, 3), torch.zeros(0, 3))  # a zero-row batch is a no-op
    with pytest.raises(ValueError, match="at least one sample"):
        metric.compute()


# ---- state handling ---------------------------------------------------------------------------------------------


def test_reset_clone_pickle_state_dict() -> None:
    z1, z2 = tied_views(20, 3, seed=9)
    metric = feed(ContrastiveAccuracy(top_k=(1, 4)), z1, z2, "random")
    expected = metric.compute()
    for other in (metric.clone(), pickle.loads(pickle.dumps(metric))):
        assert other.compute() == expected and other.top_k == (1, 4)
    metric.persistent(True)
    fresh = ContrastiveAccuracy(top_k=(1, 4))
    fresh.persistent(True)
    fresh.load_state_dict(metric.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fresh.compute() == expected
    metric.reset()
    assert metric.z1 == [] and metric.z2 == []
    assert feed(metric, z1, z2, "single").compute() == expected


def test_metric_collection() -> None:
    z1, z2 = tied_views(20, 3, seed=10)
    collection = MetricCollection(
        {"top1": ContrastiveAccuracy(), "raw": ContrastiveAccuracy(top_k=(2,), normalize=False)}
    )
    for rows in torch.arange(20).split(6):
        collection.update(z1[rows], z2[rows])
    values = collection.compute()
    assert sorted(values) == ["contrastive_accuracy/2", "top1"]
    assert float(values["top1"]) == pytest.approx(full_matrix(z1, z2, 1))
    assert float(values["contrastive_accuracy/2"]) == pytest.approx(full_matrix(z1, z2, 2, normalize=False))


def test_plot() -> None:
    import matplotlib  # a declared test dependency (the `test` extra): a missing one fails, not skips

    matplotlib.use("Agg")
    metric = feed(ContrastiveAccuracy(), *tied_views(10, 3, seed=1), "one")
    fig, _ = metric.plot()
    assert fig is not None
    fig, _ = metric.plot([metric.compute(), metric.compute()])
    assert fig is not None


def test_class_flags() -> None:
    assert ContrastiveAccuracy.is_differentiable is False and ContrastiveAccuracy.full_state_update is False
    assert ContrastiveAccuracy.higher_is_better is True
    assert (ContrastiveAccuracy.plot_lower_bound, ContrastiveAccuracy.plot_upper_bound) == (0.0, 1.0)


# ---- Lightning ----------------------------------------------------------------------------------------------------


def two_views_module(out_dir: str) -> Any:
    """A LightningModule that embeds two noisy views of each digit; validation logs the metric object itself."""
    import lightning.pytorch as pl

    class TwoViews(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
            self.metric = ContrastiveAccuracy(top_k=1)
            self.seen: list[tuple[Tensor, Tensor]] = []

        def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
            view1, view2 = batch
            z1, z2 = self.embed(view1), self.embed(view2)
            self.metric.update(z1, z2)
            self.log("val/contrastive", self.metric)  # Lightning calls compute() and reset() at the epoch end
            self.seen.append((z1, z2))

        def on_validation_epoch_end(self) -> None:
            z1, z2 = (torch.cat(parts) for parts in zip(*self.seen, strict=True))
            torch.save((z1, z2), Path(out_dir) / "views.pt")

    return TwoViews()


@pytest.mark.slow
def test_lightning_validate_logs_the_exact_value(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from sklearn.datasets import load_digits

    pl.seed_everything(0)
    x = torch.tensor(load_digits().data[:300], dtype=torch.float32) / 16
    g = torch.Generator().manual_seed(1)
    views = TensorDataset(x + 0.3 * torch.randn(x.shape, generator=g), x + 0.3 * torch.randn(x.shape, generator=g))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    model = two_views_module(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers
        (logged,) = trainer.validate(model, DataLoader(views, batch_size=64))
    z1, z2 = torch.load(tmp_path / "views.pt")
    expected = contrastive_accuracy(z1, z2)
    torch.testing.assert_close(torch.as_tensor(logged["val/contrastive"]), expected, rtol=0, atol=0)
    assert 0.0 < float(expected) < 1.0  # the epoch value over all 300 pairs, not a mean of batch values
    assert model.metric.z1 == []  # Lightning reset the metric after logging


def test_forward_checks_the_batch_first() -> None:
    metric = ContrastiveAccuracy()
    metric(torch.ones(3, 3), torch.ones(3, 3))
    with pytest.raises(ValueError, match="`z1` must have 3 columns like the previous"):
        metric(torch.ones(2, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"`z2` must have the shape \(2, 3\) of `z1`"):
        metric(torch.ones(2, 3), torch.ones(1, 3))
    assert [t.shape for t in metric.z1] == [(3, 3)] and [t.shape for t in metric.z2] == [(3, 3)]


# ---- sharded mode (the default under DDP) -------------------------------------------------------------------------

N_SHARDED = 29  # not a multiple of 2 or 3: DistributedSampler pads with duplicates
SHARDED_TOP_K = (1, 2, 5, 40)
#: rows of each rank, by world size: uneven shards, and an empty rank
UNEVEN = {1: [N_SHARDED], 2: [20, 9], 3: [3, 19, 7]}
WITH_EMPTY = {1: [N_SHARDED], 2: [0, N_SHARDED], 3: [17, 0, 12]}


def sharded_data() -> dict[str, tuple[Tensor, Tensor]]:
    """Small-integer views (exact similarities, ties, duplicated pairs and candidates) and Gaussian ones."""
    z1, z2 = tied_views(N_SHARDED, 3, seed=11)
    z1[20:26], z2[20:26] = z1[:6], z2[:6]  # whole pairs repeated at other indexes
    z2[26:] = z2[6:9]  # candidates repeated
    g = torch.Generator().manual_seed(12)
    x = torch.randn(N_SHARDED, 8, generator=g)
    return {"tied": (z1, z2), "gaussian": (x, x + 0.7 * torch.randn(N_SHARDED, 8, generator=g))}


def _padded_rows(n: int, rank: int, world_size: int) -> Tensor:
    return sampler_rows(n, rank, world_size, seed=3)


def _shard_rows(sizes: list[int], rank: int) -> Tensor:
    start = sum(sizes[:rank])
    return torch.arange(start, start + sizes[rank])


def _sharded_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    from torchmetrics_retrieval.metrics._sharded import contrastive as _shard_contrastive

    calls = []
    sharded = _shard_contrastive.sharded_contrastive
    _shard_contrastive.sharded_contrastive = lambda *args: calls.append(1) or sharded(*args)  # type: ignore[assignment]
    _shard_contrastive.VISIT_BLOCK = 4  # several rounds, a different number of blocks on each rank
    outcomes: dict[str, Any] = {}
    for name, (z1, z2) in sharded_data().items():
        for normalize in (True, False):
            scenarios = {  # rows of this rank, with indexes?
                "padded": (_padded_rows(N_SHARDED, rank, world_size), True),
                "uneven": (_shard_rows(UNEVEN[world_size], rank), True),
                "empty_rank": (_shard_rows(WITH_EMPTY[world_size], rank), False),  # rank order: the whole set
            }
            for scenario, (rows, indexes) in scenarios.items():
                for distributed in ("shard", "gather") if scenario == "padded" else ("shard",):
                    metric = ContrastiveAccuracy(
                        top_k=SHARDED_TOP_K, normalize=normalize, chunk_size=3, distributed=distributed
                    )
                    for batch in rows.split(4):
                        metric.update(z1[batch], z2[batch], indexes=batch if indexes else None)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the empty rank gets torchmetrics' warning
                        outcomes[f"{name}/{normalize}/{scenario}/{distributed}"] = metric.compute()
        single = ContrastiveAccuracy(normalize=False)  # an int top_k: a 0-dim tensor
        rows = _padded_rows(N_SHARDED, rank, world_size)
        single.update(z1[rows], z2[rows], indexes=rows)
        outcomes[f"{name}/single"] = single.compute()
    outcomes["calls"] = len(calls)
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_identical_to_one_process(world_size: int, tmp_path: Path) -> None:
    """Every scenario on 1-3 processes equals the functional on the whole set, bit for bit; the sharded path ran."""
    results = run_distributed(_sharded_scenarios, world_size, tmp_path)
    for name, (z1, z2) in sharded_data().items():
        for normalize in (True, False):
            expected = contrastive_accuracy(z1, z2, SHARDED_TOP_K, normalize=normalize)
            assert 0 < float(expected["contrastive_accuracy/1"]) < 1
            for rank, outcomes in enumerate(results):
                for scenario in ("padded/shard", "padded/gather", "uneven/shard", "empty_rank/shard"):
                    got = outcomes[f"{name}/{normalize}/{scenario}"]
                    assert list(got) == list(expected)
                    for key in expected:
                        torch.testing.assert_close(
                            got[key], expected[key], rtol=0, atol=0, msg=f"{world_size} {rank} {scenario} {key}"
                        )
                single = outcomes[f"{name}/single"]
                assert single.ndim == 0 and torch.equal(single, contrastive_accuracy(z1, z2, normalize=False))
    for outcomes in results:  # 2 data sets x 2 normalisations x 3 scenarios, and the int top_k, per data set
        assert outcomes["calls"] == (0 if world_size == 1 else 2 * (2 * 3 + 1))


def _bad_batch_on_last_rank(rank: int, world_size: int) -> dict[str, Any]:
    z1, z2 = tied_views(12, 3, seed=13)
    outcomes: dict[str, Any] = {}
    for case in ("dimension", "nan"):
        metric = ContrastiveAccuracy()
        rows = torch.arange(rank, 12, world_size)
        if case == "dimension" and rank == world_size - 1:  # a valid batch alone, another D than the others'
            metric.update(torch.ones(rows.numel(), 4), torch.ones(rows.numel(), 4))
        else:
            metric.update(z1[rows], z2[rows])
        if case == "nan" and rank == world_size - 1:  # e.g. a state loaded from a bad checkpoint
            metric.z2[0][0, 1] = float("nan")
        try:
            metric.compute()
            outcomes[case] = "no error"
        except ValueError as error:
            outcomes[case] = str(error)
        outcomes[f"{case}/kept"] = [t.shape[0] for t in metric.z1] == [rows.numel()]  # the local state is kept
    return outcomes


@pytest.mark.slow
def test_a_bad_batch_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    outcomes = run_distributed(_bad_batch_on_last_rank, 2, tmp_path, timeout=60.0)
    for rank in (0, 1):
        assert "`z1` must have the same trailing shape and dtype on every process" in outcomes[rank]["dimension"]
        assert outcomes[rank]["dimension/kept"] and outcomes[rank]["nan/kept"]
    assert "`z2` must be finite" in outcomes[1]["nan"]
    assert "other process" in outcomes[0]["nan"]


@pytest.mark.parametrize("normalize", [True, False])
def test_counts_over_a_split_of_rows_and_candidates_add_up(normalize: bool) -> None:
    """The decomposition sharded mode relies on: counting visiting blocks of ``z1`` rows against shards of
    pairs, with the partner values and a rounding bound of the whole set, gives the counts of the whole set."""
    for z1, z2 in sharded_data().values():
        a, b = _prepare(z1, torch.float32, normalize, 1e-12), _prepare(z2, torch.float32, normalize, 1e-12)
        above_1, above_2 = _count_more_similar(a, b, chunk=5)
        idx = torch.arange(N_SHARDED)
        partner = _pair_dots(a, b, idx, idx)
        tol = _rounding_bound(a.shape[1], a.dtype, largest_norm(a), largest_norm(b))
        shards = torch.randperm(N_SHARDED, generator=torch.Generator().manual_seed(1)).tensor_split([10, 10, 22])
        blocks = idx.tensor_split([7, 8, 20])  # an empty block and an empty shard included
        summed_1, summed_2 = torch.zeros_like(above_1), torch.zeros_like(above_2)
        for shard in shards:
            for block in blocks:
                counts_1, counts_2 = _count_above(a[block], b[shard], partner[block], partner[shard], tol, chunk=3)
                summed_1[block] += counts_1
                summed_2[shard] += counts_2
        assert torch.equal(summed_1, above_1) and torch.equal(summed_2, above_2)
