"""The ``hscl-zoo`` command line: the zoo's entries, training, evaluation, embedding and export.

MODEL is anything ``hscl_zoo.load`` accepts: a zoo name, ``hf-hub:owner/name[@revision]``,
``local-dir:/path`` (a folder written by ``save_pretrained``, or a training run's output_dir) or
such a folder itself (offline for folders). Errors in the input exit with status 1 and one line
naming the problem; usage errors exit with status 2. Each command imports only what it runs:
``--help``, ``train --help``, ``list`` and ``info`` load no torch. A DATASET is a registered name
or your own data: ``imagefolder:PATH``, ``parquet:PATH`` or ``hf:owner/name``.
Graphs: ``train``, ``eval`` and ``embed`` take ``tu:NAME`` or ``tu:/path/NAME`` and graph-encoder
folders (``hscl_zoo.graphs.recipe``; docs/graphs.md). The commands themselves are in
`hscl_zoo.cli_commands`; this module builds the parser and dispatches.

``hscl-zoo train`` takes ``--config`` (a zoo name such as ``hscl-beta-cifar100``, for the config
shipped with the package, or a YAML file) and ``--key value`` settings (``hscl-zoo train --help``
lists every key). For several processes, launch the module:
``accelerate launch --multi_gpu --num_processes 2 -m hscl_zoo.cli train ...`` (on the CPU with
``ACCELERATE_USE_CPU=1`` the processes talk over gloo).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hscl_zoo._version import __version__
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.data.source_options import SourceOptions
from hscl_zoo.protocol import EVAL_DEFAULTS, METRICS, OUTPUTS
from hscl_zoo.cli_commands import (
    PROG,
    cmd_list,
    cmd_info,
    cmd_eval,
    cmd_embed,
    cmd_train,
    cmd_finetune,
    cmd_export,
    cmd_release,
    cmd_register,
    cmd_push,
    cmd_cards,
    run_eval,
)
from hscl_zoo.zoo.table import FORMATS

__all__ = ["main", "build_parser", "add_eval_options", "run_eval"]

DESCRIPTION = "The hscl-zoo command line; 'hscl-zoo COMMAND --help' describes each command."
EXAMPLES = """examples:
  hscl-zoo list 'hscl-*'                                 # zoo names and whether they are published
  hscl-zoo info hscl-beta-cifar10                        # one entry: repo, paper top-1, how to train it
  hscl-zoo train --epochs 2 --output_dir runs/digits     # the bundled digits, on the CPU in minutes
  hscl-zoo train --dataset imagefolder:photos/ --method hucl --epochs 20 --output_dir runs/photos
  hscl-zoo finetune runs/digits --dataset digits --epochs 5 --output_dir runs/digits-ft
  hscl-zoo eval runs/digits --out eval.json              # probe, kNN, retrieval, audit; JSON out
  hscl-zoo embed runs/digits photos/ --out photos.parquet
  hscl-zoo export runs/digits --format onnx --out exported/
  hscl-zoo train --dataset tu:MUTAG --method hscl-beta --beta 2 --output_dir runs/mutag   # graphs
  hscl-zoo release runs/c10 --name hscl-beta-cifar10.gpu-30ep    # a pinned release folder

