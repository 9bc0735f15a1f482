"""The full-ranking engine (private): the rank of relevant items in each query's whole ranking (MRR beyond K,
full MAP, mINP), at the cost of one pass of products; never a Q x G matrix.

The pipeline, imports in one direction::

    plan.py       every tuning constant of the engine (budgets, lookup tables, near-tie buffers)
    kernels.py    numba: count a tile's keys against each query's thresholds, list the near ties
    count.py      thresholds (a query's relevant items, canonical distances, key brackets), the count of the
                  items before each threshold over the tiles of ``_search.blocks.TileSchedule``, the near ties
                  decided canonically, and ``relevant_ranks``

The count of a threshold is a sum over the tiles of the gallery items before it, so any partition of the tiles
(a rank of a sharded evaluation holds some) gives parts that add up to the whole.
"""
