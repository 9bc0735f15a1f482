"""Shared test settings."""

import os
import sys

import torch
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))  # `import reference` from any test folder

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
