"""Every tuning constant of the full-ranking engine, with the reason for each (read at call time, as
``plan.NAME``, so that a test can set one in a single place)."""

#: Thresholds (rows x max n(q)) per query chunk: with their pairs, brackets and lookup tables about 280 bytes each,
#: so about 300 MB at most.
BUDGET_ENTRIES = 1 << 20
#: Lookup-table buckets per threshold (most items then need no search), and the tables' budget in bytes (int16
#: entries).
LUT_BUCKETS_PER_THRESHOLD = 8
LUT_BYTES = 64 * 2**20
#: The near ties of a row that one block scan keeps (more: the row is scanned again to list them all).
AMBIGUOUS_PER_ROW = 128
