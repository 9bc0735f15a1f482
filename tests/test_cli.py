"""The command line on real data: scikit-learn's bundled digits."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from sklearn.datasets import load_digits
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score
from sklearn.neighbors import NearestNeighbors

import torchmetrics_retrieval.functional as F
from torchmetrics_retrieval.cli import main


def digits_ranking() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What ``demo`` searches, computed independently: digits' 64 integer pixels, euclidean, leave-one-out.

    Returns ``(labels, distances, order, relevant)``: the ``(N, N)`` float32 distances (float64 per pair, cast
    to float32 as the package documents; the diagonal +inf), each query's gallery sorted by (distance,
    position) (a stable argsort: the package's documented tie order; integer pixels give many exact ties),
    and the ``(N, N - 1)`` relevance of that ranking (the query itself, last at +inf, dropped).
    """
    digits = load_digits()
    squared = cdist(digits.data, digits.data, "sqeuclidean")  # float64 sums of squared integer differences: exact
    distances = np.sqrt(squared).astype(np.float32)
    np.fill_diagonal(distances, np.inf)
    order = np.argsort(distances, axis=1, kind="stable")[:, :-1]
    relevant = digits.target[order] == digits.target[:, None]
    return digits.target, distances, order, relevant


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

    # Every value from an independent computation (numpy, scipy, scikit-learn), ties ordered by position.
    labels, distances, _, relevant = digits_ranking()
    n, d = digits.data.shape
    n_relevant = np.bincount(labels)[labels] - 1  # every other image of the class: no query is lone
    assert n_relevant.min() > 0
    ranks = np.arange(1, n)
    cumulative_hits = np.cumsum(relevant, axis=1)
    precision_at = cumulative_hits / ranks  # P@i at every rank i
    assert metrics["cmc/1"] == pytest.approx(relevant[:, 0].mean(), abs=1e-6)
    assert metrics["cmc/5"] == pytest.approx(relevant[:, :5].any(axis=1).mean(), abs=1e-6)
    assert metrics["precision/5"] == pytest.approx(cumulative_hits[:, 4].mean() / 5, abs=1e-6)
    # map@5: mean of P@i over the relevant ranks i <= 5 (0 without a hit there)
    hits_5 = cumulative_hits[:, 4]
    sum_5 = (precision_at[:, :5] * relevant[:, :5]).sum(axis=1)
    assert metrics["map/5"] == pytest.approx(np.where(hits_5 > 0, sum_5 / np.maximum(hits_5, 1), 0.0).mean(), abs=1e-6)
    # map@R and R-precision with R = n(q)
    within_r = ranks[None, :] <= n_relevant[:, None]
    map_at_r = (precision_at * relevant * within_r).sum(axis=1) / n_relevant
    assert metrics["map_at_r"] == pytest.approx(map_at_r.mean(), abs=1e-6)
    r_precision = (relevant * within_r).sum(axis=1) / n_relevant
    assert metrics["r_precision"] == pytest.approx(r_precision.mean(), abs=1e-6)
    # mrr and map over the full ranking
    assert metrics["mrr"] == pytest.approx((1.0 / (relevant.argmax(axis=1) + 1)).mean(), abs=1e-6)
    full_ap = (precision_at * relevant).sum(axis=1) / n_relevant
    assert metrics["map"] == pytest.approx(full_ap.mean(), abs=1e-6)

    # fnmr@fmr=0.1 over the ordered pairs (q, g), g != q: threshold the 0.1-quantile (linear) of the negatives
    pairs = ~np.eye(n, dtype=bool)
    same = labels[:, None] == labels[None, :]
    positive, negative = distances[pairs & same].astype(np.float64), distances[pairs & ~same].astype(np.float64)
    threshold = np.quantile(negative, 0.1)
    assert metrics["fnmr@fmr/0.1"] == pytest.approx((positive >= threshold).mean(), abs=1e-6)

    # pcf at 0.5: 1 + the number of cumulative variance shares <= 0.5 among the min(N, d) largest eigenvalues
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(digits.data, rowvar=False)))[::-1][: min(n, d)]
    eigenvalues = np.clip(eigenvalues, 0.0, None)
    shares = np.cumsum(eigenvalues) / eigenvalues.sum()
    assert not np.any(np.abs(shares - 0.5) < 1e-6)  # no share on the edge, where rounding could move the count
    assert metrics["pcf/0.5"] == pytest.approx(min(1 + int((shares <= 0.5).sum()), d) / d, abs=1e-6)

    # nmi/ami: the clustering is the package's seeded faiss k-means (F.kmeans, one cluster per class, seed 0, as
    # clustering_scores runs it on the demo's float32 pixels); the scores of that assignment are scikit-learn's.
    clusters = F.kmeans(torch.from_numpy(digits.data.astype(np.float32)), 10).numpy()
    assert metrics["nmi"] == pytest.approx(normalized_mutual_info_score(labels, clusters), abs=1e-6)
    assert metrics["ami"] == pytest.approx(adjusted_mutual_info_score(labels, clusters), abs=1e-6)
    assert metrics["nmi"] > 0.6  # k-means on raw digits finds most classes (about 0.75)
    ranking_keys = ["cmc/1", "cmc/5", "precision/5", "map/5", "map_at_r", "r_precision", "mrr", "map"]
    assert sorted(metrics) == sorted([*ranking_keys, "fnmr@fmr/0.1", "tar@far/0.1", "pcf/0.5", "nmi", "ami"])
    assert metrics["tar@far/0.1"] == pytest.approx(1 - (positive >= threshold).mean(), abs=1e-6)


