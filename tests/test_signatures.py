"""The entry points list the options of ``RetrievalOptions`` as typed keyword parameters, in step with its fields.

``RetrievalOptions`` defines each option once (type, default, check, help). ``retrieval_metrics``,
``EmbeddingMetrics``, ``CrossModalRetrieval`` and ``FNMRAtFMR`` repeat its fields as parameters, so that editors,
``help()``, the API pages and mypy know them. These tests compare every such parameter with its field (order,
annotation, default, keyword-only), every docstring's Args entries with the parameters and the fields' help, and
``OptionArguments`` (the type of the overloads' ``**options``) with the fields; then mypy must refuse a misspelt
option at each entry point.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from dataclasses import Field
from pathlib import Path
from typing import Any

import pytest
import torch

from torchmetrics_retrieval import CrossModalRetrieval, EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.functional import RetrievalOptions, retrieval_metrics
from torchmetrics_retrieval.functional._options import OptionArguments, option_fields
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs

ROOT = Path(__file__).resolve().parents[1]
FIELDS = option_fields()
ENTRY_POINTS: list[Any] = [retrieval_metrics, EmbeddingMetrics, CrossModalRetrieval, FNMRAtFMR]

# The documented exceptions. FNMRAtFMR takes the options of the pair metrics only, and asks for FNMR@FMR=0.1 by
# default (it would report nothing otherwise); CrossModalRetrieval reports image-text recall@1/5/10 on cosine
# similarity by default.
PAIR_OPTIONS = ["fmr_vals", "eer", "roc_auc", "min_dcf_p_target", "dcf_costs", "distance", "label_comparison_fn"]
TAKEN = {FNMRAtFMR: [*PAIR_OPTIONS, "chunk_size", "progress"]}
OWN_DEFAULTS: dict[Any, dict[str, Any]] = {
    CrossModalRetrieval: {"cmc_top_k": (1, 5, 10), "precision_top_k": (), "map_top_k": (), "distance": "cosine"},
    FNMRAtFMR: {"fmr_vals": (0.1,)},
}


def _annotation(spec: Field[Any]) -> str:
    """The annotation of the parameters that take the option (a string: the modules postpone annotations)."""
    return spec.metadata["kind"].accepts or str(spec.type)


def _args(doc: str) -> dict[str, str]:
    """``name -> first line`` of every entry of the Args section of a (dedented) google-style docstring."""
    section = doc.split("\nArgs:\n", 1)[1]
    entries: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith(" "):  # a blank line or the next section ends it
            break
        entry = re.fullmatch(r" {4}(\w+): (.*)", line)
        if entry:
            entries[entry[1]] = entry[2]
    return entries


@pytest.mark.parametrize("entry_point", ENTRY_POINTS, ids=lambda e: e.__name__)
def test_every_option_is_a_keyword_parameter_like_its_field(entry_point: Any) -> None:
    parameters = inspect.signature(entry_point).parameters
    taken = TAKEN.get(entry_point, list(FIELDS))
    assert [name for name in parameters if name in FIELDS] == taken  # none missing, in the fields' order
    for name in taken:
        parameter, spec = parameters[name], FIELDS[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameter.annotation == _annotation(spec), name
        assert parameter.default == OWN_DEFAULTS.get(entry_point, {}).get(name, spec.default), name
    # the other keywords are torchmetrics' (typed, so that mypy refuses a misspelt option) or none
    var_keyword = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert [p.annotation for p in var_keyword] == ([] if entry_point is retrieval_metrics else ["Unpack[MetricKwargs]"])


@pytest.mark.parametrize("entry_point", ENTRY_POINTS, ids=lambda e: e.__name__)
def test_docstring_documents_every_parameter_and_options_by_their_help(entry_point: Any) -> None:
    documented = _args(inspect.getdoc(entry_point) or "")
    parameters = [name for name in inspect.signature(entry_point).parameters if name != "self"]
    assert list(documented) == parameters
    for name in TAKEN.get(entry_point, list(FIELDS)):
        assert documented[name].startswith(FIELDS[name].metadata["help"]), name


@pytest.mark.parametrize("entry_point", [EmbeddingMetrics, CrossModalRetrieval, FNMRAtFMR], ids=lambda e: e.__name__)
def test_defaults_of_the_signature_are_the_ones_used(entry_point: Any) -> None:
    metric = entry_point()
    own = OWN_DEFAULTS.get(entry_point, {})
    assert metric.options == RetrievalOptions.create(**own)
    assert metric.options.label_comparison_fn is None and metric.options.progress is False  # left out of ==


def test_option_arguments_type_every_option_as_its_parameters() -> None:
    typed = {name: ref.__forward_arg__ for name, ref in OptionArguments.__annotations__.items()}
    assert typed == {name: _annotation(spec) for name, spec in FIELDS.items()}
    assert list(typed) == list(FIELDS)
    assert OptionArguments.__total__ is False


def test_metric_kwargs_are_torchmetrics_keywords() -> None:
    given = {
        "compute_on_cpu": True,
        "dist_sync_on_step": True,
        "process_group": None,
        "dist_sync_fn": None,
        "distributed_available_fn": None,
        "sync_on_compute": False,
        "compute_with_cache": False,
    }
    assert set(given) == set(MetricKwargs.__annotations__)
    metric = EmbeddingMetrics(**given)
    assert (metric.compute_on_cpu, metric.sync_on_compute, metric.compute_with_cache) == (True, False, False)


def test_a_misspelt_option_fails_at_run_time_naming_it() -> None:
    x, labels = torch.zeros(3, 2), torch.tensor([0, 0, 1])
    with pytest.raises(TypeError, match="unexpected keyword argument 'cmc_topk'"):
        retrieval_metrics(x, labels, cmc_topk=(1,))  # type: ignore[call-overload]
    for metric_class in (EmbeddingMetrics, CrossModalRetrieval, FNMRAtFMR):
        with pytest.raises(ValueError, match="Unexpected keyword arguments: `cmc_topk`"):
            metric_class(cmc_topk=(1,))  # type: ignore[call-arg]


# Calls mypy must accept (two of them reveal the return types of the overloads of retrieval_metrics) ...
ACCEPTED = """\
import torch

