"""The documentation site (mkdocs.yml, docs/) builds in strict mode, and the built pages hold what they promise.

The site is built once, with warnings as errors (``mkdocs build --strict``: broken links and anchors, docstring
parameters that are not in the signature), into a temporary directory. The tests then read the built HTML: the
front page's title, the signature of ``retrieval_metrics`` on its API page, every metric key of
docs/definitions.md on the built definitions page, and every internal link of every page (the target file exists
and, for a ``#fragment``, holds an element with that id).

The code blocks of the front page and of the guides run too, top to bottom in one namespace per page; a
``print(...)`` is followed by ``# ...`` comment lines holding what it prints. A block preceded by
``<!-- docs-test: skip (reason) -->`` is not run.
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import re
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.test_definitions import _defined_on_the_page, _returned_keys, family
from torchmetrics_retrieval.functional import retrieval_metrics

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDE_PAGES = [DOCS / "index.md", *sorted((DOCS / "guides").glob("*.md"))]


class _Page(HTMLParser):
    """The ids, the ``<a href>`` targets, the ``<code>`` texts and the title of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.code: list[str] = []
        self.title = ""
        self._open: list[str] = []  # "code" / "title" elements being read
        self._text: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        if tag == "a" and values.get("href") is not None:
            self.hrefs.append(str(values["href"]))
        if tag in ("code", "title"):
            self._open.append(tag)
            self._text.append([])

    def handle_endtag(self, tag: str) -> None:
        if self._open and tag == self._open[-1]:
            self._open.pop()
            text = "".join(self._text.pop())
            if tag == "code":
                self.code.append(text)
            else:
                self.title = text
            if self._text:  # nested in an element being read: its text is part of the outer one too
                self._text[-1].append(text)

    def handle_data(self, data: str) -> None:
        if self._text:
            self._text[-1].append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's banner about MkDocs 2.0
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.mark.slow
def test_front_page_title(site: Path) -> None:
    page = _parse(site / "index.html")
    assert page.title.strip() == "torchmetrics-retrieval"  # the site name alone on the front page
    assert "torchmetrics-retrieval" in page.ids  # its first heading
    assert (
        _parse(site / "guides" / "lightning" / "index.html").title.strip()
        == "Lightning and DDP - torchmetrics-retrieval"
    )


def _signature_text(path: Path, object_id: str) -> str:
    """The text of the signature of the object whose heading has the id ``object_id``: one signature, the
    implementation's (``show_overloads: false`` in mkdocs.yml: overloads would add one each)."""
    html = path.read_text(encoding="utf-8")
    start = html.index(f'id="{object_id}"')
    heading = html[start : html.index('<div class="doc doc-contents', start)]  # heading and signature
    blocks = re.findall(r'<div class="doc-signature[^"]*">(.*?)</div>', heading, re.DOTALL)
    assert len(blocks) == 1, f"{len(blocks)} signatures after {object_id}"
    parser = _Page()
    parser.feed(blocks[0])
    return " ".join("".join(parser.code).split())


@pytest.mark.slow
def test_retrieval_metrics_signature_on_its_api_page(site: Path) -> None:
    text = _signature_text(
        site / "api" / "functional" / "index.html", "torchmetrics_retrieval.functional.retrieval_metrics"
    )
    assert text.startswith("retrieval_metrics(")
    for name, parameter in inspect.signature(retrieval_metrics).parameters.items():
        shown = f"**{name}" if parameter.kind is inspect.Parameter.VAR_KEYWORD else name
        assert f"{shown}:" in text, f"parameter {shown} missing from the rendered signature: {text}"
    assert "query: Tensor" in text and "return_per_query: bool = False" in text
    returned = text.rsplit(") ->", 1)[1]  # the formatter may wrap a long return type in parentheses
    expected = "dict[str, Tensor] | tuple[dict[str, Tensor], RetrievalResult | None]"
    assert re.sub(r"[\s()]", "", returned) == re.sub(r"[\s()]", "", expected), text


