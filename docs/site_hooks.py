"""Hooks of the documentation build (mkdocs.yml): markup that Python-Markdown would render otherwise than meant.

**Docstrings** (a griffe extension, ``DocstringMarkup``). The docstrings are google style, run as doctests, and
carry a little reStructuredText that reads well in an editor. mkdocstrings renders docstring text as markdown,
so before the google parser sees a docstring this extension rewrites, in the rendered copy only (the source
files are untouched):

* an ``Example:`` section title to ``Examples:``, the title griffe parses as doctest examples (it reads
  ``Example:`` as an admonition, whose ``>>>`` lines markdown would turn into nested quotes);
* a ``.. math::`` directive to a fenced ``text`` block holding the formula;
* the roles ``:func:`~a.b.name``` (and ``:class:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``,
  ``:obj:``, ``:math:``) to inline code ```name``` (the full path without ``~``);
* a paragraph ending in ``::`` (a reST literal block follows) to one ending in ``:``.

It also documents the fields of ``RetrievalOptions``: a field declared as
``name: type = field(default=value, metadata=_spec(KIND, "help"))`` gets ``help`` as its docstring and
``value`` as its shown default, so the option list of the API page is read from the code.

**Pages** (an mkdocs hook, ``on_page_markdown``). Python-Markdown passes ``<q, g>`` (an inner product in
docs/definitions.md) through as an HTML tag, which the browser then hides; CommonMark, and so GitHub, shows it as
text. Outside code, a ``<`` whose would-be tag name is followed by anything but a space, ``/`` or ``>`` is
written ``&lt;``, CommonMark's rule, so the site shows what GitHub shows.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

NOT_A_TAG = re.compile(r"<(?=[A-Za-z][A-Za-z0-9-]*[^A-Za-z0-9\s/>-])")
CODE_SPAN = re.compile(r"(`+).*?\1")
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|math):`(~?)([^`]+)`")
MATH = re.compile(r"^(?P<indent>\s*)\.\. math::\s*(?P<first>.*)$")


def _role(match: re.Match[str]) -> str:
    shortened, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if shortened else target}`"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def rewrite(text: str) -> str:
    """The docstring ``text`` with the reST touches above turned into markdown."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        math = MATH.match(line)
        if math:
            indent = math.group("indent")
            formula = [math.group("first")] if math.group("first") else []
            i += 1
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(indent)):
                if not lines[i].strip() and formula:  # a blank line after the formula ends the directive
                    break
                if lines[i].strip():
                    formula.append(lines[i].strip())
                i += 1
            out += [f"{indent}```text", *(f"{indent}{part}" for part in formula), f"{indent}```"]
            continue
        if line.strip() == "Example:":
            line = line.replace("Example:", "Examples:")
        elif line.endswith("::") and not line.strip().startswith(".."):
            line = line[:-1]
        out.append(ROLE.sub(_role, line))
        i += 1
    return "\n".join(out)


def _keyword(call: griffe.ExprCall, name: str) -> Any:
    for argument in call.arguments:
        if isinstance(argument, griffe.ExprKeyword) and argument.name == name:
            return argument.value
    return None


def _document_option(attribute: griffe.Attribute) -> None:
    """Docstring and default of a field declared with ``field(default=..., metadata=_spec(KIND, "help"))``."""
    call = attribute.value
    if attribute.docstring is not None or not isinstance(call, griffe.ExprCall) or str(call.function) != "field":
        return
    spec, default = _keyword(call, "metadata"), _keyword(call, "default")
    if not (isinstance(spec, griffe.ExprCall) and str(spec.function) == "_spec" and len(spec.arguments) == 2):
        return
    help_text = str(spec.arguments[1])
    if help_text[:1] in "'\"" and help_text[-1:] == help_text[:1]:
        attribute.docstring = griffe.Docstring(help_text[1:-1], parent=attribute)
        attribute.value = default


class DocstringMarkup(griffe.Extension):
    """Rewrite every docstring once the object tree is built (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if isinstance(obj, griffe.Attribute) and obj.parent is not None and obj.parent.name == "RetrievalOptions":
            _document_option(obj)
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """mkdocs hook: ``<`` escaped where CommonMark would not read a tag (see the module docstring)."""
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    ") and "<" in line:
            pieces, end = [], 0
            for span in CODE_SPAN.finditer(line):  # code spans stay as they are
                pieces += [NOT_A_TAG.sub("&lt;", line[end : span.start()]), span.group(0)]
                end = span.end()
            line = "".join([*pieces, NOT_A_TAG.sub("&lt;", line[end:])])
        lines.append(line)
    return "\n".join(lines)
