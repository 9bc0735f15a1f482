"""Smoke tests that keep benchmarks/bench_retrieval.py runnable (no timing is asserted)."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/{name}.py`` imported as a module (``benchmarks/`` is not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_retrieval")


def test_clustered_embeddings_are_seeded_unit_rows_with_balanced_classes() -> None:
    common = load_benchmark("_common")
    x, labels = common.clustered_embeddings(1000, "per_class20", seed=3)
    again, _ = common.clustered_embeddings(1000, "per_class20", seed=3)
    assert x.shape == (1000, 128) and x.dtype == torch.float32
    assert torch.equal(x, again)
    torch.testing.assert_close(x.norm(dim=1), torch.ones(1000))
    assert torch.bincount(labels).tolist() == [20] * 50
    _, labels100 = common.clustered_embeddings(1000, "classes100")
    assert torch.bincount(labels100).tolist() == [10] * 100


@pytest.mark.slow
def test_measure_every_local_method_and_values_agree_with_pml(bench: ModuleType) -> None:
    rows = {
        m: bench.measure(m, 2000, "classes100", repeats=1)
        for m in ("matmul", "faiss", "ours", "ours_map_full", "ours_mrr", "pml")
    }
    for method, row in rows.items():
        assert row["method"] == method and row["n"] == 2000 and row["k"] == 19
        assert row["seconds"] > 0
    ours, pml = rows["ours"]["values"], rows["pml"]["values"]
    assert set(ours) == {"cmc/1", "cmc/5", "precision/5", "map/5", "map_at_r", "r_precision"}
    assert "map" in rows["ours_map_full"]["values"] and "mrr" in rows["ours_mrr"]["values"]
    for key in ours:  # the values read off the full ranks (no search) are the searched ones
        assert rows["ours_map_full"]["values"][key] == ours[key] == rows["ours_mrr"]["values"][key], key
    for key in ("cmc/1", "r_precision", "map_at_r"):  # PML computes these independently of our code
        assert ours[key] == pytest.approx(pml[key], abs=1e-5), key
    table = bench.format_table(2000, "classes100", {**rows, "oml": {"method": "oml", "status": "not installed"}})
    assert "| ours |" in table and "| oml | not installed |" in table and "max |ours - pml|" in table


def test_measure_rejects_an_unknown_method(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="`method` must be one of"):
        bench.measure("annoy", 100, "classes100")


@pytest.mark.slow
def test_command_line_runs_workers_in_subprocesses(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    # one worker per method times both thread counts in turn (--paired-threads); OML without its interpreter is
    # reported, not failed
    argv = ["--sizes", "1000", "--regimes", "per_class20", "--methods", "faiss", "ours", "oml", "--threads", "1", "2"]
    bench.main([*argv, "--paired-threads"])
    out = capsys.readouterr().out
    assert "1000 per_class20 [1, 2] threads ours" in out and "[1] threads" not in out
    assert "1 thread(s): N = 1000, per_class20, K = 19" in out and "2 thread(s): N = 1000" in out
    assert "| oml | not installed (give --oml-python) |" in out
    assert "| ours |" in out and "| speed-up |" in out and "failed" not in out


@pytest.mark.parametrize("visit_rows", [16384, 256])  # one step a round, or several
@pytest.mark.parametrize("world", [2, 3])
def test_shard_work_models_the_sharded_search(world: int, visit_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The searches ``bench_shard_work`` times, merged per rank, are the whole search's top K: the model leaves no
    pair out and computes none twice to get there."""
    from torchmetrics_retrieval.metrics._sharded import search

    monkeypatch.setattr(search, "VISIT_ROWS", visit_rows)
    common = load_benchmark("_common")  # the benchmark imports it by this name
    work = load_benchmark("bench_shard_work")
    n = 1500
    seconds, merged = work.decomposition(n, world)()
    assert set(seconds) == set(work.PARTS) and all(value >= 0 for value in seconds.values())
    x, _ = common.clustered_embeddings(n, "per_class20")
    from torchmetrics_retrieval.functional import knn

    whole = knn(x, k=work.K, exclude_self=True)
    for rank, (distances, items, valid) in enumerate(merged):
        rows = torch.arange(rank, n, world)
        assert bool(valid.all())
        assert torch.equal(items, whole.indices[rows])
        assert torch.equal(distances, whole.distances[rows])


