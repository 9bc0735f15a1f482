"""The entry points list the options of ``RetrievalOptions`` as typed keyword parameters, in step with its fields.

``RetrievalOptions`` defines each option once (type, default, check, help). ``retrieval_metrics``,
``EmbeddingMetrics``, ``CrossModalRetrieval`` and ``FNMRAtFMR`` repeat its fields as parameters, so that editors,
``help()``, the API pages and mypy know them. These tests compare every such parameter with its field (order,
annotation, default, keyword-only), every docstring's Args entries with the parameters and the fields' help, and
``OptionArguments`` (the type of the overloads' ``**options``) with the fields. That mypy refuses a misspelt option
at each entry point is checked in ``test_code_quality.py``, within the suite's one mypy run.
"""

from __future__ import annotations

import inspect
import re
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
