"""Fixtures shared by the functional tests.

``kernel_calls`` counts the calls of the compiled (numba) kernels of the pair passes, the ROC AUC pass and the
full-ranking count. Forcing the compiled plan (``plan.force_compiled(True)``) is not enough to test them: the
kernels have further conditions (float32 embeddings, no ``label_comparison_fn``, ...), and a case that misses one
silently takes the torch path and compares the torch path with itself. A test that claims to run the kernels
checks, with ``kernel_calls.forced(True, ...)``, that they were called.
"""

from __future__ import annotations

import contextlib
import importlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from torchmetrics_retrieval.functional._search import plan

#: The kernels counted, by group: the module (imported by its callers at call time, so that patching the module's
#: attribute intercepts every call) and the kernels called from Python.
KERNELS = {
    "pairs": ("torchmetrics_retrieval.functional._pairs.kernels", ("histogram", "count_wanted", "list_wanted")),
    "auc": ("torchmetrics_retrieval.functional._pairs.auc_kernels", ("count_block", "list_undecided")),
    "ranks": (
        "torchmetrics_retrieval.functional._ranks.kernels",
        ("build_table", "count_rows", "list_ambiguous", "count_preceding"),
    ),
}


class KernelCalls:
    """Calls of the compiled kernels, counted by ``"group.kernel"`` (e.g. ``"ranks.count_rows"``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[str] = Counter()
        if not plan.HAS_NUMBA:  # pragma: no cover - numba is a dependency; nothing to count without it
            return
        for group, (module_name, names) in KERNELS.items():
            module = importlib.import_module(module_name)
            for name in names:
                monkeypatch.setattr(module, name, self._counted(f"{group}.{name}", getattr(module, name)))

    def _counted(self, key: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            self.counts[key] += 1
            return kernel(*args)

        return counted

    def total(self, *kernels: str) -> int:
        """Calls so far of ``kernels``, each a group (``"pairs"``) or one kernel (``"pairs.histogram"``); of
        every kernel without any."""
        return sum(
            n
            for key, n in self.counts.items()
            if not kernels or any(key == k or key.startswith(f"{k}.") for k in kernels)
        )

    @contextlib.contextmanager
    def expect(self, compiled: bool, *kernels: str) -> Iterator[None]:
        """The block must call ``kernels`` (``compiled``), or no kernel at all (not ``compiled``)."""
        if compiled and not plan.HAS_NUMBA:  # pragma: no cover - numba is a dependency
            pytest.skip("the compiled kernels need numba")
        assert kernels or not compiled, "name the kernels the block must call"
        before, before_all = self.total(*kernels), self.total()
        yield
        if compiled:
            assert self.total(*kernels) > before, f"no call of the kernels {kernels}: the block took the torch path"
        else:
            assert self.total() == before_all, f"compiled kernels called on the torch path: {dict(self.counts)}"

    @contextlib.contextmanager
    def forced(self, compiled: bool, *kernels: str) -> Iterator[None]:
        """``plan.force_compiled(compiled)`` over the block, which must then call ``kernels`` (``compiled``), or
        no kernel at all (not ``compiled``)."""
        with self.expect(compiled, *kernels), plan.force_compiled(compiled):
            yield


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> KernelCalls:
    """Counts the calls of the compiled kernels during the test (see ``KernelCalls``)."""
    return KernelCalls(monkeypatch)
