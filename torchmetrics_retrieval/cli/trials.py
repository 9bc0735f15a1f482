"""``evaluate --trials FILE``: verification on a trial list instead of every labelled pair.

A trial file is the VoxCeleb text format, one trial a line ``1 id10270/x.wav id10271/y.wav`` (target flag,
enrolment item, test item, whitespace-separated), or a ``.csv`` with a header naming its ``enrol``, ``test`` and
``target`` columns (:data:`COLUMNS` lists the accepted names). Items are the names of a column of the labels table
(``--item-column``, default ``item``); without such a table they are the embeddings' row indices (0 to N - 1).
The values are those of :func:`~torchmetrics_retrieval.functional.trial_metrics`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.cli.inputs import TABLE_SUFFIXES, UsageError, check_rows, load_table
from torchmetrics_retrieval.cli.output import print_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions, option_fields
from torchmetrics_retrieval.functional.trials import trial_metrics

__all__ = ["COLUMNS", "add_trial_flags", "check_trial_flags", "evaluate_trials", "read_trials"]

#: Accepted header names (case-insensitive) of a CSV trial file's three columns.
COLUMNS = {
    "enrol": ("enrol", "enroll", "enrolment", "enrollment"),
    "test": ("test",),
    "target": ("target", "is_target"),
}
_FLAGS = {"1": True, "0": False, "true": True, "false": False}
#: Options that only a trial list uses, with their "not given" values.
_TRIAL_ONLY = {"cllr": False, "act_dcf_p_target": (), "far_rule": "exact", "item_column": "item"}
#: The retrieval options that apply to trials (passed on to ``trial_metrics`` or used here).
_APPLIES = ("fmr_vals", "eer", "min_dcf_p_target", "dcf_costs", "roc_auc", "distance", "normalize", "chunk_size")


def add_trial_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("trial lists (verification on listed pairs only; see docs/guides/cli.md)")
    group.add_argument(
        "--trials",
        metavar="FILE",
        help="evaluate these trials instead of every labelled pair: lines 'TARGET ENROL TEST' (VoxCeleb) or a .csv "
        "with enrol,test,target columns",
    )
    group.add_argument(
        "--item-column",
        default="item",
        help="column of the labels table naming the trials' items (default: item); without a labels table the "
        "trials' items are row indices",
    )
    group.add_argument("--cllr", action="store_true", help="also cllr and min_cllr (calibrated scores only)")
    group.add_argument(
        "--act-dcf", dest="act_dcf_p_target", type=float, nargs="*", default=(), metavar="P",
        help="target priors of act_dcf/{p}, the cost at the Bayes threshold (calibrated scores only)",
    )  # fmt: skip
    group.add_argument(
        "--far-rule", choices=("exact", "nearest_roc_point"), default="exact",
        help="how TAR@FAR is read: the exact FMR quantile, or the ROC point nearest the FAR (default: exact)",
    )  # fmt: skip


def _flag(value: str, where: str) -> bool:
    flag = _FLAGS.get(value.strip().lower())
    if flag is None:
        raise UsageError(f"{where}: the target flag must be 1 or 0 (or true/false), got {value!r}")
    return flag


def _rows(path: Path) -> list[tuple[int, str, str, str]]:
    """``(line number, target flag, enrol item, test item)`` of every trial in the file, as text."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read trial file {path}: {type(error).__name__}: {error}") from error
    rows: list[tuple[int, str, str, str]] = []
    if path.suffix.lower() == ".csv":
        reader = csv.reader(text.splitlines())
        header = next(reader, None)
        if header is None:
            raise UsageError(f"trial file {path} is empty: it needs a header row and trials")
        names = [name.strip().lower() for name in header]
        where: dict[str, int] = {}
        for role, accepted in COLUMNS.items():
            found = [i for i, name in enumerate(names) if name in accepted]
            if len(found) != 1:
                raise UsageError(
                    f"trial file {path} needs one {role} column (header {'/'.join(accepted)}); its header is {header}"
                )
            where[role] = found[0]
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise UsageError(f"trial file {path} line {line}: {len(row)} fields, not {len(header)} like the header")
            rows.append((line, row[where["target"]], row[where["enrol"]].strip(), row[where["test"]].strip()))
    else:
        for line, content in enumerate(text.splitlines(), start=1):
            fields = content.split()
            if not fields:
                continue
            if len(fields) != 3:
                raise UsageError(
                    f"trial file {path} line {line}: expected 3 fields 'TARGET ENROL TEST', got {len(fields)}"
                )
            rows.append((line, *fields))  # type: ignore[arg-type]
    if not rows:
        raise UsageError(f"trial file {path} holds no trial")
    return rows


