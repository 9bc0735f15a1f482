"""Compiled (numba) kernels of the engine on the CPU: the stage-1 candidate scans (``buffer``), the stage-2
ordering of near ties (``order``), and the kernels themselves (``kernels``, loaded on first use).

Whether a search takes them is decided in one place, ``plan.use_compiled``.
"""

#: How the kernels that map a value to a distance (``order_kernels``, ``functional._pairs.auc_kernels``) number
#: the distances.
DISTANCE_CODES = {"dot": 0, "cosine": 1, "sqeuclidean": 2, "euclidean": 3}
