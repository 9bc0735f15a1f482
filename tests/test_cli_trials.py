"""``torchmetrics-retrieval evaluate --trials FILE``: a VoxCeleb-format trial list and its CSV form over embeddings
written here, checked against numpy / scikit-learn references computed from the trial scores, and every mistake
in a trial file as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from tests.test_cli_tool import run

SPEAKERS, UTTERANCES = 4, 3


def _item(row: int) -> str:
    return f"id1027{row // UTTERANCES}/5r0dWxy17C8/{row % UTTERANCES + 1:05d}.wav"


@pytest.fixture
def voxceleb(tmp_path: Path) -> dict[str, Any]:
    """12 embeddings of 4 speakers, their items table and a 20-line VoxCeleb trial list (10 target, 10 not)."""
    rng = np.random.default_rng(41)
    centres = rng.normal(size=(SPEAKERS, 8))
    x = (np.repeat(centres, UTTERANCES, axis=0) + 1.2 * rng.normal(size=(SPEAKERS * UTTERANCES, 8))).astype(np.float32)
    n = x.shape[0]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    same = [p for p in pairs if p[0] // UTTERANCES == p[1] // UTTERANCES]
    other = [p for p in pairs if p[0] // UTTERANCES != p[1] // UTTERANCES]
    chosen = [(1, *same[k]) for k in rng.choice(len(same), 10, replace=False)]
    chosen += [(0, *other[k]) for k in rng.choice(len(other), 10, replace=False)]
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "items.csv").write_text("item,label\n" + "".join(f"{_item(i)},{i // UTTERANCES}\n" for i in range(n)))
    lines = [f"{flag} {_item(e)} {_item(t)}" for flag, e, t in chosen]
    (tmp_path / "trials.txt").write_text("\n".join(lines) + "\n")
    return {"dir": tmp_path, "x": x, "trials": chosen}


def _reference(x: np.ndarray, trials: list[tuple[int, int, int]]) -> dict[str, float]:
    """EER and minDCF by brute force over every threshold (docs/definitions.md), ROC AUC by scikit-learn, Cllr by
    its formula, from the cosine scores of the trials (score = cos - 1 = -distance)."""
    unit = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    flags = np.array([flag for flag, _, _ in trials], dtype=bool)
    scores = np.array([unit[e] @ unit[t] - 1 for _, e, t in trials])
    distances = -scores
    thresholds = np.concatenate([[-np.inf], np.unique(distances)])
    fmr = np.array([(distances[~flags] <= t).mean() for t in thresholds])
    fnmr = np.array([(distances[flags] > t).mean() for t in thresholds])
    i = int(np.argmin(np.abs(fmr - fnmr)))
    p = 0.05
    dcf = (p * fnmr + (1 - p) * fmr) / min(p, 1 - p)
    cllr = 0.5 * (np.log2(1 + np.exp(-scores[flags])).mean() + np.log2(1 + np.exp(scores[~flags])).mean())
    return {
        "eer": (fmr[i] + fnmr[i]) / 2,
        f"min_dcf/{p}": dcf.min(),
        "roc_auc": roc_auc_score(flags, scores),
        "cllr": cllr,
    }


OPTIONS = ["--distance", "cosine", "--eer", "--roc-auc", "--min-dcf-p-target", "0.05", "--cllr", "--json"]


def test_voxceleb_and_csv_trials_match_the_reference(voxceleb: dict[str, Any], capsys: Any) -> None:
    folder = voxceleb["dir"]
    x_file, items = folder / "x.npy", folder / "items.csv"
    code, out, err = run(["evaluate", x_file, items, "--trials", folder / "trials.txt", *OPTIONS], capsys)
    assert code == 0, err
    metrics = json.loads(out)
    expected = _reference(voxceleb["x"], voxceleb["trials"])
    assert 0 < expected["eer"] < 0.5 and 0.5 < expected["roc_auc"] < 1  # the test data is neither trivial nor random
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-5), key
    assert {"fnmr@fmr/0.1", "tar@far/0.1", "min_cllr"} <= set(metrics)

    # the CSV form (columns in another order, another accepted header), and row indices without an items table
    rows = [f"{_item(t)},{'true' if flag else 'false'},{_item(e)}" for flag, e, t in voxceleb["trials"]]
    (folder / "trials.csv").write_text("test,is_target,Enrollment\n" + "\n".join(rows) + "\n")
    code, out, err = run(["evaluate", x_file, items, "--trials", folder / "trials.csv", *OPTIONS], capsys)
    assert code == 0 and json.loads(out) == metrics, err
    (folder / "rows.txt").write_text("".join(f"{flag}\t{e}  {t}\n" for flag, e, t in voxceleb["trials"]))
    code, out, err = run(["evaluate", x_file, "--trials", folder / "rows.txt", *OPTIONS], capsys)
    assert code == 0 and json.loads(out) == metrics, err

    # the table and the report show the same values
    argv = ["evaluate", x_file, items, "--trials", folder / "trials.txt", *OPTIONS[:-1], "--report", folder / "r"]
    code, out, err = run(argv, capsys)
    assert code == 0 and "20 trials (10 target)" in out and f"{metrics['eer']:.4f}" in out
    document = json.loads((folder / "r" / "metrics.json").read_text())
    assert document["metrics"] == pytest.approx(metrics) and document["inputs"]["trials"] == 20
    assert "report written to" in err


ERRORS = [
    ("unknown", "1 {a} id99999/none.wav\n", [], "trials.txt line 2: unknown item 'id99999/none.wav'"),
    ("malformed", "1 {a} {b} extra\n", [], "trials.txt line 2: expected 3 fields"),
    ("bad flag", "2 {a} {b}\n", [], "trials.txt line 2: the target flag must be 1 or 0"),
    ("empty", "", [], "holds no trial"),
    ("index out of range", "", ["--no-items"], "unknown item"),
    ("cllr without trials", None, ["--cllr"], "--cllr needs --trials"),
    ("gallery", "", ["--gallery", "{x}"], "--gallery cannot be used with --trials"),
    ("no item column", "", ["--item-column", "path"], "has no column 'path'"),
    ("csv header", "csv", [], "needs one enrol column"),
    ("one-sided", "!0 {a} {b}\n", [], "needs target (1) and non-target (0) trials; all 1 are 0"),
]


@pytest.mark.parametrize(("content", "extra", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_trial_file_mistakes_are_one_line_with_exit_code_2(
    voxceleb: dict[str, Any], content: str | None, extra: list[str], message: str, capsys: Any
) -> None:
    folder = voxceleb["dir"]
    paths = {"x": str(folder / "x.npy"), "a": _item(0), "b": _item(1)}
    trials = folder / "trials.txt"
    if content == "csv":
        trials = folder / "trials.csv"
        trials.write_text("first,test,target\n" + f"{_item(0)},{_item(1)},1\n")
    elif content == "":
        trials.write_text("" if message == "holds no trial" else f"0 {_item(0)} {_item(1)}\n")
    elif content is not None and content.startswith("!"):  # the file as written
        trials.write_text(content[1:].format(**paths))
    elif content is not None:
        trials.write_text(f"1 {_item(0)} {_item(1)}\n" + content.format(**paths))
    argv = ["evaluate", paths["x"], str(folder / "items.csv")]
    if "--no-items" in extra:
        argv = ["evaluate", paths["x"]]
        trials.write_text("1 0 1\n0 0 12\n")
    argv += [] if content is None else ["--trials", str(trials)]
    argv += [a.format(**paths) for a in extra if a != "--no-items"]
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("torchmetrics-retrieval") and message in err, err
