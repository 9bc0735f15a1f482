"""docs/definitions.md is pinned: its worked examples run, every key the package returns is defined there.

The worked examples are the fenced ``python`` blocks of the page. The block after ``<!-- example-setup -->``
holds the imports; a block after ``<!-- example: NAME -->`` computes ``result`` with the public API and
gives ``expected``, the hand-computed values (a dict of key -> number, or one number); a ``# raises: Error``
line instead says the block must raise, a ``# warns: Warning`` line that it must warn.
"""

from __future__ import annotations

import builtins
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from torchmetrics_retrieval import PCF, ContrastiveAccuracy, CrossModalRetrieval, EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.functional import contrastive_accuracy, retrieval_metrics, score_metrics

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "definitions.md"

BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!-- (example-setup|example: ([\w-]+)) -->\s*\Z")
PREFIX = "val/"  # the prefix of the EmbeddingMetrics call below and of the page's prefix example
PLACEHOLDERS = {
    "fnmr@fmr": "{f}",
    "tar@far": "{f}",
    "pcf": "{r}",
    "min_dcf": "{p}",
    "act_dcf": "{p}",
    "dir@fpir": "{f}",
    "fnir@fpir": "{f}",
}  # any other number in a key is a cutoff {k}
NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"


def _blocks() -> tuple[str, list[str], list[tuple[str, str]]]:
    """(setup code, unmarked blocks, [(name, code) of the examples]) of the page, in page order."""
    text = DOC.read_text(encoding="utf-8")
    setup, plain, examples = "", [], []
    for match in BLOCK.finditer(text):
        marker = MARKER.search(text[: match.start()].rstrip() + "\n")
        code = match.group(1)
        if marker is None:
            plain.append(code)
        elif marker.group(2) is None:
            setup += code
        else:
            examples.append((marker.group(2), code))
    return setup, plain, examples


SETUP, PLAIN_BLOCKS, EXAMPLES = _blocks()


def _run(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(SETUP, namespace)
    exec(code, namespace)
    return namespace


def _as_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _as_floats(v) for key, v in value.items()}
    return float(value)


def family(key: str) -> set[str]:
    """The key families a returned key belongs to, e.g. ``"10/cmc/5/class/1_3"`` -> ``{category}/{key}``,
    ``{key}/class/{label}`` and ``cmc/{k}``."""
    families = set()
    if key.startswith(PREFIX):
        families.add("{prefix}{key}")
        key = key[len(PREFIX) :]
    direction = re.fullmatch(r"(a_to_b|b_to_a)/(.+)", key)
    if direction:
        families.add(f"{direction.group(1)}/{{key}}")
        key = direction.group(2)
    category = re.fullmatch(rf"({NUMBER})/(.+)", key)
    if category:
        families.add("{category}/{key}")
        key = category.group(2)
    interval = re.fullmatch(r"(.+)/(ci_low|ci_high)", key)
    if interval:
        families.add(f"{{key}}/{interval.group(2)}")
        key = interval.group(1)
    per_class = re.fullmatch(r"(.+)/class/[^/]+", key)
    if per_class:
        families.add("{key}/class/{label}")
        key = per_class.group(1)
    number = re.fullmatch(rf"(.+)/{NUMBER}", key)
    if number:
        key = f"{number.group(1)}/{PLACEHOLDERS.get(number.group(1), '{k}')}"
    families.add(key)
    return families


def test_family() -> None:
    assert family("cmc/5") == {"cmc/{k}"}
    assert family("fnmr@fmr/0.1") == {"fnmr@fmr/{f}"}
    assert family("tar@far/1e-05") == {"tar@far/{f}"}
    assert family("pcf/1") == {"pcf/{r}"}
    assert family("mrr") == {"mrr"}
    assert family("map/5/class/1_3") == {"map/{k}", "{key}/class/{label}"}
    assert family("20/pcf/0.5") == {"pcf/{r}", "{category}/{key}"}
    assert family("val/10/map") == {"map", "{category}/{key}", "{prefix}{key}"}
    assert family("new_metric/3") == {"new_metric/{k}"}
    assert family("10/cmc/5/ci_low") == {"cmc/{k}", "{category}/{key}", "{key}/ci_low"}
    assert family("b_to_a/cmc/5") == {"cmc/{k}", "b_to_a/{key}"}


def test_the_page_has_examples() -> None:
    assert "import torch" in SETUP
    assert len(EXAMPLES) >= 20
    names = [name for name, _ in EXAMPLES]
    assert len(names) == len(set(names)), "example names must be unique"


@pytest.mark.parametrize("code", PLAIN_BLOCKS)
def test_other_code_blocks_run(code: str) -> None:
    _run(code)