def read_trials(path: Path, names: np.ndarray | None, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(enrol_index, test_index, is_target)`` of the trial file: items looked up in ``names`` (the items' names,
    one per embedding row) or, when None, read as row indices in ``[0, n)``."""
    if names is not None:
        index = {name: i for i, name in enumerate(names.astype(str).tolist())}
        if len(index) != len(names):
            raise UsageError("the item names of the labels table must be distinct, to match the trials' items")
    enrol, test, target = [], [], []
    for line, flag, *items in _rows(path):
        where = f"trial file {path} line {line}"
        target.append(_flag(flag, where))
        rows = []
        for item in items:
            row = index.get(item) if names is not None else (int(item) if item.isascii() and item.isdigit() else None)
            if row is None or not 0 <= row < n:
                known = (
                    "the item names of --item-column"
                    if names is not None
                    else f"a row index 0 to {n - 1}: names need a labels table"
                )
                raise UsageError(f"{where}: unknown item {item!r} (not {known})")
            rows.append(row)
        enrol.append(rows[0])
        test.append(rows[1])
    if all(target) or not any(target):
        raise UsageError(
            f"trial file {path} needs target (1) and non-target (0) trials; all {len(target)} are {target[0]:d}"
        )
    as_index = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return as_index(enrol), as_index(test), torch.tensor(target, dtype=torch.bool)


def _item_names(args: argparse.Namespace, n: int) -> np.ndarray | None:
    if args.labels is None:
        return None
    path = Path(args.labels)
    if path.suffix.lower() not in TABLE_SUFFIXES or not path.is_file():
        raise UsageError(
            f"with --trials the second argument names the items: a .csv/.parquet table with the --item-column "
            f"{args.item_column!r}, got {args.labels}"
        )
    table = load_table(path)
    if args.item_column not in table:
        raise UsageError(
            f"labels table {path} has no column {args.item_column!r}; it has {sorted(table)} (see --item-column)"
        )
    check_rows("labels", table[args.item_column], n, f"embeddings {args.embeddings}")
    return table[args.item_column]


def check_trial_flags(args: argparse.Namespace) -> None:
    """The trial-only flags need ``--trials``; the flags of an all-pairs evaluation cannot be used with it."""
    if args.trials is None:
        given = [name for name, unset in _TRIAL_ONLY.items() if getattr(args, name) != unset]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --trials")
        return
    for name in ("gallery", "gallery_labels", "images", "compare", "worst_key"):
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} cannot be used with --trials")


def evaluate_trials(args: argparse.Namespace, embeddings: Tensor) -> int:
    """Print (and with ``--report`` write) the trial values; ``args`` as the ``evaluate`` command parses them."""
    options: RetrievalOptions = args.options
    path = Path(args.trials)
    if not path.is_file():
        raise UsageError(f"trial file not found: {path}")
    trials = read_trials(path, _item_names(args, embeddings.shape[0]), embeddings.shape[0])
    if options.normalize:
        embeddings = torch.nn.functional.normalize(embeddings, dim=1)
    start = time.perf_counter()
    metrics = trial_metrics(
        embeddings, trials, distance=options.distance, fmr_vals=options.fmr_vals, eer=options.eer,
        min_dcf_p_target=options.min_dcf_p_target, dcf_costs=options.dcf_costs, roc_auc=options.roc_auc,
        cllr=args.cllr, act_dcf_p_target=tuple(args.act_dcf_p_target), far_rule=args.far_rule,
        chunk_size=options.chunk_size,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    n_target = int(trials[2].sum())
    title = (
        f"Verification on {args.trials}: {len(trials[2])} trials ({n_target} target) over {args.embeddings} "
        f"({options.distance} distance)"
    )
    print_metrics(args.json, title, metrics, seconds)
    if args.report is not None:
        folder = Path(args.report)
        folder.mkdir(parents=True, exist_ok=True)
        specs = option_fields()
        chosen: dict[str, Any] = {
            name: list(value) if isinstance(value, tuple) else value
            for name in _APPLIES
            if (value := getattr(options, name)) != specs[name].default
        }
        chosen.update(cllr=args.cllr, act_dcf_p_target=list(args.act_dcf_p_target), far_rule=args.far_rule)
        document = {
            "metrics": {key: None if math.isnan(float(v)) else float(v) for key, v in metrics.items()},
            "inputs": {
                "samples": embeddings.shape[0],
                "dimension": embeddings.shape[1],
                "trials": len(trials[2]),
                "target_trials": n_target,
                "trial_file": str(path),
            },
            "options": chosen,
        }
        (folder / "metrics.json").write_text(json.dumps(document, indent=2) + "\n")
        print(f"report written to {folder}: metrics.json", file=sys.stderr)
    return 0