MODEL: a zoo name, hf-hub:owner/name[@revision], local-dir:/path, or a model folder (a training
run's output_dir works: its model is in hub/). DATASET: a registered name (hscl-zoo eval --help
lists them), imagefolder:PATH, parquet:PATH or hf:owner/name."""
MODEL_HELP = ("a zoo name, hf-hub:owner/name[@revision], local-dir:/path, or a folder written by "
              "save_pretrained")
EXPORT_FORMATS = ("timm", "onnx", "torchscript")
_USER_ERRORS = (ValueError, OSError, LookupError, ImportError)


def add_eval_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``hscl-zoo eval`` (and of ``recipes/linear_eval.py``), all but the model."""
    parser.add_argument("--dataset", help=f"one of {', '.join(sorted(DATASETS))}, or imagefolder:PATH, parquet:PATH, "
                        "hf:owner/name (default: the model's training dataset); several, comma-separated, give "
                        "one transfer row each")
    parser.add_argument("--data_dir", help="local parquet folder (default: the training run's, else the Hub); with "
                        "several datasets, one per dataset, comma-separated (empty for the default)")
    parser.add_argument("--metrics", default=",".join(METRICS),
                        help=f"comma-separated, from {', '.join(METRICS)} (default: all)")
    parser.add_argument("--subset", type=int, help="class-balanced number of training images")
    parser.add_argument("--full_test", nargs="?", const=True, type=_true_false, metavar="true|false",
                        help="with --subset, keep the whole test split (bare: true, as on hscl-zoo train; default: "
                        "the run's)")
    parser.add_argument("--no-full_test", dest="full_test", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--labelled_fraction", type=float,
                        help="probe on this seeded, class-balanced part of the training labels (default: the run's)")
    parser.add_argument("--probe_epochs", type=int, help=f"default: the run's, else {EVAL_DEFAULTS['probe_epochs']}")
    parser.add_argument("--knn_k", type=int, help=f"default: the run's, else {EVAL_DEFAULTS['knn_k']}")
    parser.add_argument("--seed", type=int, help=f"subset and probe seed (default: the run's, else "
                        f"{EVAL_DEFAULTS['seed']})")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--out", type=Path, metavar="FILE.json", help="write the results here")
    add_source_options(parser)


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """The options of own data (imagefolder:, parquet:, hf:), as in ``hscl_zoo.data.SourceOptions``."""
    group = parser.add_argument_group("own data (imagefolder:PATH, parquet:PATH, hf:owner/name)")
    for key in ("image_column", "label_column", "train_split", "test_split"):
        group.add_argument(f"--{key}", help="default: guessed from the features (tables only)")
    group.add_argument("--test_fraction", type=float, default=SourceOptions.test_fraction,
                       help="part of each class held out when there is no test split (default: %(default)s)")
    group.add_argument("--skip_unreadable", nargs="?", const=True, default=False, type=_true_false,
                       metavar="true|false", help="leave out images that do not decode (bare: true; as on hscl-zoo "
                       "train)")


def _true_false(text: str) -> bool:
    """A command-line true/false value, read as ``hscl-zoo train`` reads one."""
    value = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
    if text.strip().lower() not in value:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value[text.strip().lower()]