@pytest.mark.parametrize(("name", "code"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_worked_example(name: str, code: str) -> None:
    raises = re.search(r"^# raises: (\w+)$", code, re.MULTILINE)
    if raises:
        with pytest.raises(getattr(builtins, raises.group(1))):
            _run(code)
        return
    warns = re.search(r"^# warns: (\w+)$", code, re.MULTILINE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace = _run(code)
    if warns:
        assert any(w.category.__name__ == warns.group(1) for w in caught), f"{name}: no {warns.group(1)}"
    assert "expected" in namespace and "result" in namespace, f"{name} must set `result` and `expected`"
    result, expected = _as_floats(namespace["result"]), namespace["expected"]
    if isinstance(expected, dict):
        assert isinstance(result, dict)
        assert list(result) == list(expected), f"{name}: the package returns the keys {list(result)}"
        for key, value in expected.items():
            assert result[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), f"{name}: {key}"
    else:
        assert result == pytest.approx(expected, rel=1e-5, abs=1e-6, nan_ok=True), name


def _returned_keys() -> set[str]:
    """Every key the public API returns with every metric switched on."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=generator)
    labels = torch.arange(40) % 4
    options: dict[str, Any] = {
        "cmc_top_k": (1, 5),
        "precision_top_k": (5,),
        "recall_top_k": (5,),
        "map_top_k": (5,),
        "ndcg_top_k": (5,),
        "map_at_r": True,
        "r_precision": True,
        "mrr": True,
        "map_full": True,
        "minp": True,
        "clustering": True,
        "fmr_vals": (0.1, 1e-05),
        "eer": True,
        "roc_auc": True,
        "min_dcf_p_target": (0.01,),
        "fpir_vals": (0.1,),
        "pcf_variance": (0.5, 1),
    }
    categories = torch.arange(40) % 2 + 10
    keys = set(retrieval_metrics(x, labels, **options))
    keys |= set(retrieval_metrics(x, labels, categories=categories, per_class=True, **options))
    keys |= set(retrieval_metrics(x, labels, categories=categories, confidence_level=0.9, n_bootstrap=20, **options))
    metric = EmbeddingMetrics(prefix=PREFIX, per_class=True, **options)
    metric.update(x, labels, categories=categories)
    keys |= set(metric.compute())
    keys |= set(contrastive_accuracy(x[:20], x[20:], top_k=(1, 5)))
    contrastive = ContrastiveAccuracy(top_k=(1, 5))
    contrastive.update(x[:20], x[20:])
    keys |= set(contrastive.compute())
    verification = FNMRAtFMR(fmr_vals=(0.1,))
    verification.update(x, labels)
    keys |= set(verification.compute())
    cross_modal = CrossModalRetrieval(cmc_top_k=(1, 5), mrr=True)
    cross_modal.update(x[:20], labels[:20], x[20:], labels[20:])
    keys |= set(cross_modal.compute())
    is_target = torch.arange(20) % 3 == 0
    keys |= set(score_metrics(-torch.arange(20.0), is_target, cllr=True, act_dcf_p_target=(0.01,)))
    pcf = PCF(pcf_variance=(0.5,))
    pcf.update(x)
    keys |= set(pcf.compute())
    return keys


def _defined_on_the_page() -> set[str]:
    """Every backticked string of the page (a key family is defined in a heading and in the key table)."""
    return set(re.findall(r"`([^`\n]+)`", DOC.read_text(encoding="utf-8")))


def test_every_key_family_is_defined_and_has_a_worked_example() -> None:
    families = set().union(*(family(key) for key in _returned_keys()))
    # the ones a reader expects; more may come, and must then be documented
    assert {"cmc/{k}", "map", "mrr", "fnmr@fmr/{f}", "pcf/{r}", "contrastive_accuracy/{k}", "nmi"} <= families
    undefined = families - _defined_on_the_page()
    assert not undefined, f"key families returned by the package but not defined in {DOC.name}: {sorted(undefined)}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shown = set()
        for _, code in EXAMPLES:
            namespace = _run(code) if "# raises:" not in code else {}
            if isinstance(namespace.get("expected"), dict):
                shown |= set().union(*(family(key) for key in namespace["expected"]))
    without_example = families - shown
    assert not without_example, f"key families without a worked example in {DOC.name}: {sorted(without_example)}"


def test_contrastive_int_top_k_is_a_scalar() -> None:
    # the page says an int top_k gives a 0-dim tensor, not a key
    z = torch.eye(3)
    assert contrastive_accuracy(z, z).ndim == 0


SCANNED = ("torchmetrics_retrieval", "tests", "docs", "notebooks", "benchmarks", "README.md", "CHANGELOG.md")
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".txt", ".toml", ".cfg", ".ini", ".json", ".yaml", ".yml", ".rst", ".csv"}


def test_no_reference_to_the_internal_design_file() -> None:
    """Users do not have the design notes: the repository cites docs/definitions.md instead."""
    forbidden = ("DESIGN" + ".md", "DESIGN" + " section", "shared" + "/")
    offenders = []
    for name in SCANNED:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if file.suffix not in TEXT_SUFFIXES or "__pycache__" in file.parts:
                continue
            for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if any(pattern in line for pattern in forbidden):
                    offenders.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)
