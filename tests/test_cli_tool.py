"""``torchmetrics-retrieval evaluate`` as a tool: every input format, the per-sample fields, ``--report``,
``--compare``, progress bars, and one-line errors with exit code 2 — on scikit-learn's digits."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import ttest_rel
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestNeighbors

import torchmetrics_retrieval.functional as F
from tests.test_cli import digits_ranking
from torchmetrics_retrieval.cli import main
from torchmetrics_retrieval.functional import _progress

PNG = b"\x89PNG\r\n\x1a\n"


def run(argv: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own usage errors
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def evaluate_json(argv: list[Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(["evaluate", *argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def digits() -> Any:
    return load_digits()


def test_every_input_format_gives_the_same_numbers(tmp_path: Path, digits: Any, capsys: Any) -> None:
    from safetensors.numpy import save_file

    x, y = digits.data.astype(np.float32), digits.target
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "both.npz", embeddings=x, labels=y)
    torch.save({"emb": torch.from_numpy(x), "y": torch.from_numpy(y)}, tmp_path / "d.pt")
    save_file({"emb": x, "labels": y}, str(tmp_path / "d.safetensors"))
    names = np.array([f"digit-{v}" for v in y])  # text labels: equal texts are one label
    with (tmp_path / "labels.csv").open("w", newline="") as file:
        csv.writer(file).writerows([["id", "label"], *zip(range(len(y)), names, strict=True)])
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"digit": y}), tmp_path / "labels.parquet")
    forms = [
        [tmp_path / "x.npy", f"{tmp_path / 'both.npz'}:labels"],
        [f"{tmp_path / 'both.npz'}:embeddings", tmp_path / "labels.csv"],
        [f"{tmp_path / 'd.pt'}:emb", f"{tmp_path / 'd.pt'}:y"],
        [f"{tmp_path / 'd.safetensors'}:emb", tmp_path / "labels.parquet", "--label-column", "digit"],
    ]
    results = [evaluate_json([*form, "--cmc", "1", "5", "--map-full"], capsys) for form in forms]
    assert all(result == results[0] for result in results[1:])
    _, _, _, relevant = digits_ranking()  # the independent ranking (scipy distances, stable sort)
    assert results[0]["cmc/1"] == pytest.approx(relevant[:, 0].mean(), abs=1e-6)


def _reid_columns(digits: Any) -> dict[str, np.ndarray]:
    n = len(digits.target)
    return {
        "label": digits.target,
        "camera": np.arange(n) % 3,
        "sequence": np.arange(n) // 7,
        "group": np.arange(n) % 2,
        "is_query": np.where(np.arange(n) % 4 == 0, "true", "false"),
        "category": np.where(digits.target < 5, "low", "high"),
    }


def test_per_sample_fields_from_table_columns_and_files(tmp_path: Path, digits: Any, capsys: Any) -> None:
    columns = _reid_columns(digits)
    with (tmp_path / "samples.csv").open("w", newline="") as file:
        csv.writer(file).writerows([list(columns), *zip(*columns.values(), strict=True)])
    np.save(tmp_path / "x.npy", digits.data.astype(np.float32))
    np.save(tmp_path / "camera.npy", columns["camera"])
    base = [tmp_path / "x.npy", tmp_path / "samples.csv", "--cmc", "1", "5", "--map-full", "--minp"]
    rules = ["--camera-ids", "camera", "--sequence-ids", "sequence", "--search-groups", "group"]
    from_columns = evaluate_json([*base, *rules, "--is-query", "is_query", "--categories", "category"], capsys)
    from_file = evaluate_json([*base, *rules[2:], "--camera-ids", tmp_path / "camera.npy"], capsys)
    n = len(digits.target)
    expected = F.retrieval_metrics(
        torch.from_numpy(digits.data.astype(np.float32)),
        torch.from_numpy(digits.target),
        camera_ids=torch.from_numpy(columns["camera"]),
        sequence_ids=torch.from_numpy(columns["sequence"]),
        search_groups=torch.from_numpy(columns["group"]),
        is_query=torch.arange(n) % 4 == 0,
        categories=torch.from_numpy((digits.target < 5).astype(np.int64)),
        cmc_top_k=(1, 5), precision_top_k=(5,), map_top_k=(5,), map_at_r=True, r_precision=True, mrr=True,
        map_full=True, minp=True, fmr_vals=(0.1,), pcf_variance=(0.5,),
    )  # fmt: skip
    # the CLI's category codes: "high" -> 0, "low" -> 1 (sorted texts), the library's here: low -> 1, high -> 0
    assert {key: pytest.approx(float(value), abs=1e-7) for key, value in expected.items()} == from_columns
    assert from_file["cmc/1"] != from_columns["cmc/1"]  # the same rules over every query, not a quarter of them
    plain = evaluate_json([*base, *rules[2:]], capsys)
    assert plain["cmc/1"] > from_file["cmc/1"]  # the camera rule removes easy same-camera matches


def test_camera_ids_with_a_separate_gallery(tmp_path: Path, digits: Any, capsys: Any) -> None:
    noise = np.random.default_rng(1).normal(0, 1e-3, digits.data.shape)  # integer pixels tie; these do not
    x, y, camera = (digits.data + noise).astype(np.float32), digits.target, np.arange(len(digits.target)) % 3
    for name, rows in (("q", slice(0, 300)), ("g", slice(300, None))):
        np.save(tmp_path / f"{name}.npy", x[rows])
        with (tmp_path / f"{name}.csv").open("w", newline="") as file:
            csv.writer(file).writerows([["label", "cam"], *zip(y[rows], camera[rows], strict=True)])
    args = [tmp_path / "q.npy", tmp_path / "q.csv", "--gallery", tmp_path / "g.npy", "--gallery-labels"]
    found = evaluate_json([*args, tmp_path / "g.csv", "--camera-ids", "cam", "--gallery-camera-ids", "cam"], capsys)
    # fast-reid's rule by hand: drop gallery items with the query's label and camera, then nearest neighbour
    distances = np.sqrt(((x[:300, None, :].astype(np.float64) - x[None, 300:]) ** 2).sum(-1))
    distances[(y[:300, None] == y[None, 300:]) & (camera[:300, None] == camera[None, 300:])] = np.inf
    nearest = np.argmin(distances, axis=1)  # no exact ties at the minimum on these rows (checked below)
    assert (np.sort(distances, axis=1)[:, 1] > np.sort(distances, axis=1)[:, 0]).all()
    assert found["cmc/1"] == pytest.approx((y[300:][nearest] == y[:300]).mean(), abs=1e-7)


def test_report_files(tmp_path: Path, digits: Any, capsys: Any) -> None:
    np.save(tmp_path / "x.npy", digits.data.astype(np.float32))
    np.save(tmp_path / "y.npy", digits.target)
    np.save(tmp_path / "images.npy", digits.images)
    report = tmp_path / "report"
    argv = [tmp_path / "x.npy", tmp_path / "y.npy", "--cmc", "1", "5", "10", "--eer", "--min-dcf-p-target", "0.01"]
    metrics = evaluate_json([*argv, "--report", report, "--images", tmp_path / "images.npy"], capsys)
    files = {"metrics.json", "per_query.csv", "cmc.png", "precision.png", "det.png", "explained_variance.png"}
    assert sorted(path.name for path in report.iterdir()) == sorted(files | {"worst_queries.png"})
    for name in files | {"worst_queries.png"}:
        if name.endswith(".png"):
            content = (report / name).read_bytes()
            assert content[:8] == PNG and len(content) > 5000, name  # a real picture, not an empty canvas
    document = json.loads((report / "metrics.json").read_text())
    assert document["metrics"] == metrics
    assert document["inputs"] == {"samples": 1797, "dimension": 64, "gallery": None, "fields": []}
    assert document["options"]["eer"] is True and document["options"]["cmc_top_k"] == [1, 5, 10]
    with (report / "per_query.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 1797 and [int(r["query"]) for r in rows] == list(range(1797))
    labels, _, _, relevant = digits_ranking()
    assert [float(r["cmc/1"]) for r in rows] == relevant[:, 0].astype(float).tolist()  # query by query
    assert [int(r["n_relevant"]) for r in rows] == (np.bincount(labels)[labels] - 1).tolist()
    assert {"label", "counted", "cmc/5", "cmc/10", "map_at_r", "mrr"} <= set(rows[0])

    code, _, err = run(["evaluate", *argv[:2], "--report", tmp_path / "p", "--per-query-format", "parquet"], capsys)
    assert code == 0, err
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "p" / "per_query.parquet")
    assert table.num_rows == 1797 and table.column("cmc/1").to_pylist() == relevant[:, 0].astype(float).tolist()


def test_demo_report_shows_the_worst_digits(tmp_path: Path, capsys: Any) -> None:
    code, _, err = run(["demo", "--report", tmp_path, "--worst-key", "map_at_r"], capsys)
    assert code == 0 and "worst_queries.png" in err
    assert (tmp_path / "worst_queries.png").read_bytes()[:8] == PNG


def test_compare_two_models(tmp_path: Path, digits: Any, capsys: Any) -> None:
    generator = np.random.default_rng(0)
    pixels = digits.data + generator.normal(0, 1e-3, digits.data.shape)  # no exact distance ties
    projected = pixels @ generator.normal(size=(64, 16))  # a weaker model: a random 16-d projection
    np.save(tmp_path / "a.npy", pixels.astype(np.float32))
    np.save(tmp_path / "b.npy", projected.astype(np.float32))
    np.save(tmp_path / "y.npy", digits.target)
    argv = [tmp_path / "a.npy", tmp_path / "y.npy", "--cmc", "1", "--compare", tmp_path / "b.npy"]
    result = evaluate_json(argv, capsys)
    row = result["comparison"]["cmc/1"]

    def hits(x: np.ndarray) -> np.ndarray:  # scikit-learn's nearest neighbour, the query itself excluded
        _, nearest = NearestNeighbors(n_neighbors=1).fit(x).kneighbors()
        return (digits.target[nearest[:, 0]] == digits.target).astype(float)

    a, b = hits(pixels.astype(np.float32)), hits(projected.astype(np.float32))
    assert row["mean_a"] == pytest.approx(a.mean(), abs=1e-6) and row["mean_b"] == pytest.approx(b.mean(), abs=1e-6)
    assert row["difference"] == pytest.approx(b.mean() - a.mean(), abs=1e-6)
    assert row["p_value"] == pytest.approx(ttest_rel(b, a).pvalue, rel=1e-3)
    assert row["ci_low"] < row["difference"] < row["ci_high"]
    code, out, _ = run(["evaluate", tmp_path / "a.npy", tmp_path / "y.npy", "--compare", tmp_path / "b.npy"], capsys)
    assert code == 0 and "Paired comparison (paired_t" in out and "cmc/1" in out.split("Paired comparison")[1]


def test_progress_bars_follow_quiet_and_the_terminal(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(_progress, "DELAY_SECONDS", 0.0)
    # the demo's full map ranks every relevant item: its values need no kNN search, so the bars are the full
    # ranking's and the pair passes'
    _, _, err = run(["demo", "--cmc", "1"], capsys)
    assert "full ranking" not in err  # stderr is not a terminal here
    _, _, err = run(["demo", "--cmc", "1", "--progress"], capsys)
    assert "full ranking" in err and "pairs, exact values" in err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    _, _, err = run(["demo", "--cmc", "1"], capsys)
    assert "full ranking" in err
    _, _, err = run(["demo", "--cmc", "1", "--quiet"], capsys)
    assert err == ""


def test_quiet_leaves_stderr_empty(tmp_path: Path, digits: Any, capfd: Any, monkeypatch: Any) -> None:
    """``--quiet``: no progress bar, warning, log line or report file list; the results are unchanged."""
    import torchmetrics_retrieval.cli.report as report

    monkeypatch.setattr(_progress, "DELAY_SECONDS", 0.0)  # every pass would show its bar
    write_report = report.write_report

    def write_report_and_log(*args: Any, **kwargs: Any) -> list[str]:
        # What a library's log line does when no logging handler is configured, as in a command line process
        # (matplotlib's "building the font cache"); under pytest the root logger has handlers, hence by hand.
        assert logging.lastResort is not None
        logging.lastResort.handle(logging.makeLogRecord({"msg": "building the font cache", "levelno": logging.WARNING}))
        return write_report(*args, **kwargs)

    monkeypatch.setattr(report, "write_report", write_report_and_log)
    np.save(tmp_path / "x.npy", digits.data.astype(np.float32))
    np.save(tmp_path / "y.npy", digits.target)
    np.save(tmp_path / "groups.npy", np.arange(len(digits.target)) % 2)
    # faiss cannot search within groups: the library warns and searches with torch
    argv = ["evaluate", tmp_path / "x.npy", tmp_path / "y.npy", "--search-groups", tmp_path / "groups.npy"]
    argv += ["--backend", "faiss", "--cmc", "1", "--fmr", "--pcf", "--progress", "--json"]
    with pytest.warns(UserWarning, match="cannot restrict a search to search groups"):
        code, out, err = run([*argv, "--report", tmp_path / "loud"], capfd)
    assert code == 0 and "kNN search" in err and "building the font cache" in err and "report written to" in err

    with warnings.catch_warnings(record=True) as issued:  # pytest records warnings instead of printing them
        warnings.simplefilter("always")
        code, quiet_out, err = run([*argv, "--report", tmp_path / "quiet", "--quiet"], capfd)
        assert code == 0 and err == ""
        assert json.loads(quiet_out) == json.loads(out)
        assert sorted(path.name for path in (tmp_path / "quiet").iterdir()) == sorted(
            path.name for path in (tmp_path / "loud").iterdir()
        )
        fast = ["--cmc", "1", "--no-map-full", "--no-clustering", "--progress"]
        code, out, err = run(["demo", *fast, "--report", tmp_path / "demo", "--quiet"], capfd)
        assert code == 0 and err == "" and "1797 images" in out
        assert (tmp_path / "demo" / "worst_queries.png").read_bytes()[:8] == PNG
    assert [str(warning.message) for warning in issued] == []

    code, out, err = run(["evaluate", tmp_path / "x.npy", tmp_path / "missing.npy", "--quiet"], capfd)
    assert code == 2 and out == "" and "labels file not found" in err  # a failure is still reported


ERRORS = [
    (["evaluate", "missing.npy", "{y}"], "embeddings file not found: missing.npy"),
    (["evaluate", "{garbage}", "{y}"], "cannot read embeddings file"),
    (["evaluate", "{txt}", "{y}"], "embeddings file must end in"),
    (["evaluate", "{x}", "{short}"], "labels has 2 rows, not 4 like embeddings"),
    (["evaluate", "{x1d}", "{y}"], "embeddings must be a 2-D array"),
    (["evaluate", "{x}", "{y}", "--gallery", "{x}"], "--gallery needs --gallery-labels"),
    (["evaluate", "{x}", "{y}", "--gallery-labels", "{y}"], "--gallery-labels needs --gallery"),
    (["evaluate", "{npz}:nope", "{y}"], "has no array 'nope'"),
    (["evaluate", "{x}", "{table}", "--label-column", "nope"], "has no column 'nope'"),
    (["evaluate", "{x}", "{table}", "--camera-ids", "nope"], "--camera-ids 'nope' is neither a column"),
    (["evaluate", "{x}", "{y}", "--camera-ids", "{short}"], "--camera-ids has 2 rows, not 4 like the embeddings"),
    (["evaluate", "{x}", "{y}", "--gallery", "{x}", "--gallery-labels", "{y}", "--is-query", "{y}"], "--is-query"),
    (["evaluate", "{x}", "{y}", "--is-query", "{y3}"], "--is-query must hold booleans"),
    (
        ["evaluate", "{x}", "{y}", "--gallery", "{x}", "--gallery-labels", "{y}", "--sequence-ids", "{y}"],
        "--sequence-ids with --gallery needs --gallery-sequence-ids",
    ),
    (["evaluate", "{x}", "{y}", "--report", "{out}", "--worst-key", "nope"], "--worst-key must be one of"),
    (["evaluate", "{x}", "{y}", "--images", "{short}"], "--images has 2 rows, not 4 like the embeddings"),
    (["evaluate", "{x}", "{y}", "--images", "{x}"], "--images must be (N, H, W) or (N, H, W, C)"),
    (["evaluate", "{x}", "{y}", "--compare", "{x3}"], "--compare has 3 rows, not 4 like the embeddings"),
    (["evaluate", "{x}", "{y}", "--cmc", "0"], "cmc_top_k"),
    (["evaluate", "{x}", "{y}", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["evaluate", "{nan}", "{y}"], "finite"),
]


@pytest.mark.parametrize(("argv", "message"), ERRORS, ids=[message for _, message in ERRORS])
def test_every_mistake_is_one_line_with_exit_code_2(tmp_path: Path, argv: list[str], message: str, capsys: Any) -> None:
    paths = {name: tmp_path / f"{name}.npy" for name in ("x", "y", "short", "x1d", "y3", "x3", "nan")}
    np.save(paths["x"], np.arange(8, dtype=np.float32).reshape(4, 2))
    np.save(paths["y"], np.array([0, 0, 1, 1]))
    np.save(paths["short"], np.array([0, 1]))
    np.save(paths["x1d"], np.zeros(4, dtype=np.float32))
    np.save(paths["y3"], np.array([0, 1, 2, 3]))
    np.save(paths["x3"], np.zeros((3, 2), dtype=np.float32))
    np.save(paths["nan"], np.array([[0, 1], [np.nan, 1], [2, 2], [3, 3]], dtype=np.float32))
    paths["garbage"] = tmp_path / "garbage.npy"
    paths["garbage"].write_bytes(b"not an array")
    paths["txt"] = tmp_path / "x.txt"
    paths["txt"].write_text("1 2")
    paths["npz"] = tmp_path / "d.npz"
    np.savez(paths["npz"], x=np.zeros((4, 2)))
    paths["table"] = tmp_path / "t.csv"
    paths["table"].write_text("label\n0\n0\n1\n1\n")
    paths["out"] = tmp_path / "out"
    code, out, err = run([a.format(**{k: str(v) for k, v in paths.items()}) for a in argv], capsys)
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("torchmetrics-retrieval") and message in err


def test_the_installed_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchmetrics_retrieval", "evaluate", str(tmp_path / "none.npy"), "y.npy"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"torchmetrics-retrieval: error: embeddings file not found: {tmp_path / 'none.npy'}"


@pytest.mark.parametrize("keys", [("cmc/1",), ("cmc/1", "precision/10", "map_at_r")])
def test_table_columns_line_up_with_short_and_long_keys(keys: tuple[str, ...], capsys: Any) -> None:
    from torchmetrics_retrieval.cli.output import print_table

    print_table("title", {key: torch.tensor(0.5) for key in keys}, 1.0)
    header, rule, *rows = capsys.readouterr().out.splitlines()[1:-1]
    value_column = header.index("value")
    assert rule.rindex("------") == value_column and rule.index(" ") >= len("metric")
    assert [row.index("0.5000") for row in rows] == [value_column] * len(keys)