def _command(
    subparsers: argparse._SubParsersAction, name: str, handler: Callable[[argparse.Namespace], int], summary: str
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=summary)
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (``main`` runs it)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cmd = _command(commands, "list", cmd_list, "List zoo names matching a wildcard: dataset, method, their own "
                   "score, the paper's and what they were trained with.")
    cmd.add_argument("pattern", nargs="?", default="*", metavar="PATTERN", help="shell wildcard (default: all)")
    cmd.add_argument("--published", action="store_true", help="only names whose weights can be loaded")
    cmd.add_argument("--format", choices=FORMATS, default="table",
                     help="an aligned table (default), CSV or JSON with every field")

    cmd = _command(commands, "info", cmd_info, "Show one zoo entry: method, dataset, repo, revision, scores.")
    cmd.add_argument("name", metavar="NAME", help="a zoo name, e.g. hscl-beta-cifar10")

    cmd = _command(commands, "eval", cmd_eval, "Linear probe, kNN, retrieval and audit of a frozen encoder, on its "
                   "own or other datasets (JSON out).")
    cmd.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    add_eval_options(cmd)
    cmd.add_argument("--folds", type=int, help="graph encoders (tu: datasets): folds of the SVM's and the linear "
                     "head's cross-validation (default 10)")

    cmd = _command(commands, "embed", cmd_embed, "Encode a folder of images or a dataset split to features.")
    cmd.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    cmd.add_argument("images", metavar="IMAGES",
                     help=f"a folder of image files (searched recursively), a dataset name "
                     f"({', '.join(sorted(DATASETS))}) or imagefolder:PATH, parquet:PATH, hf:owner/name")
    cmd.add_argument("--out", type=Path, required=True, metavar="FILE",
                     help=".npy (with FILE.ids.csv naming the rows) or .parquet (id columns + embedding)")
    cmd.add_argument("--projection", action="store_true", help="the L2-normalised projection head instead of the "
                     "pooled features")
    cmd.add_argument("--split", choices=("train", "test"), default="test", help="split of a dataset (default: test)")
    cmd.add_argument("--data_dir", help="local parquet folder of a dataset (default: the Hub)")
    cmd.add_argument("--batch_size", type=int, default=256)
    cmd.add_argument("--num_workers", type=int, default=0, help="DataLoader workers decoding images")
    cmd.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    add_source_options(cmd)

    train_summary = ("Pretrain an encoder and write its model folder (--help lists every --key with its default); "
                     "with --dataset tu:NAME, a graph encoder (hscl-zoo train --dataset tu:MUTAG --help).")
    commands.add_parser("train", help=train_summary, description=train_summary, add_help=False)

    finetune_summary = "Fine-tune an encoder into a classifier (--help lists every option)."
    commands.add_parser("finetune", help=finetune_summary, description=finetune_summary, add_help=False)

    cmd = _command(commands, "export", cmd_export, "Write the encoder as a timm folder, ONNX or TorchScript.")
    cmd.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    cmd.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    cmd.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write into")
    cmd.add_argument("--output", choices=OUTPUTS, help="what the onnx / torchscript graph computes (default: "
                     "features); written to DIR/OUTPUT.onnx or DIR/OUTPUT.pt with DIR/preprocess.json")

    cmd = _command(commands, "release", cmd_release, "Build a release folder (cast, sharded, re-evaluated) from a "
                   "finished run and print its registry entry.")
    cmd.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output_dir of a finished training run")
    cmd.add_argument("--name", required=True, help="<zoo name>.<tag>, the tag saying the budget, e.g. "
                     "hscl-beta-cifar10.gpu-30ep; a graph run at Table 2's budget takes the zoo name itself, "
                     "e.g. hscl-beta-mutag")
    cmd.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="stored precision (default: bf16 for "
                     "images; graphs stay fp32)")
    cmd.add_argument("--out", type=Path, help="folder to write (default: releases/NAME); must be empty or absent")
    cmd.add_argument("--max-shard-size", default="15MiB", help="largest weight file (default: 15MiB)")
    cmd.add_argument("--budget", help="what it was trained with, one sentence (default: from the run's config)")
    cmd.add_argument("--device", help="torch device of the re-evaluation (default: cuda if available, else cpu)")
    cmd.add_argument("--data_dir", help="graphs: the folder holding NAME/raw/ (default: as tu:NAME reads it)")
    cmd.add_argument("--selection", help="graphs: how the method's options were chosen, one phrase for the card")
    cmd.add_argument("--register", action="store_true", help="add the record to hscl_zoo/zoo/released.json "
                     "(the checkout's), publishing the release")

    cmd = _command(commands, "register", cmd_register, "Add image release folders built on another machine and "
                   "copied here to hscl_zoo/zoo/released.json as they stand, every file pinned by its sha256.")
    cmd.add_argument("folders", type=Path, nargs="+", metavar="FOLDER", help="releases/NAME, built by hscl-zoo release")

    cmd = _command(commands, "push", cmd_push, "Upload a release folder as it is, or check, rebuild and upload a "
                   "finished run's Hub folder.")
    cmd.add_argument("run_or_dir", type=Path, metavar="RUN_OR_DIR",
                     help="a release folder (releases/NAME, pushed to hscl-zoo/NAME as it is), the output_dir of a "
                     "training run (its hub/ folder is pushed) or a hub folder")
    cmd.add_argument("--repo-id", help="owner/name of the Hub model repo (required for a run; a release's default: "
                     "hscl-zoo/NAME)")
    cmd.add_argument("--name", help="zoo name for the card, e.g. hscl-beta-cifar10")
    cmd.add_argument("--out", type=Path, help="write the folder here instead of rebuilding it in place")
    cmd.add_argument("--private", action="store_true", help="create the repo private")
    cmd.add_argument("--dry-run", action="store_true", help="rebuild and check the folder, upload nothing")

    cmd = _command(commands, "cards", cmd_cards, "Write the zoo's model cards, or check they are up to date.")
    cmd.add_argument("--out", type=Path, default=Path("model_cards"), help="folder of cards (default: model_cards)")
    cmd.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on differences")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hscl-zoo`` with ``argv`` (default: the process arguments); returns the exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    passed_on = {"train": cmd_train, "finetune": cmd_finetune}
    if args.command not in passed_on and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return passed_on[args.command](args, rest) if args.command in passed_on else args.handler(args)
    except _USER_ERRORS as error:
        print(f"{PROG} {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