def _key_table() -> set[str]:
    """The keys of the "Keys at a glance" table of docs/definitions.md (the backticked strings of its first column)."""
    text = (DOCS / "definitions.md").read_text(encoding="utf-8")
    table = text.split("## Keys at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {key for row in rows for key in re.findall(r"`([^`]+)`", row.split("|")[1])}


@pytest.mark.slow
def test_every_metric_key_is_on_the_built_definitions_page(site: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN warnings of the random data test_definitions evaluates
        families = set().union(*(family(key) for key in _returned_keys()))
    listed = _key_table()
    assert {"cmc/{k}", "map", "eer", "dir@fpir/{f}", "{prefix}{key}"} <= listed
    assert families <= _defined_on_the_page()  # tests/test_definitions.py pins the page itself
    page = site / "definitions" / "index.html"
    built = set(_parse(page).code)
    missing = sorted((families | listed) - built)
    assert not missing, f"keys of docs/definitions.md not shown as code on the built page: {missing}"
    # the inner products of the distance table are text, not HTML tags (docs/site_hooks.py)
    assert "1 - &lt;q, g&gt; / (|q| |g|)" in page.read_text(encoding="utf-8")


def _target(site: Path, page: Path, href: str) -> tuple[Path, str] | None:
    """The built file an internal link points to and its fragment; None for an external link."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc:
        return None
    if not parts.path:
        path = page
    elif parts.path.startswith("/"):  # an absolute path (the 404 page's links): from the root of the site
        path = (site / unquote(parts.path).lstrip("/")).resolve()
    else:
        path = (page.parent / unquote(parts.path)).resolve()
    if path.is_dir():
        path = path / "index.html"
    return path, unquote(parts.fragment)


@pytest.mark.slow
def test_no_broken_internal_link(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    parsed = {page.resolve(): _parse(page) for page in pages}
    assert len(pages) >= 15
    broken, checked = [], 0
    for page in pages:
        for href in parsed[page.resolve()].hrefs:
            target = _target(site, page, href)
            if target is None:
                continue
            path, fragment = target
            checked += 1
            where = f"{page.relative_to(site)}: {href}"
            if not path.is_file():
                broken.append(f"{where} (no file {path})")
            elif fragment and path.suffix == ".html":
                ids = parsed[path].ids if path in parsed else _parse(path).ids
                if fragment not in ids:
                    broken.append(f"{where} (no id {fragment!r})")
    assert checked > 100
    assert not broken, "\n".join(broken)


# ---- the code of the front page and the guides ----------------------------------------------------------------------

BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
SKIP = re.compile(r"<!-- docs-test: skip\b[^>]*-->\s*\Z")


def _code_blocks(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [m.group(1) for m in BLOCK.finditer(text) if not SKIP.search(text[: m.start()].rstrip() + "\n")]


def _printed(code: str) -> str:
    """What the block's ``print`` calls must write: the ``# `` comment lines right after each of them."""
    expected, after_print = [], False
    for line in code.splitlines():
        if line.startswith("print("):
            after_print = True
        elif after_print and line.startswith("# "):
            expected.append(line[2:])
        else:
            after_print = False
    return " ".join(" ".join(expected).split())


def test_the_guides_have_code() -> None:
    assert len(GUIDE_PAGES) >= 9
    assert sum(len(_code_blocks(page)) for page in GUIDE_PAGES) >= 25


@pytest.mark.slow
@pytest.mark.parametrize("page", GUIDE_PAGES, ids=[page.stem for page in GUIDE_PAGES])
def test_guide_code_runs_and_prints_what_it_says(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # anything a block writes (logs, figures) lands here
    out = io.StringIO()
    # the blocks' own print calls write to `out`; what libraries print (Lightning's progress) goes elsewhere
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}", "print": functools.partial(print, file=out)}
    for number, code in enumerate(_code_blocks(page), 1):
        out.seek(0)
        out.truncate()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on workers, torchmetrics' on compute before update
            exec(compile(code, f"{page.name} block {number}", "exec"), namespace)
        printed = " ".join(out.getvalue().split())
        assert printed == _printed(code), f"{page.name} block {number} printed:\n{out.getvalue()}"


def test_readme_test_command_is_the_one_ci_runs() -> None:
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme_blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    assert ci_command in readme_blocks
