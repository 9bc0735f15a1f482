"""Command line: ``torchmetrics-retrieval demo`` and ``torchmetrics-retrieval evaluate``.

``demo`` evaluates retrieval on real data that ships with scikit-learn (``load_digits``: 1797 8x8 images of
handwritten digits, each image's 64 pixels used as its embedding) and prints a table. ``evaluate`` does the same
for embeddings and labels saved on disk (``.npy``, ``.npz``, ``.pt``, ``.safetensors``; labels also as a ``.csv``
or ``.parquet`` table). Both can write a report (``--report DIR``: JSON, per-query values, plots) and compare two
models query by query (``--compare``). ``evaluate --trials FILE`` scores a verification trial list instead
(:mod:`torchmetrics_retrieval.cli.trials`); ``evaluate --qrels FILE`` judges queries against a corpus with graded
qrels (:mod:`torchmetrics_retrieval.cli.qrels`). Mistakes in the command or its files print one line and exit with
code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, redirect_stderr
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.cli.inputs import Inputs, UsageError, check_rows, encode, load_array, load_labels, read_side
from torchmetrics_retrieval.cli.output import print_table
from torchmetrics_retrieval.cli.qrels import add_qrels_flags
from torchmetrics_retrieval.cli.trials import add_trial_flags, check_trial_flags
from torchmetrics_retrieval.functional._evaluate import evaluate
from torchmetrics_retrieval.functional._options import RetrievalOptions, option_fields

__all__ = ["main"]

#: Short names kept from the first command line, beside the ``--field-name`` flag every option has.
_SHORT_FLAGS = {
    "cmc_top_k": "--cmc",
    "precision_top_k": "--precision",
    "map_top_k": "--map",
    "fmr_vals": "--fmr",
    "pcf_variance": "--pcf",
    "knn_backend": "--backend",
}
#: Where the command line's defaults differ from the library's: a printed table shows more metrics.
_CLI_DEFAULTS: dict[str, Any] = {
    "map_at_r": True,
    "r_precision": True,
    "mrr": True,
    "fmr_vals": (0.1,),
    "pcf_variance": (0.5,),
}
#: The demo's data is small: it shows every metric.
_DEMO_DEFAULTS = {**_CLI_DEFAULTS, "map_full": True, "clustering": True}
#: Per-sample fields of ``retrieval_metrics``: which sides a file gives ("one set": leave-one-out only).
_SAMPLE_FIELDS = {
    "is_query": "one set",
    "is_gallery": "one set",
    "sequence_ids": "both sides",
    "camera_ids": "both sides",
    "search_groups": "both sides",
    "categories": "query side",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage mistake: one line on stderr, exit code 2 (argparse's convention, without the usage block)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, tuple):
        return " ".join(map(str, default)) or "none"
    return str(default)


def _add_option_flags(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """One flag per :class:`RetrievalOptions` field, typed by its kind (a function cannot be given as text).

    ``defaults`` overrides the library's defaults. A switch ``--x`` also has ``--no-x`` (hidden from the help,
    spelled out here rather than with ``argparse.BooleanOptionalAction``, whose help differs between Pythons).
    """
    group = parser.add_argument_group("retrieval options (RetrievalOptions; every switch --x has --no-x)")
    for name, spec in option_fields().items():
        kind = spec.metadata["kind"]
        if name == "progress":  # the command line's own --progress / --quiet decide
            continue
        flag = f"--{name.replace('_', '-')}"
        flags = [flag, *([_SHORT_FLAGS[name]] if name in _SHORT_FLAGS else [])]
        default = defaults.get(name, spec.default)
        common = {"dest": name, "default": default, "help": f"{spec.metadata['help']} (default: {_shown(default)})"}
        if kind.name == "cutoffs":
            group.add_argument(*flags, type=int, nargs="*", metavar="K", **common)
        elif kind.name == "fractions":
            group.add_argument(*flags, type=float, nargs="*", metavar="F", **common)
        elif kind.name == "bool":
            group.add_argument(*flags, action="store_true", **common)
            group.add_argument(f"--no-{flag[2:]}", dest=name, action="store_false", help=argparse.SUPPRESS)
        elif kind.name == "choice":
            group.add_argument(*flags, choices=kind.choices, **common)
        elif kind.name in ("positive_int_or_none", "positive_int", "seed"):
            group.add_argument(*flags, type=int, metavar="N", **common)
        elif kind.name == "costs":
            group.add_argument(*flags, type=float, nargs=2, metavar=("C_MISS", "C_FA"), **common)
        elif kind.name == "level_or_none":
            group.add_argument(*flags, type=float, metavar="C", **common)
        elif kind.name in ("str", "str_or_none"):
            group.add_argument(*flags, metavar="TEXT", **common)


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="print the metrics as JSON")
    group.add_argument(
        "--report",
        metavar="DIR",
        help="write metrics.json, per-query values and plots into DIR (the files written are listed on stderr)",
    )
    group.add_argument("--per-query-format", choices=("csv", "parquet"), default="csv", help="of the report")
    group.add_argument("--worst-key", metavar="KEY", help="per-query key of the worst-queries plot (with images)")
    group.add_argument(
        "--quiet",
        action="store_true",
        help="nothing on stderr unless the command fails: no progress bars, warnings, log lines or list of the "
        "report's files",
    )
    group.add_argument("--progress", action="store_true", help="progress bars even when stderr is not a terminal")
    group = parser.add_argument_group("comparison of two models (paired, query by query)")
    group.add_argument("--compare", metavar="OTHER", help="the other model's embeddings of the same samples")
    group.add_argument("--compare-gallery", metavar="FILE", help="the other model's gallery (with --gallery)")
    group.add_argument("--test", choices=("paired_t", "randomization", "bootstrap"), default="paired_t")
    group.add_argument("--level", type=float, default=0.95, help="coverage of the interval (default: 0.95)")


def _add_input_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("embeddings", help="(N, D) embeddings: the whole set (leave-one-out) or the queries")
    parser.add_argument(
        "labels", nargs="?",
        help="(N,) or (N, L) labels: an array file or a .csv/.parquet table (with --trials: optional, a table naming "
        "the items)",
    )  # fmt: skip
    group = parser.add_argument_group("inputs (FILE or FILE:KEY; a per-sample option also takes a table column)")
    group.add_argument("--label-column", default="label", help="column of a labels table (default: label)")
    group.add_argument("--gallery", help="(G, D) gallery embeddings (default: leave-one-out on the embeddings)")
    group.add_argument("--gallery-labels", help="(G,) or (G, L) gallery labels")
    group.add_argument("--images", help="(N, H, W) or (N, H, W, C) images of the samples, for the report")
    group.add_argument(
        "--neighbours",
        metavar="FILE",
        help="(Q, k) integer neighbour lists of an approximate index (-1: no result): the ranking metrics of these "
        "lists instead of the exact search (n(q) stays exact)",
    )
    for name, sides in _SAMPLE_FIELDS.items():
        group.add_argument(f"--{name.replace('_', '-')}", metavar="SOURCE", help=f"{name} ({sides})")
        if sides == "both sides":
            group.add_argument(f"--gallery-{name.replace('_', '-')}", metavar="SOURCE", help=f"{name} of the gallery")


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RetrievalOptions:
    """The options given on the command line, checked (a bad value is a usage error naming the flag's option)."""
    try:
        options = RetrievalOptions.create(
            **{name: getattr(args, name) for name in option_fields() if hasattr(args, name)}
        )
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    progress = not args.quiet and (args.progress or sys.stderr.isatty())
    return replace(options, progress=progress)


def _field(args: argparse.Namespace, name: str, sides: str, tables: tuple[Any, Any], sizes: tuple[int, int]) -> Any:
    """One per-sample field as ``retrieval_metrics`` takes it, or None when not given."""
    flag = f"--{name.replace('_', '-')}"
    source, gallery_source = getattr(args, name), getattr(args, f"gallery_{name}", None)
    if source is None:
        if gallery_source is not None:
            raise UsageError(f"--gallery-{flag[2:]} needs {flag}")
        return None
    separate = args.gallery is not None
    if sides == "one set" and separate:
        raise UsageError(f"{flag} picks samples of one set: it cannot be used with --gallery")
    query_side = read_side(source, tables[0], flag)
    check_rows(flag, query_side, sizes[0], "the embeddings")
    if sides == "both sides" and separate:
        if gallery_source is None:
            raise UsageError(f"{flag} with --gallery needs --gallery-{flag[2:]} for the gallery side")
        gallery_side = read_side(gallery_source, tables[1], f"--gallery-{flag[2:]}")
        check_rows(f"--gallery-{flag[2:]}", gallery_side, sizes[1], "the gallery")
        return encode(query_side, gallery_side)
    values = encode(query_side)[0]
    if sides == "one set" and values.dtype != torch.bool:
        if not bool(((values == 0) | (values == 1)).all()):
            raise UsageError(f"{flag} must hold booleans (true/false or 0/1), got other values in {source}")
        values = values.bool()
    return values


def _embeddings(spec: str, what: str) -> Tensor:
    x = load_array(spec, what)
    if x.ndim != 2:
        raise UsageError(f"{what} must be a 2-D array (samples, dimension), got shape {tuple(x.shape)} in {spec}")
    return x if x.dtype == torch.float64 else x.float()


def _read_inputs(args: argparse.Namespace) -> Inputs:
    embeddings_spec, gallery_spec = args.embeddings, args.gallery
    embeddings = _embeddings(embeddings_spec, "embeddings")
    labels, table = load_labels(args.labels, args.label_column, "labels")
    check_rows("labels", labels, embeddings.shape[0], f"embeddings {embeddings_spec}")
    gallery = gallery_labels = gallery_table = None
    if gallery_spec is not None:
        if args.gallery_labels is None:
            raise UsageError("--gallery needs --gallery-labels")
        gallery = _embeddings(gallery_spec, "gallery")
        gallery_labels, gallery_table = load_labels(args.gallery_labels, args.label_column, "gallery labels")
        check_rows("gallery labels", gallery_labels, gallery.shape[0], f"gallery {gallery_spec}")
    elif args.gallery_labels is not None:
        raise UsageError("--gallery-labels needs --gallery")
    query_labels, gallery_labels_t = encode(labels, gallery_labels)
    sizes = (embeddings.shape[0], 0 if gallery is None else gallery.shape[0])
    fields = {name: _field(args, name, sides, (table, gallery_table), sizes) for name, sides in _SAMPLE_FIELDS.items()}
    given = {name: value for name, value in fields.items() if value is not None}
    return Inputs(embeddings, query_labels, gallery, gallery_labels_t, given)


def _run(title: str, inputs: Inputs, args: argparse.Namespace, images: Tensor | None, other: Inputs | None) -> int:
    from torchmetrics_retrieval.cli.compare import compare, print_comparison
    from torchmetrics_retrieval.cli.report import write_report

    options: RetrievalOptions = args.options
    start = time.perf_counter()
    metrics, result = evaluate(
        inputs.embeddings, inputs.labels, inputs.gallery, inputs.gallery_labels, options,
        keep_neighbours=args.report is not None, neighbours=getattr(args, "neighbour_lists", None), **inputs.fields,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if args.worst_key is not None and (result is None or args.worst_key not in result.values):
        known = [] if result is None else sorted(result.values)
        raise UsageError(f"--worst-key must be one of the per-query keys {known}, got {args.worst_key!r}")
    comparison = None
    if other is not None:
        comparison = compare(inputs, other, options, args.test, args.level, options.seed)
    if args.json:
        document: dict[str, Any] = {key: float(value) for key, value in metrics.items()}
        print(json.dumps(document if comparison is None else {**document, "comparison": comparison}, indent=2))
    else:
        print_table(title, metrics, seconds)
        if comparison is not None:
            print()
            print_comparison(comparison, ("first", "other"), args.test, args.level)
    if args.report is not None:
        folder = Path(args.report)
        written = write_report(
            folder, metrics, result, inputs, options,
            images=images, worst_key=args.worst_key, per_query_format=args.per_query_format,
        )  # fmt: skip
        if comparison is not None:
            (folder / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
            written.append("comparison.json")
        print(f"report written to {folder}: {', '.join(written)}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sklearn.datasets import load_digits

    digits = load_digits()
    embeddings = torch.from_numpy(digits.data.astype(np.float32))
    labels = torch.from_numpy(digits.target.astype(np.int64))
    title = (
        f"Retrieval on scikit-learn's digits: {embeddings.shape[0]} images as {embeddings.shape[1]}-d raw-pixel "
        f"embeddings, {labels.unique().numel()} classes, every image a query against all the others "
        f"({args.distance} distance)."
    )
    return _run(title, Inputs(embeddings, labels), args, torch.from_numpy(digits.images), None)


def _evaluate(args: argparse.Namespace) -> int:
    from torchmetrics_retrieval.cli.trials import evaluate_trials

    check_trial_flags(args)
    if args.qrels is not None:  # graded relevance (issue 42): queries and a corpus, judged by qrels
        from torchmetrics_retrieval.cli.qrels import evaluate_qrels

        corpus = None if args.gallery is None else _embeddings(args.gallery, "gallery")
        return evaluate_qrels(args, _embeddings(args.embeddings, "embeddings"), corpus)
    if args.trials is not None:
        return evaluate_trials(args, _embeddings(args.embeddings, "embeddings"))
    if args.labels is None:
        raise UsageError("evaluate needs labels (only --trials goes without)")
    inputs = _read_inputs(args)
    images = None
    if args.images is not None:
        if args.gallery is not None:
            raise UsageError("--images shows a set searched against itself: it cannot be used with --gallery")
        images = load_array(args.images, "--images")
        check_rows("--images", images, inputs.embeddings.shape[0], "the embeddings")
        if images.ndim not in (3, 4):
            raise UsageError(f"--images must be (N, H, W) or (N, H, W, C), got shape {tuple(images.shape)}")
    args.neighbour_lists = None
    if args.neighbours is not None:
        if args.compare is not None:
            raise UsageError("--neighbours evaluates one index's lists: it cannot be used with --compare")
        args.neighbour_lists = load_array(args.neighbours, "--neighbours")
    other = None
    if args.compare is not None:
        if (args.gallery is None) != (args.compare_gallery is None):
            raise UsageError("--compare with --gallery needs --compare-gallery (and only then)")
        other = replace(inputs, embeddings=_embeddings(args.compare, "--compare"))  # the same labels and rules
        check_rows("--compare", other.embeddings, inputs.embeddings.shape[0], "the embeddings")
        if inputs.gallery is not None:
            other.gallery = _embeddings(args.compare_gallery, "--compare-gallery")
            check_rows("--compare-gallery", other.gallery, inputs.gallery.shape[0], "the gallery")
    title = f"Retrieval on {args.embeddings}: {inputs.embeddings.shape[0]} queries" + (
        f" against {args.gallery}" if args.gallery else " (leave-one-out)"
    )
    return _run(title, inputs, args, images, other)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchmetrics-retrieval", description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = commands.add_parser("demo", help="evaluate retrieval on scikit-learn's bundled digits data")
    evaluate = commands.add_parser("evaluate", help="evaluate embeddings saved on disk")
    _add_input_flags(evaluate)
    add_trial_flags(evaluate)
    add_qrels_flags(evaluate)
    for sub, defaults in ((demo, _DEMO_DEFAULTS), (evaluate, _CLI_DEFAULTS)):
        _add_option_flags(sub, defaults)
        _add_output_flags(sub)
    demo.set_defaults(handler=_demo, compare=None)
    evaluate.set_defaults(handler=_evaluate)
    return parser


@contextmanager
def _stderr_dropped() -> Iterator[None]:
    """Drop what the run writes to ``sys.stderr``: warnings, log lines, the report's file list.

    Warnings are ignored rather than written away, so that none is marked as already shown for a later run in the
    same process. Log lines need the redirection: the logging module's last-resort handler (the one used when no
    handler is configured, e.g. matplotlib's "building the font cache") writes to the current ``sys.stderr``.
    """
    with open(os.devnull, "w") as devnull, redirect_stderr(devnull), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchmetrics-retrieval`` command: 0 on success, 2 for a mistake in the command."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.options = _options(args, parser)
    try:
        with _stderr_dropped() if args.quiet else nullcontext():  # an error is still printed below
            return int(args.handler(args))
    except UsageError as error:
        message = str(error)
    except (TypeError, ValueError) as error:  # the library's checks name the argument and the value
        message = " ".join(str(error).split())
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
