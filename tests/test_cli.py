"""The command line on real data: scikit-learn's bundled digits."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestNeighbors

from torchmetrics_retrieval.cli import main


def test_demo_prints_a_table_that_agrees_with_scikit_learn(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    digits = load_digits()
    # scikit-learn's kneighbors() without a query excludes each point itself by index, as we do.
    _, neighbours = NearestNeighbors(n_neighbors=5).fit(digits.data).kneighbors()
    hits = digits.target[neighbours] == digits.target[:, None]
    # Integer pixels give exact distance ties, whose order scikit-learn does not define: allow a few queries.
    assert metrics["cmc/1"] == pytest.approx(hits[:, 0].mean(), abs=3 / 1797)
    assert metrics["cmc/5"] == pytest.approx(hits.any(axis=1).mean(), abs=3 / 1797)
    assert metrics["precision/5"] == pytest.approx(hits.mean(), abs=3 / 1797)  # every class has >= 5 others
    for key in ("map/5", "map_at_r", "r_precision", "mrr", "map", "fnmr@fmr/0.1", "pcf/0.5", "nmi", "ami"):
        assert 0.0 <= metrics[key] <= 1.0, key


def test_demo_table_through_the_installed_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "torchmetrics_retrieval", "demo", "--fmr", "--pcf"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "1797 images" in out
    assert "cmc/1" in out and "map_at_r" in out and "fnmr@fmr" not in out


def test_evaluate_files_on_disk(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    digits = load_digits()
    np.save(tmp_path / "x.npy", digits.data[:1000].astype(np.float32))
    np.save(tmp_path / "y.npy", digits.target[:1000])
    torch.save(torch.from_numpy(digits.data[1000:].astype(np.float32)), tmp_path / "g.pt")
    np.savez(tmp_path / "gy.npz", labels=digits.target[1000:])
    args = ["evaluate", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--json", "--fmr", "--pcf"]
    assert main([*args, "--gallery", str(tmp_path / "g.pt"), "--gallery-labels", str(tmp_path / "gy.npz")]) == 0
    separate = json.loads(capsys.readouterr().out)
    _, neighbours = NearestNeighbors(n_neighbors=1).fit(digits.data[1000:]).kneighbors(digits.data[:1000])
    expected = (digits.target[1000:][neighbours[:, 0]] == digits.target[:1000]).mean()
    assert separate["cmc/1"] == pytest.approx(expected, abs=3 / 1000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["evaluate", "missing.npy", "y.npy"], "not found"),
        (["evaluate", "{x}", "{y}", "--gallery", "{x}"], "--gallery-labels"),
        (["evaluate", "{txt}", "{y}"], ".npy, .npz or .pt"),
        (["evaluate", "{x}", "{short}"], "labels"),
    ],
)
def test_evaluate_errors(tmp_path, argv, message) -> None:  # type: ignore[no-untyped-def]
    paths = {"x": tmp_path / "x.npy", "y": tmp_path / "y.npy", "txt": tmp_path / "x.txt", "short": tmp_path / "s.npy"}
    np.save(paths["x"], np.zeros((4, 2), dtype=np.float32))
    np.save(paths["y"], np.array([0, 0, 1, 1]))
    np.save(paths["short"], np.array([0, 1]))
    paths["txt"].write_text("1 2")
    with pytest.raises(SystemExit, match=message.replace(".", r"\.")):
        main([a.format(**{k: str(v) for k, v in paths.items()}) for a in argv])
