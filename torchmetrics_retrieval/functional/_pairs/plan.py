"""Every tuning constant of the all-pairs engine, with the reason for each (read at call time, as
``plan.NAME``, so that a test can set one in a single place)."""

# ---- the histogram pass and the exact values (``quantiles``) --------------------------------------------------------
#: Number of histogram buckets of the first pass.
N_BUCKETS = 2**16
#: Collected distinct values are merged (de-duplicated) whenever this many are pending.
MERGE_EVERY = 2**22

# ---- the sample that foresees the second pass (``passes.sample``, ``windows``) --------------------------------------
#: The sample is one tile of rows in at least this many (at most about 2 / this of the pairs of a set against itself).
SAMPLED_TILES = 8
#: At most this many positive pairs are listed for the sample (16 bytes each, briefly).
LISTED_POSITIVES = 2**22
#: Row groups of the sample; their spread gives the standard errors.
GROUPS = 8
#: Width of the bounds, in standard errors: generous, as a miss costs a whole pass and a wide window little.
Z = 6.0
#: Most bytes of the windows' counters, over every thread (a counter per value, sign and thread: int32 while the
#: pairs are fewer than 2**31, else int64).
MAX_BYTES = 2**27
#: Most float32 values in one tracked bucket (a bucket spans hundreds unless it lies near 0).
MAX_BUCKET_KEYS = 2**14
#: Fewest sampled pairs of either sign to foresee anything from.
MIN_SAMPLE = 100
#: Buckets a listed positive may move by between its canonical distance and the pass's.
SHIFT = 4

# ---- ROC AUC (``auc``) -----------------------------------------------------------------------------------------------
#: Lookup-table buckets over the positive distances (one per positive at most; 4 MiB of int32 at most). A negative in
#: a bucket without a positive reads nothing else; in a crowded one, a binary search over the positives. The kernel
#: reads the table in a loop of its own, where the reads overlap, so a table finer than L2 still pays (measured on
#: the benchmarks page); coarser tables were slower.
LUT_ENTRIES = 2**20