def test_digits_ranking_by_hand() -> None:
    """The independent ranking itself: a few facts checked directly on the pixels."""
    labels, distances, order, relevant = digits_ranking()
    digits = load_digits()
    n = labels.shape[0]
    assert order.shape == relevant.shape == (n, n - 1)
    assert not np.any(order == np.arange(n)[:, None])  # never the query itself
    query = 7
    brute = [float(np.float32(np.sqrt(((digits.data[query] - row) ** 2).sum()))) for row in digits.data]
    gallery = sorted((brute[g], g) for g in range(n) if g != query)
    assert order[query].tolist() == [g for _, g in gallery]
    assert distances[query, order[query]].tolist() == [dist for dist, _ in gallery]
    # ties exist and are ordered by position
    tied = np.diff(distances[query, order[query]]) == 0
    assert tied.any()
    assert np.all(np.diff(order[query])[tied] > 0)


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


# ---- evaluate --neighbours (issue 43) -------------------------------------------------------------------------------


def test_evaluate_neighbour_lists_of_a_faiss_index(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import faiss

    digits = load_digits()
    query, gallery = digits.data[:500].astype(np.float32), digits.data[500:].astype(np.float32)
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(64), 64, 16)
    index.train(gallery)
    index.add(gallery)
    index.nprobe = 1  # coarse: some lists are short (-1) and some neighbours wrong
    lists = index.search(query, 5)[1]
    for name, array in (("x", query), ("y", digits.target[:500]), ("g", gallery), ("gy", digits.target[500:])):
        np.save(tmp_path / f"{name}.npy", array)
    np.save(tmp_path / "lists.npy", lists)
    files = [str(tmp_path / f"{name}.npy") for name in ("x", "y")]
    gallery_flags = ["--gallery", str(tmp_path / "g.npy"), "--gallery-labels", str(tmp_path / "gy.npy")]
    args = ["evaluate", *files, *gallery_flags, "--json", "--cmc", "1", "--precision", "--map"]
    assert main([*args, "--neighbours", str(tmp_path / "lists.npy")]) == 0
    listed = json.loads(capsys.readouterr().out)
    first = lists[:, 0]
    expected = ((first >= 0) & (digits.target[500:][first] == digits.target[:500])).mean()
    assert listed["cmc/1"] == pytest.approx(expected, abs=1e-6)
    assert main(args) == 0  # the exact search finds more
    assert json.loads(capsys.readouterr().out)["cmc/1"] > listed["cmc/1"]
    assert main([*args, "--neighbours", str(tmp_path / "lists.npy"), "--compare", files[0]]) == 2
    assert "--neighbours" in capsys.readouterr().err
