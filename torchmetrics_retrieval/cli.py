"""Command line: ``torchmetrics-retrieval demo`` and ``torchmetrics-retrieval evaluate``.

``demo`` evaluates retrieval on real data that ships with scikit-learn (``load_digits``: 1797
8x8 images of handwritten digits, each image's 64 pixels used as its embedding) and prints a table.
``evaluate`` does the same for embeddings and labels saved on disk (``.npy``, ``.npz`` or ``.pt``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._options import RetrievalOptions, option_fields
from torchmetrics_retrieval.functional.retrieval import evaluate

__all__ = ["main"]


def _load_array(path: str, name: str) -> Tensor:
    """A tensor from ``.npy``, ``.npz`` (its only or first array) or ``.pt`` (a saved tensor)."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"error: {name} file not found: {path}")
    if file.suffix == ".pt":
        value = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(value, Tensor):
            raise SystemExit(f"error: {name} file {path} must hold a tensor, got {type(value).__name__}")
        return value
    if file.suffix in (".npy", ".npz"):
        loaded = np.load(file, allow_pickle=False)
        array = loaded[loaded.files[0]] if isinstance(loaded, np.lib.npyio.NpzFile) else loaded
        return torch.from_numpy(np.ascontiguousarray(array))
    raise SystemExit(f"error: {name} file must end in .npy, .npz or .pt, got {path}")


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


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RetrievalOptions:
    """The options given on the command line, checked (a bad value is a usage error naming the flag's option)."""
    try:
        return RetrievalOptions.create(**{name: getattr(args, name) for name in option_fields() if hasattr(args, name)})
    except (TypeError, ValueError) as error:
        parser.error(str(error))


def _print_table(title: str, metrics: dict[str, Tensor], seconds: float, out: Any) -> None:
    width = max(len(key) for key in metrics)
    print(title, file=out)
    print(f"{'metric'.ljust(width)}  value", file=out)
    print(f"{'-' * width}  ------", file=out)
    for key, value in metrics.items():
        print(f"{key.ljust(width)}  {float(value):.4f}", file=out)
    print(f"({len(metrics)} metrics in {seconds:.2f} s)", file=out)


def _run(title: str, embeddings: Tensor, labels: Tensor, args: argparse.Namespace, **sets: Any) -> int:
    start = time.perf_counter()
    gallery, gallery_labels = sets.get("gallery"), sets.get("gallery_labels")
    metrics, _ = evaluate(embeddings.float(), labels, gallery, gallery_labels, args.options, keep_neighbours=False)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({key: float(value) for key, value in metrics.items()}, indent=2))
    else:
        _print_table(title, metrics, seconds, sys.stdout)
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
    return _run(title, embeddings, labels, args)


def _evaluate(args: argparse.Namespace) -> int:
    embeddings = _load_array(args.embeddings, "embeddings")
    labels = _load_array(args.labels, "labels")
    sets: dict[str, Any] = {}
    if args.gallery is not None:
        if args.gallery_labels is None:
            raise SystemExit("error: --gallery needs --gallery-labels")
        sets = {
            "gallery": _load_array(args.gallery, "gallery").float(),
            "gallery_labels": _load_array(args.gallery_labels, "gallery labels"),
        }
    title = f"Retrieval on {args.embeddings}: {embeddings.shape[0]} queries" + (
        f" against {args.gallery}" if args.gallery else " (leave-one-out)"
    )
    try:
        return _run(title, embeddings, labels, args, **sets)
    except (TypeError, ValueError) as error:
        raise SystemExit(f"error: {error}") from error


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchmetrics-retrieval", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="evaluate retrieval on scikit-learn's bundled digits data")
    evaluate = commands.add_parser("evaluate", help="evaluate embeddings saved on disk (.npy, .npz, .pt)")
    evaluate.add_argument("embeddings", help="(N, D) query embeddings, or the whole set for leave-one-out")
    evaluate.add_argument("labels", help="(N,) or (N, L) labels")
    evaluate.add_argument("--gallery", help="(G, D) gallery embeddings (default: leave-one-out on the embeddings)")
    evaluate.add_argument("--gallery-labels", help="(G,) or (G, L) gallery labels")
    for sub, defaults in ((demo, _DEMO_DEFAULTS), (evaluate, _CLI_DEFAULTS)):
        _add_option_flags(sub, defaults)
        sub.add_argument("--json", action="store_true", help="print the metrics as JSON")
    demo.set_defaults(handler=_demo)
    evaluate.set_defaults(handler=_evaluate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchmetrics-retrieval`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.options = _options(args, parser)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
