"""ruff and mypy are part of the suite, so CI keeps the code clean; mypy also sees the options of the entry points.

Every option of ``RetrievalOptions`` is a typed parameter of ``retrieval_metrics``, ``EmbeddingMetrics``,
``CrossModalRetrieval`` and ``FNMRAtFMR`` (``test_signatures.py``), so mypy must accept calls that use them and
refuse each misspelt one. Both are checked in the same mypy run as the package.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_lint_and_format() -> None:
    # ruff is a declared test dependency: run it from this interpreter's environment, so a missing ruff fails
    # (No module named ruff) instead of skipping.
    lint = run(sys.executable, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


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


@pytest.mark.slow  # mypy reads torch (its parts the package uses), so the package and the calls share one run
def test_mypy_passes_the_package_and_refuses_misspelt_options(tmp_path: Path) -> None:
    calls = tmp_path / "calls.py"
    calls.write_text(ACCEPTED + "\n".join(MISSPELT.values()) + "\n", encoding="utf-8")
    # the package of this checkout (cwd and MYPYPATH), not an installed one
    # a cache of its own: mypy would replay a cached run's findings on calls.py under that run's path
    mypy = [sys.executable, "-m", "mypy", "--no-pretty", "--cache-dir", str(tmp_path / "cache")]
    result = subprocess.run(
        [*mypy, "torchmetrics_retrieval", str(calls)],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    reported: dict[int, list[str]] = {}  # line of calls.py -> messages
    for line in result.stdout.splitlines():
        found = re.match(rf"{re.escape(str(calls))}:(\d+): (?:error|note): (.*)", line)
        if found:
            reported.setdefault(int(found[1]), []).append(found[2].replace("builtins.", ""))
        else:  # the summary line, or a finding in the package
            assert line.startswith("Found ") and "in 1 file" in line, result.stdout + result.stderr
    metrics, with_per_query = (i for i, line in enumerate(ACCEPTED.splitlines(), 1) if line.startswith("reveal"))
    first = len(ACCEPTED.splitlines()) + 1  # the line of the first misspelt call
    expected_lines = {metrics, with_per_query, *range(first, first + len(MISSPELT))}
    assert set(reported) == expected_lines, result.stdout + result.stderr
    assert reported[metrics] == ['Revealed type is "dict[str, torch._tensor.Tensor]"']
    assert reported[with_per_query][0].startswith('Revealed type is "tuple[dict[str, torch._tensor.Tensor], ')
    assert reported[with_per_query][0].endswith('RetrievalResult | None]"')
    for number, (keyword, call) in enumerate(MISSPELT.items(), start=first):
        expected = f'Unexpected keyword argument "{keyword}" for '
        entry_point = call.split("(")[0]
        assert any(m.startswith(expected) and entry_point in m for m in reported[number]), reported[number]
