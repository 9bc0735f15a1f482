"""Regenerate ``benchmarks/README.md``, its plots and the README's headline block from ``benchmarks/results/``.

    python benchmarks/make_page.py                     # after python benchmarks/run_all.py
    python benchmarks/make_page.py --out /tmp/page --readme /tmp/README.md

No figure on the page is typed by hand: every number is read from a results file, so a re-run of the sweep
followed by this command updates the whole page. The text is a pure function of the results (the test compares
it with the committed page); the plots go to ``benchmark-plots/`` beside the page, which ``docs/`` links to.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _page_sections as sections  # noqa: E402 - sibling modules, found through the line above
from _page_data import FILES, MARKERS, PLOTS, counts, ddp_speedups, memory_points, ok_rows, thread_speedups  # noqa: E402
from _results import RESULTS, load  # noqa: E402

# ----------------------------------------------------------------------------------------------------------------------
# the page
# ----------------------------------------------------------------------------------------------------------------------


def load_all(results: Path) -> dict[str, dict[str, Any]]:
    return {name: load(results / f"{name}.json") for name in FILES}


def page(docs: dict[str, dict[str, Any]]) -> str:
    parts = [
        sections.intro(docs),
        sections.speed(docs["retrieval"]),
        sections.threads(docs["retrieval"]),
        sections.full_ranking(docs["full_ranking"]),
        sections.verification(docs["verification"]),
        sections.cross_modal(docs["cross_modal"]),
        sections.ddp(docs["ddp"], docs["ddp_memory"]),
        sections.memory(docs),
        sections.reproduce(),
        sections.runs(docs),
    ]
    return "\n\n".join("\n".join(lines) for lines in parts) + "\n"


def plots(docs: dict[str, dict[str, Any]], out: Path) -> None:
    import _page_plots

    out.mkdir(parents=True, exist_ok=True)
    doc = docs["retrieval"]
    _page_plots.time_vs_n(ok_rows(doc), list(counts(doc)), out / "time_vs_n.png")
    _page_plots.thread_speedup(
        thread_speedups(doc, ["faiss", "ours", "pml", "oml"]), counts(doc), out / "thread_speedup.png"
    )
    _page_plots.ddp_speedup(ddp_speedups(docs["ddp"]), out / "ddp_speedup.png")
    _page_plots.memory_vs_n(memory_points(docs), out / "memory_vs_n.png")


def with_headline(readme: str, lines: list[str]) -> str | None:
    """``readme`` with the block between the markers replaced by ``lines``; None when the markers are missing."""
    start, end = (re.escape(marker) for marker in MARKERS)
    pattern = re.compile(f"({start})\n.*?({end})", flags=re.DOTALL)
    if not pattern.search(readme):
        return None
    return pattern.sub(lambda m: "\n".join([m.group(1), *lines, m.group(2)]), readme, count=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the results files")
    parser.add_argument("--out", type=Path, default=HERE, help="where README.md and the plots go")
    parser.add_argument("--readme", type=Path, default=HERE.parent / "README.md", help="README with the markers")
    parser.add_argument("--no-plots", action="store_true", help="write the text only")
    args = parser.parse_args(argv)
    docs = load_all(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "README.md").write_text(page(docs))
    if not args.no_plots:
        plots(docs, args.out / PLOTS)
    if args.readme.exists():
        updated = with_headline(args.readme.read_text(), sections.headline(docs))
        if updated is not None:
            args.readme.write_text(updated)
    print(f"wrote {args.out / 'README.md'}" + ("" if args.no_plots else f" and {args.out / PLOTS}/*.png"))


if __name__ == "__main__":
    main()
