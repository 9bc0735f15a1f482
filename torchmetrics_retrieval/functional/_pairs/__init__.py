"""The all-pairs engine (private): FNMR@FMR / TAR@FAR, EER, minDCF and ROC AUC over every (query, gallery item)
pair of a checked problem, exact, streamed in the tiles of ``_search.blocks.TileSchedule``; never a Q x G matrix.

The pipeline, one stage per module, imports in one direction::

    plan.py          every tuning constant of the engine (buckets, sample, windows, lookup tables)
    rates.py         EER and minDCF from the histograms and the exact values near them
    windows.py       the second pass foreseen from a sample, and counted inside the first
    quantiles.py     pass 1: bucket histograms; pass 2: the exact values of the wanted buckets; the order
       |             statistics, thresholds and rates (``statistics``), for any pair source
    kernels.py       numba: a tile's keys -> distances, signs, eligibility and buckets, in one read
    passes.py        PairPasses: the pairs of a problem as a pair source, through the kernels on the CPU
    auc_kernels.py   numba: a tile's float64 products placed among the sorted positive distances
    auc.py           ROC AUC: the positives listed from the labels, every negative placed among them

A source that holds only a part of the pairs (a rank of a sharded evaluation) passes ``statistics`` a
``PassTotals`` that sums its histograms and merges its collected values with the other parts'; ROC AUC's counts
are integers over any partition of the tiles, so they add up the same way.
"""
