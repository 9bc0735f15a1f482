"""``evaluate QUERIES --qrels qrels/test.tsv --gallery CORPUS``: graded relevance with BEIR-format qrels.

The qrels file is BEIR's ``qrels/{split}.tsv``: tab-separated ``query-id``, ``corpus-id``, ``score`` (an int grade)
with a header line (TREC's four-column ``qid 0 docid grade`` qrels are read too, whitespace-separated, no header).
The ids of the embeddings' rows come from ``--query-ids`` / ``--corpus-ids``, text files with one id a line in row
order (default: the row numbers 0 to N - 1). The values are those of
:func:`~torchmetrics_retrieval.functional.qrels_metrics`, with the cutoffs of the ``--ndcg-top-k``, ``--map``,
``--recall-top-k``, ``--precision`` flags and ``--mrr`` / ``--r-precision``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from torch import Tensor

from torchmetrics_retrieval.cli.inputs import UsageError
from torchmetrics_retrieval.cli.output import print_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional.qrels import TIES, qrels_metrics

__all__ = ["add_qrels_flags", "evaluate_qrels", "read_ids", "read_qrels"]


def add_qrels_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("graded relevance with qrels (BEIR format; --gallery: the corpus)")
    group.add_argument("--qrels", metavar="FILE", help="BEIR qrels .tsv (query-id, corpus-id, score) or TREC qrels")
    group.add_argument("--query-ids", metavar="FILE", help="ids of the query rows, one a line (default: row numbers)")
    group.add_argument("--corpus-ids", metavar="FILE", help="ids of the corpus rows, one a line (default: row numbers)")
    group.add_argument("--relevance-level", type=int, default=1, help="smallest relevant grade (default: 1)")
    group.add_argument("--ignore-identical-ids", action="store_true", help="drop the document with the query's id")
    group.add_argument("--ties", choices=TIES, default="position", help="order of equal scores (default: position)")


def read_qrels(path: Path) -> tuple[list[str], list[str], list[int]]:
    """The judgements of a BEIR ``.tsv`` (header, 3 tab-separated columns) or TREC qrels (4 columns, no header)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read qrels file {path}: {type(error).__name__}: {error}") from error
    qids: list[str] = []
    dids: list[str] = []
    grades: list[int] = []
    for number, line in enumerate(lines, start=1):
        fields = line.split("\t") if "\t" in line else line.split()
        if not any(f.strip() for f in fields):
            continue
        if len(fields) == 4:  # TREC: qid iteration docid grade
            fields = [fields[0], fields[2], fields[3]]
        if len(fields) != 3:
            got = len(fields)
            raise UsageError(f"qrels file {path} line {number}: expected 3 (BEIR) or 4 (TREC) fields, got {got}")
        qid, did, grade = (f.strip() for f in fields)
        try:
            value = int(grade)
        except ValueError:
            if number == 1 and not qids:  # the header line (query-id, corpus-id, score)
                continue
            raise UsageError(f"qrels file {path} line {number}: the grade must be an int, got {grade!r}") from None
        qids.append(qid)
        dids.append(did)
        grades.append(value)
    if not qids:
        raise UsageError(f"qrels file {path} holds no judgement")
    return qids, dids, grades


def read_ids(spec: str | None, n_rows: int, what: str) -> list[str]:
    """One id a line (blank lines ignored), one per row; the row numbers when ``spec`` is None."""
    if spec is None:
        return [str(i) for i in range(n_rows)]
    path = Path(spec)
    if not path.is_file():
        raise UsageError(f"{what} file not found: {spec}")
    ids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(ids) != n_rows:
        raise UsageError(f"{what} {spec} has {len(ids)} ids for {n_rows} rows")
    return ids


def evaluate_qrels(args: argparse.Namespace, query: Tensor, corpus: Tensor | None) -> int:
    """Print the qrels values; ``args`` as the ``evaluate`` command parses them."""
    options: RetrievalOptions = args.options
    if corpus is None:
        raise UsageError("--qrels needs the corpus embeddings as --gallery")
    path = Path(args.qrels)
    if not path.is_file():
        raise UsageError(f"qrels file not found: {path}")
    qrels = read_qrels(path)
    query_ids = read_ids(args.query_ids, query.shape[0], "--query-ids")
    corpus_ids = read_ids(args.corpus_ids, corpus.shape[0], "--corpus-ids")
    start = time.perf_counter()
    metrics = qrels_metrics(
        query, query_ids, corpus, corpus_ids, qrels,
        ndcg_top_k=options.ndcg_top_k, map_top_k=options.map_top_k, recall_top_k=options.recall_top_k,
        precision_top_k=options.precision_top_k, mrr=options.mrr, r_precision=options.r_precision,
        distance=options.distance, relevance_level=args.relevance_level,  # type: ignore[arg-type]
        ignore_identical_ids=args.ignore_identical_ids, ties=args.ties, confidence_level=options.confidence_level,
        n_bootstrap=options.n_bootstrap, seed=options.seed, knn_backend=options.knn_backend,
        chunk_size=options.chunk_size,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    title = (
        f"Retrieval with qrels {args.qrels}: {query.shape[0]} queries against {corpus.shape[0]} documents "
        f"({options.distance}, ties by {args.ties})"
    )
    print_metrics(args.json, title, metrics, seconds)
    if args.report is not None:
        print("--report is not written for --qrels (printed values only)", file=sys.stderr)
    return 0
