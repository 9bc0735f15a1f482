"""Shared test settings."""

import os
import sys

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
