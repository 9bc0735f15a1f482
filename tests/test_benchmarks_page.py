"""The benchmarks page cannot go stale: its committed text is what ``make_page.py`` writes from the committed results.

No benchmark runs here: the generator reads ``benchmarks/results/*.json`` into a temporary directory, and the
page, the README's headline block (when the README has its markers) and the plots the page refers to are
compared with what is committed.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.test_benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def make_page() -> ModuleType:
    return load_benchmark("make_page")


def test_committed_page_is_what_the_results_generate(make_page: ModuleType, tmp_path: Path) -> None:
    make_page.main(["--out", str(tmp_path), "--readme", str(tmp_path / "absent.md")])
    generated = (tmp_path / "README.md").read_text()
    assert (BENCHMARKS / "README.md").read_text() == generated, "run: python benchmarks/make_page.py"
    for name in re.findall(r"\]\((benchmark-plots/[^)]+\.png)\)", generated):  # every plot is drawn and committed
        assert (tmp_path / name).stat().st_size > 0, name
        assert (BENCHMARKS / name).is_file(), f"{name} is not committed: run python benchmarks/make_page.py"


def test_page_stays_short_and_plots_are_on_the_docs_site(make_page: ModuleType) -> None:
    text = (BENCHMARKS / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    assert len(re.findall(r"!\[[^\]]*\]\(benchmark-plots/", text)) >= 4
    # docs/benchmarks.md includes the page, so the same relative path must resolve under docs/ too
    assert (ROOT / "docs" / "benchmark-plots").resolve() == (BENCHMARKS / "benchmark-plots").resolve()


def test_readme_headline_block_matches_the_results(make_page: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text()
    docs = make_page.load_all(make_page.RESULTS)
    expected = make_page.with_headline(readme, make_page.sections.headline(docs))
    if expected is None:
        pytest.skip("README.md has no benchmarks-headline markers")
    assert readme == expected, "run: python benchmarks/make_page.py"


def test_headline_block_is_rewritten_only_between_the_markers(make_page: ModuleType, tmp_path: Path) -> None:
    start, end = make_page.MARKERS
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{start}\nold figures\n{end}\n\nrest\n")
    make_page.main(["--out", str(tmp_path / "page"), "--readme", str(readme), "--no-plots"])
    text = readme.read_text()
    assert text.startswith(f"# title\n\n{start}\n| benchmark") and text.endswith(f"{end}\n\nrest\n")
    assert "old figures" not in text and text.count("\n| ") == 7  # header, separator, five figures
    untouched = tmp_path / "OTHER.md"
    untouched.write_text("no markers here\n")
    make_page.main(["--out", str(tmp_path / "page"), "--readme", str(untouched), "--no-plots"])
    assert untouched.read_text() == "no markers here\n"


def test_ddp_figures_are_medians_over_the_rounds() -> None:
    data = load_benchmark("_page_data")

    def record(ranks: int, seconds: float, speedup: float, work: float, identical: bool = True, mode: str = "shard"):  # type: ignore[no-untyped-def]
        return {"family": "knn", "ranks": ranks, "mode": mode, "seconds": seconds, "speedup": speedup, "work": work,
                "identical": identical}  # fmt: skip

    records = [record(1, 2.0, 1.0, 1.0), record(2, 1.5, 1.3, 1.4), record(1, 4.0, 1.0, 1.0), record(2, 1.0, 1.9, 1.0)]
    records += [
        record(1, 3.0, 1.0, 1.0),
        record(2, 1.2, 1.8, 1.1, identical=False),
        record(2, 9.0, 1.6, 1.2, mode="copies"),
    ]
    by_p = data.ddp_medians(records)["knn"]
    assert (by_p[1]["seconds"], by_p[1]["rounds"], by_p[1]["identical"]) == (3.0, 3, True)
    assert (by_p[2]["seconds"], by_p[2]["speedup"], by_p[2]["work"], by_p[2]["identical"]) == (1.2, 1.8, 1.1, False)
    assert data.ddp_medians(records, "copies")["knn"][2]["seconds"] == 9.0  # the copies apart from sharded mode
    assert data.ddp_speedups({"records": records}) == {data.DDP["knn"]: {2: 1.8}}
