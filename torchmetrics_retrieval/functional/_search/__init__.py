"""The exact kNN engine behind :mod:`torchmetrics_retrieval.functional.search` (private: import from ``search``).

The user calls ``knn``, ``knn_chunks`` or ``distance_blocks``; ``search.py`` checks the arguments once and
builds a :class:`~.problem.Problem`; the engine takes only checked problems. The metric modules and the engines
that stream over every pair (``retrieval``, ``verification``, ``_ranks``, ``_pairs``) build their problem from
inputs checked at the entry the user called, and call the engine directly.

The pipeline, one stage per module, imports in one direction (each module imports only those above it)::

    types.py          KNNResult, DistanceBlock, the Distance/KNNBackend names, and the exclusion rule
       |              (Exclusions: self by position, sequence ids, search groups), written once
    plan.py           every tuning constant (block sizes, margins, sample sizes, buffer budgets), the
       |              backend choice, and the one decision "compiled kernels or torch passes?"
    keys.py           rows, canonical float64 products and distances, the float32 order key
    half_rows.py      a set stored in float16/bfloat16: its float32 stage rows made block by block (no copy)
    blocks.py         the distance matrix in memory-bounded blocks (distance_blocks)
    problem.py        Problem: rows in float64, canonical norms, eligible counts; Candidates of a stage
       |
       |  stage 1: per query, kp = K + margin candidates by float32 keys, and a floor below which no
       |  other eligible item's key lies
       +-- torch_stage.py       blocked products + streaming selection on any device
       |     stream_topk.py     the drivers: one-sided, symmetric (each distance once), sampled thresholds
       |     torch_buffer.py    the candidate buffer in torch passes
       |     symmetric_sweep.py a large set against itself, group by group, spilling to later groups
       |     compiled/          numba scans, per-row radix sorts and the near-tie ordering (CPU)
       +-- faiss_stage.py       a faiss flat index: exact top-k, or a range search below thresholds
       |   low_precision.py     the torch stage's keys from bfloat16 rows (float32 sums), each row's exact
       |                        rounding error, the wider bound they add, and what search_precision="auto" picks
       |
    certify.py        stage 2: canonical distances of the candidates, order by (distance, position), and
       |              the certificate: K-th distance < what the floor minus the rounding bound allows
    rounds.py         Search: the uncertified queries searched again with twice the candidates, until
                      every query is proven exact

Beside the search, the passes over every pair read ``key_blocks.py``: the float32 stage-1 keys of every
(query, item) pair, tile by tile in the one schedule of ``blocks.TileSchedule`` (symmetric tiles, each serving
both orders, for a set against itself), with how a key maps to a distance. The engines that consume them keep
their own kernels and constants: ``functional._ranks`` (full-ranking ranks) and ``functional._pairs`` (FNMR@FMR,
EER, minDCF, ROC AUC).

What each stage proves: stage 1 proves nothing about order; it guarantees, through the floor, that every
non-candidate's key is at least the floor. ``certify.key_tolerance`` bounds the float32 rounding of any
key rigorously, so a certified query's answer equals the exact answer of the canonical float64 distances,
ties ordered by gallery position, for every backend, chunk size and thread count.

Low precision (``search_precision="bfloat16"``, or ``"auto"`` on hardware with bfloat16 units): the torch stage
multiplies rows rounded to bfloat16, and its candidates carry the extra bound of that rounding
(``low_precision.extra_tolerance``: ``|<q,g> - <q^,g^>| <= e_q |g| + |q^| e_g`` with the rows' exact rounding
errors ``e``, plus one bfloat16 rounding of the float32 sum), which ``certify.candidate_tolerance`` adds to the
float32 one. The wider bound takes more candidates (``plan.bf16_candidates_per_query``); a first round that
leaves more than ``plan.BF16_FALLBACK_SHARE`` of the queries undecided turns the stage to float32
(``rounds``). The answer is the same bit for bit: only the certificate's bound changes.

Where the constants live: all in ``plan.py`` (with the reason for each); the measurements behind them in
benchmarks/README.md. How tests take either path on small data: ``plan.force_compiled(True | False)``.
"""
