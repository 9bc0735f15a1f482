"""``python -m torchmetrics_retrieval`` runs the command line."""

from torchmetrics_retrieval.cli import main

raise SystemExit(main())