@pytest.mark.slow
def test_ddp_measures_sharded_families_identical_to_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_ddp's measuring function on 2 gloo ranks, no timing asserted: positive times, identical values."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the spawned ranks import the benchmark and _common by name
    load_benchmark("_common")
    ddp = load_benchmark("bench_ddp")
    for family, modes in (("pairs", ("shard",)), ("contrastive", ("shard", "copies"))):
        records = ddp.measure(family, 600, ranks=(2,), rounds=1, modes=modes, memory=False)
        runs = [(r["family"], r["ranks"], r["mode"], r["round"]) for r in records]
        assert runs == [(family, 1, "shard", 0), *((family, 2, mode, 0) for mode in modes)]
        for record in records:
            assert record["seconds"] > 0 and record["one_seconds"] > 0 and record["cpu"] > 0
            assert record["identical"] and record["memory_mib"] is None
        lines = ddp.summary(records)
        assert len(lines) == len(modes)
        for line, mode in zip(lines, modes, strict=True):
            assert line.startswith(family) and f"P=2 {mode}:" in line and "identical True" in line
    # copies: two whole problems in the time of the slower copy, each copy's CPU time against one problem's
    copies = records[-1]
    assert copies["speedup"] == pytest.approx(2 * copies["one_seconds"] / copies["seconds"])
    assert copies["work"] == pytest.approx(copies["cpu"] / (2 * copies["one_cpu"]))


def test_trials_benchmark_prints_every_option_set_and_the_memory(capsys: pytest.CaptureFixture[str]) -> None:
    load_benchmark("_common")
    trials = load_benchmark("bench_trials")
    trials.main(["--scores", "2000", "--embeddings", "300", "--trials", "2000"])
    out = capsys.readouterr().out
    for name in trials.OPTION_SETS:
        assert out.count(f"  {name:<22} ") == len({1, os.cpu_count() or 1}), out  # padded as printed
    assert "2,000 trials over 300 x 128 embeddings" in out and "working memory" in out


def test_qrels_benchmark_runs_and_agrees_with_pytrec_eval(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pytrec_eval")
    load_benchmark("_common")  # the benchmark imports it by this name
    qrels = load_benchmark("bench_qrels")
    qrels.main(["--corpus", "3000", "--queries", "50", "--dim", "16", "--memory-corpus", "2000", "--threads", "1"])
    out = capsys.readouterr().out
    assert "MTEB/BEIR pipeline" in out and "x the pipeline" in out and "peak memory above" in out
    gap = float(out.split("recall/100, precision/10: ")[1].split(";")[0])
    assert gap < 1e-6  # the same measures as pytrec_eval on the pipeline's run


def test_audit_benchmark_prints_the_audit_cost_and_both_evaluations(capsys: pytest.CaptureFixture[str]) -> None:
    load_benchmark("_common")
    audit = load_benchmark("bench_audit")
    audit.main(["--audit-queries", "300", "--audit-gallery", "3000", "--sizes", "2000", "4000", "--target", "8000"])
    out = capsys.readouterr().out
    n_threads = len({1, os.cpu_count() or 1})
    assert out.count("audit_neighbours") == n_threads, out
    assert out.count("approximate + audit") == 3 * n_threads, out  # two sizes, and the extrapolation
    assert out.count("extrapolated to N = 8,000 from N = 2,000 and 4,000") == n_threads, out
    # the exact evaluation timed on a sample of queries, extrapolated in the number of queries
    audit.main(["--no-audit-cost", "--sizes", "3000", "--target", "3000", "--exact-queries", "200"])
    out = capsys.readouterr().out
    assert "audit_neighbours" not in out and "extrapolated to N" not in out, out
    assert out.count("exact (extrapolated from 200 and 400 queries)") == n_threads, out


def test_precision_benchmark_prints_every_precision_faiss_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    load_benchmark("_common")
    precision = load_benchmark("bench_precision")
    precision.main(["--n", "400", "--dim", "16", "--k", "5", "--threads", "1"])
    out = capsys.readouterr().out
    assert "bare faiss" in out and "products 512 x 4096 x 16" in out
    for name in precision.PRECISIONS:
        assert f"knn {name:<8}" in out and "identical True" in out
    assert "undecided after round 1" in out
    assert out.count("EmbeddingMetrics torch.float16 storage") == 3 and "peak above the stored set" in out
    # a subset of the queries against the whole set, timed twice and extrapolated to every sample as a query
    precision.main(["--n", "400", "--dim", "16", "--threads", "1", "--queries", "100", "--precisions", "float32"])
    out = capsys.readouterr().out
    assert "bare faiss" not in out and "100 queries" in out and "50 queries" in out, out
    assert "extrapolated to 400 queries" in out, out
