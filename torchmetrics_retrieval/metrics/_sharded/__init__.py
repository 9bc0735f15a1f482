"""Sharded evaluation under DDP (private): every rank keeps its own embeddings, and every value is the one of a
single process over the whole set, bit for bit.

The distributed layer sits between the metric classes and the engines, imports in one direction::

    faults.py        a rank's failure known to every rank: one clear error everywhere, not a hang
    gather.py        every collective (all-gathers of per-sample rows, all-reduces), each after a checkpoint
    global_set.py    the de-duplicated global set every rank builds from the gathered small fields
                     (ShardedSet: the problem over the global set, this rank's rows, who holds what)
    rounds.py        the ONE visiting-rounds driver: every rank's next block of queries visits every rank
    search.py        the exact top K: symmetric ring passes, or the visiting rounds (queries apart)
    tiles.py         the engines' one tile schedule shared out over the ranks: each tile computed by one rank
    keys.py          one process's stage-1 key tiles, each computed by one rank from the same operands
    ranks.py         full-ranking ranks: thresholds and counts of each shard, summed
    pairs.py         FNMR@FMR, EER, minDCF (the ``_pairs`` passes on this rank's tiles, totals summed)
    auc.py           ROC AUC (positives listed in the visiting rounds, the ``_pairs.auc`` placement of the
                     negatives on this rank's tiles, counts summed)
    embedding.py     EmbeddingMetrics: the search and counts injected into the engines' per-query code
    contrastive.py   ContrastiveAccuracy, in visiting rounds
    cross_modal.py   CrossModalRetrieval: each direction as a sharded ranking
    trials.py        TrialMetrics: each trial scored by its enrolment row's owner (test rows sent point to
                     point), the scores gathered in trial order

The engines make their size-dependent choices (compiled kernels or torch passes) for the whole problem, not for
a rank's part of it (``plan.part_of``), so every part takes the path one process would take.
"""
