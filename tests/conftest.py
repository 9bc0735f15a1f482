"""Shared test settings."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Set before torch (or numba) starts its OpenMP threads, and inherited by every process a test starts. The suite
# runs two workers side by side on as many cores, each with two threads: OpenMP's default of spinning while it
# waits at a barrier then keeps a core busy for a thread that cannot run, which made the suite about twice as slow.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
assert "torch" not in sys.modules, "OMP_WAIT_POLICY must be set before torch is imported"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # `import reference` from any test folder

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


#: The modules of the numba kernels: compiled into ``__pycache__`` on first use (``cache=True``).
KERNEL_MODULES = (
    "functional/_score_kernels.py",
    "functional/_pairs/kernels.py",
    "functional/_pairs/auc_kernels.py",
    "functional/_ranks/kernels.py",
    "functional/_search/compiled/kernels.py",
    "functional/_search/compiled/order_kernels.py",
    "functional/_search/compiled/row_kernels.py",
    "functional/_search/compiled/dot_kernels.py",
)


def _kernels_cached() -> bool:
    """Whether every kernel module has an on-disk numba index at least as new as its source."""
    import torchmetrics_retrieval

    package = Path(torchmetrics_retrieval.__file__).parent
    for module in KERNEL_MODULES:
        source = package / module
        indexes = list((source.parent / "__pycache__").glob(f"{source.stem}.*.nbi"))
        if not indexes or max(i.stat().st_mtime for i in indexes) < source.stat().st_mtime:
            return False
    return True


def pytest_configure(config: pytest.Config) -> None:
    """Compile the numba kernels once before the test processes start (``_warm_kernels``), when the cache is
    cold (a fresh clone: CI). Otherwise both xdist workers, and every gloo rank, notebook kernel and subprocess
    that reached a kernel before it was cached, compiled it again for itself. Runs in the xdist controller (or
    the only process), never in a worker; a failure here is only reported: the tests compile what they need."""
    if hasattr(config, "workerinput") or config.option.collectonly or config.option.help:
        return
    if importlib.util.find_spec("numba") is None or _kernels_cached():
        return
    script = Path(__file__).with_name("_warm_kernels.py")
    started = time.monotonic()
    parts = {part: subprocess.Popen([sys.executable, str(script), part]) for part in ("search", "pairs")}
    failed = [part for part, process in parts.items() if process.wait() != 0]
    message = f"numba kernels compiled into their cache in {time.monotonic() - started:.0f} s"
    if failed:
        message += f" (warm-up part {', '.join(failed)} failed: the tests compile the rest)"
    print(message, file=sys.stderr)  # before the terminal reporter exists
