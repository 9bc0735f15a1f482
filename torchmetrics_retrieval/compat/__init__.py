"""Drop-in APIs of the libraries users come from, as thin adapters over :mod:`torchmetrics_retrieval.functional`.

* :mod:`torchmetrics_retrieval.compat.pml`: pytorch-metric-learning's ``AccuracyCalculator``.
* :mod:`torchmetrics_retrieval.compat.testers`: pytorch-metric-learning's testers (also importable as
  ``torchmetrics_retrieval.testers``).
* :mod:`torchmetrics_retrieval.compat.oml`: open-metric-learning's functional metrics
  (``calc_retrieval_metrics``, ``calc_cmc``, ``calc_precision``, ``calc_map``, ``calc_fnmr_at_fmr``,
  ``calc_pcf``, ``calc_topological_metrics``) and its nested result layout.
* :mod:`torchmetrics_retrieval.compat.nidl`: nidl's ``contrastive_accuracy_score``.
* :mod:`torchmetrics_retrieval.compat.sentence_transformers`: sentence-transformers' ``InformationRetrievalEvaluator``
  numbers from embeddings (``information_retrieval_scores``).

Same calls, same numbers as the originals (differences are listed in each function's docstring).
The submodules are not imported here: import the one you need, e.g.
``from torchmetrics_retrieval.compat.oml import calc_retrieval_metrics``.
"""