from torchmetrics_retrieval import CrossModalRetrieval, EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.functional import retrieval_metrics

x, y = torch.zeros(3, 2), torch.zeros(3)
reveal_type(retrieval_metrics(x, y, cmc_top_k=1, distance="cosine", fmr_vals=[0.1]))
reveal_type(retrieval_metrics(x, y, return_per_query=True, mrr=True))
EmbeddingMetrics(cmc_top_k=[1, 5], confidence_level=0.95, prefix="val/", compute_on_cpu=True)
CrossModalRetrieval(recall_top_k=(1, 5), sync_on_compute=False)
FNMRAtFMR(fmr_vals=0.01, roc_auc=True)
"""
# ... and calls with a misspelt option, one per line: misspelt keyword -> call.
MISSPELT = {
    "cmc_topk": "retrieval_metrics(x, y, cmc_topk=(1,))",
    "map_at_k": "retrieval_metrics(x, y, return_per_query=True, map_at_k=5)",
    "fmr_val": "EmbeddingMetrics(fmr_val=0.1)",
    "recall_topk": "CrossModalRetrieval(recall_topk=(1,))",
    "min_dcf_ptarget": "FNMRAtFMR(min_dcf_ptarget=0.5)",
}


MYPY = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-pretty"]


@pytest.mark.slow  # about a minute: mypy reads torch
def test_mypy_refuses_a_misspelt_option(tmp_path: Path) -> None:
    calls = tmp_path / "calls.py"
    calls.write_text(ACCEPTED + "\n".join(MISSPELT.values()) + "\n", encoding="utf-8")
    run = subprocess.run(
        [*MYPY, "--cache-dir", str(tmp_path / "mypy_cache"), str(calls)],
        cwd=ROOT,  # the package of this checkout, not an installed one
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    reported: dict[int, list[str]] = {}  # line -> messages
    for line in run.stdout.splitlines():
        found = re.match(rf"{re.escape(str(calls))}:(\d+): (?:error|note): (.*)", line)
        if found:
            reported.setdefault(int(found[1]), []).append(found[2].replace("builtins.", ""))
    metrics, with_per_query = (i for i, line in enumerate(ACCEPTED.splitlines(), 1) if line.startswith("reveal"))
    first = len(ACCEPTED.splitlines()) + 1  # the line of the first misspelt call
    assert set(reported) == {metrics, with_per_query, *range(first, first + len(MISSPELT))}, run.stdout + run.stderr
    assert reported[metrics] == ['Revealed type is "dict[str, torch._tensor.Tensor]"']
    assert reported[with_per_query][0].startswith('Revealed type is "tuple[dict[str, torch._tensor.Tensor], ')
    assert reported[with_per_query][0].endswith('RetrievalResult | None]"')
    for number, (keyword, call) in enumerate(MISSPELT.items(), start=first):
        expected = f'Unexpected keyword argument "{keyword}" for '
        entry_point = call.split("(")[0]
        assert any(m.startswith(expected) and entry_point in m for m in reported[number]), reported[number]
