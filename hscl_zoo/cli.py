"""The ``hscl-zoo`` command line: the zoo's entries, training, evaluation, embedding and export.

MODEL is anything ``hscl_zoo.load`` accepts: a zoo name, ``hf-hub:owner/name[@revision]``,
``local-dir:/path`` (a folder written by ``save_pretrained``, or a training run's output_dir) or
such a folder itself (offline for folders). Errors in the input exit with status 1 and one line
naming the problem; usage errors exit with status 2. Each command imports only what it runs:
``--help``, ``train --help``, ``list`` and ``info`` load no torch. A DATASET is a registered name
or your own data: ``imagefolder:PATH``, ``parquet:PATH`` or ``hf:owner/name``.
Graphs: ``train``, ``eval`` and ``embed`` take ``tu:NAME`` or ``tu:/path/NAME`` and graph-encoder
folders (``hscl_zoo.training.graph_recipe``; docs/graphs.md).

``hscl-zoo train`` takes ``--config`` (a zoo name such as ``hscl-beta-cifar100``, for the config
shipped with the package, or a YAML file) and ``--key value`` settings (``hscl-zoo train --help``
lists every key). For several processes, launch the module:
``accelerate launch --multi_gpu --num_processes 2 -m hscl_zoo.cli train ...`` (on the CPU with
``ACCELERATE_USE_CPU=1`` the processes talk over gloo).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hscl_zoo._version import __version__
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.data.source_options import SourceOptions, source_options
from hscl_zoo.protocol import EVAL_DEFAULTS, METRICS, OUTPUTS, check_metrics, top5_phrase
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.table import FORMATS, render, zoo_rows

if TYPE_CHECKING:
    import torch

__all__ = ["main", "build_parser", "add_eval_options", "run_eval"]

PROG = "hscl-zoo"
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


def _device(name: str | None) -> torch.device:
    import torch

    return torch.device(name if name else "cuda" if torch.cuda.is_available() else "cpu")


def _cmd_list(args: argparse.Namespace) -> int:
    if not registry.list_models(args.pattern):
        raise ValueError(f"no zoo name matches {args.pattern!r}; run 'hscl-zoo list' for all.")
    sys.stdout.write(render(zoo_rows(args.pattern, published_only=args.published), args.format))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    print(registry.info(args.name))
    return 0


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
    parser.add_argument("--full_test", action=argparse.BooleanOptionalAction,
                        help="with --subset, keep the whole test split (default: the run's)")
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


def _summary(result: dict[str, Any]) -> str:
    """One line of a result's headline scores."""
    parts = []
    if "top1" in result:
        top5 = top5_phrase(result["top5"], result["protocol"]["num_classes"])
        parts.append(f"linear-probe top-1 {result['top1']:.2f}%" + (f" {top5}" if top5 else ""))
    if "knn_top1" in result:
        parts.append(f"kNN top-1 {result['knn_top1']:.2f}%")
    if "retrieval" in result:
        retrieval = result["retrieval"]
        parts.append(f"Recall@1 {retrieval['recall_at_1']:.2f}% MAP@R {retrieval['map_at_r']:.2f}%")
    if "audit" in result:
        audit = result["audit"]
        parts.append(f"alignment {audit['alignment']:.3f} uniformity {audit['uniformity']:.3f} "
                     f"Assumption 1 {audit['assumption_fraction']:.3f}")
    return f"{result['dataset']}: " + ", ".join(parts)


def _split_list(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",")]


def run_eval(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate ``model`` with the options of :func:`add_eval_options`, print the scores and write
    ``--out``; returns the results (with several ``--dataset`` targets, :func:`evaluate_transfer`'s
    rows)."""
    from hscl_zoo.evaluation import evaluate_model, evaluate_transfer

    options = dict(subset=args.subset, full_test=args.full_test, labelled_fraction=args.labelled_fraction,
                   probe_epochs=args.probe_epochs, knn_k=args.knn_k, seed=args.seed,
                   metrics=check_metrics(m for m in _split_list(args.metrics) if m), device=_device(args.device),
                   **source_options(vars(args)))
    targets = _split_list(args.dataset)
    if targets is not None and len(targets) > 1:
        if not all(targets):
            raise ValueError(f"--dataset {args.dataset!r} has an empty name; separate datasets with single commas.")
        data_dirs = _split_list(args.data_dir)
        data_dirs = [d or None for d in data_dirs] if data_dirs is not None else None
        result = evaluate_transfer(model, targets, data_dirs=data_dirs, **options)
        for row in result["rows"]:
            print(_summary(row))
    else:
        result = evaluate_model(model, args.dataset, data_dir=args.data_dir, **options)
        print(_summary(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return result


def _cmd_eval(args: argparse.Namespace) -> int:
    from hscl_zoo.graphs.recipe import eval_command, is_graph_command

    if is_graph_command(args.model, args.dataset):
        eval_command(args)
        return 0
    if args.folds is not None:
        raise ValueError("--folds applies to graph encoders (tu: datasets); drop it for an image encoder.")
    run_eval(args.model, args)
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    from hscl_zoo.graphs.recipe import embed_command, is_graph_command

    if is_graph_command(args.model, args.images):
        embed_command(args)
        return 0
    from hscl_zoo.embedding import check_output_path, embed, save_embeddings
    from hscl_zoo.zoo.hub import load

    check_output_path(args.out)
    device = _device(args.device)
    model = load(args.model, device=device)
    embeddings = embed(model, args.images, projection=args.projection, split=args.split, data_dir=args.data_dir,
                       batch_size=args.batch_size, num_workers=args.num_workers, device=device,
                       **source_options(vars(args)))
    written = save_embeddings(embeddings, args.out)
    rows, dim = embeddings.features.shape
    print(f"embedded {rows} images to {dim}-d {'projections' if args.projection else 'features'}: "
          + ", ".join(str(p) for p in written))
    return 0


def _graph_dataset_given(settings: Sequence[str]) -> bool:
    """Whether the train settings name a ``tu:`` dataset (``--dataset tu:...`` or ``--dataset=tu:...``)."""
    for option, value in zip(settings, [*settings[1:], ""]):
        if option == "--dataset":
            return value.startswith("tu:")
        if option.startswith("--dataset="):
            return option.partition("=")[2].startswith("tu:")
    return False


def _cmd_train(args: argparse.Namespace, settings: Sequence[str]) -> int:
    if _graph_dataset_given(settings):
        from hscl_zoo.graphs.recipe import train_main

        train_main(list(settings), prog=f"{PROG} train")
        return 0

    if "-h" in settings or "--help" in settings:
        from hscl_zoo.config_help import build_train_parser

        build_train_parser(f"{PROG} train").parse_known_args(settings)  # prints the help, exits 0
    from hscl_zoo.training.pretrain import main as pretrain_main

    pretrain_main(list(settings), prog=f"{PROG} train")
    return 0


def _cmd_finetune(args: argparse.Namespace, settings: Sequence[str]) -> int:
    from hscl_zoo.training.finetune import main as finetune_main

    finetune_main(list(settings), prog=f"{PROG} finetune")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    if args.format == "timm" and args.output is not None:
        raise ValueError("--output applies to onnx and torchscript; a timm folder gives the logits, and the pooled "
                         "features with num_classes=0.")
    from hscl_zoo.export import export_onnx, export_timm, export_torchscript, timm_usage
    from hscl_zoo.zoo.hub import load

    output = args.output or "features"
    model = load(args.model, device="cpu")
    if args.format == "timm":
        written = export_timm(model, args.out)
        print(f"wrote {written}; open it in Python with:\n{timm_usage(written)}")
        return 0
    if args.format == "onnx":
        written = export_onnx(model, args.out / f"{output}.onnx", output)
    else:
        written = export_torchscript(model, args.out / f"{output}.pt", output)
    print(f"wrote {written} (images -> {output}) and {written.parent / 'preprocess.json'}")
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    from hscl_zoo.graphs.recipe import graph_model_folder
    from hscl_zoo.publishing.release import register_release, registry_entry_text

    command = shlex.join([PROG, *sys.argv[1:]]) if sys.argv[1:2] == ["release"] else None
    if graph_model_folder(str(args.run_dir / "hub")) is not None:
        from hscl_zoo.graphs.release import build_graph_release

        if args.dtype not in (None, "fp32"):
            raise ValueError(f"--dtype {args.dtype}: a graph encoder (a few hundred KB) is released in float32 as "
                             "trained; drop --dtype.")
        release = build_graph_release(args.run_dir, args.name, data_dir=args.data_dir, out=args.out,
                                      selection=args.selection, command=command)
        evaluation = release.evaluation
        print(f"wrote {release.folder} ({', '.join(sorted(release.entry['files']))}): SVM accuracy "
              f"{100 * evaluation['svm']['accuracy_mean']:.2f}% over {len(evaluation['svm']['folds'])} folds, head "
              f"accuracy {100 * evaluation['head_accuracy']:.2f}% on {evaluation['graphs']} graphs")
    else:
        from hscl_zoo.publishing.release import build_release

        if args.data_dir is not None or args.selection is not None:
            raise ValueError("--data_dir and --selection apply to graph runs; an image run's data is in its config.")
        release = build_release(args.run_dir, args.name, dtype=args.dtype or "bf16", out=args.out,
                                max_shard_size=args.max_shard_size, budget=args.budget, device=_device(args.device),
                                command=command)
        evaluation = release.evaluation
        print(f"wrote {release.folder} ({', '.join(sorted(release.entry['files']))}): {evaluation['stored_dtype']} "
              f"weights, linear top-1 {evaluation['linear_top1']:.2f}% (float32 run "
              f"{evaluation['float32_run']['top1']:.2f}%), kNN top-1 {evaluation['knn_top1']:.2f}% on "
              f"{evaluation['test_images']} {evaluation['test_split']} images")
    if args.register:
        print(f"registered {args.name} in {register_release(args.name, release.entry)}")
    else:
        print("its record for hscl_zoo/zoo/released.json (or rerun with --register):")
        print(registry_entry_text(args.name, release.entry))
    return 0


def _cmd_register(args: argparse.Namespace) -> int:
    from hscl_zoo.publishing.release import register_release, release_entry

    entries = {folder.name: release_entry(folder) for folder in args.folders}  # every folder checked before a write
    for name, entry in entries.items():
        print(f"registered {name} in {register_release(name, entry)}")
    return 0


def _cmd_push(args: argparse.Namespace) -> int:
    from hscl_zoo.publishing.hub_folder import push_hub_folder, rebuild_hub_folder
    from hscl_zoo.publishing.release import EVAL_NAME, push_release

    if (args.run_or_dir / EVAL_NAME).is_file():
        if args.dry_run or args.out or args.name:
            raise ValueError(f"{args.run_or_dir} is a release folder, uploaded exactly as it is: drop --dry-run, --out "
                             "and --name.")
        repo_id, revision = push_release(args.run_or_dir, args.repo_id, private=args.private or None)
        print(f"pushed {args.run_or_dir} to {repo_id}; pin it: \"revision\": \"{revision}\"")
        return 0
    if args.repo_id is None:
        raise ValueError(f"{args.run_or_dir} is a run, not a release folder: give --repo-id owner/name (or build a "
                         "release with hscl-zoo release).")

    folder = rebuild_hub_folder(args.run_or_dir, args.out, repo_id=args.repo_id, name=args.name)
    print(f"Hub-ready folder: {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")
    if args.dry_run:
        print(f"dry run: nothing uploaded to {args.repo_id}.")
        return 0
    result = push_hub_folder(folder, args.repo_id, private=args.private or None)
    print(f"pushed: {result.commit_url}")
    print(f"load it with hscl_zoo.load('hf-hub:{result.repo_id}@{result.revision}'); a zoo name needs a release: "
          "hscl-zoo release RUN_DIR --name NAME.TAG --register, then hscl-zoo push releases/NAME.TAG")
    return 0


def _cmd_cards(args: argparse.Namespace) -> int:
    from hscl_zoo.publishing import cards

    return cards.main(["--out", str(args.out)] + (["--check"] if args.check else []))


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

    cmd = _command(commands, "list", _cmd_list, "List zoo names matching a wildcard: dataset, method, their own "
                   "score, the paper's and what they were trained with.")
    cmd.add_argument("pattern", nargs="?", default="*", metavar="PATTERN", help="shell wildcard (default: all)")
    cmd.add_argument("--published", action="store_true", help="only names whose weights can be loaded")
    cmd.add_argument("--format", choices=FORMATS, default="table",
                     help="an aligned table (default), CSV or JSON with every field")

    cmd = _command(commands, "info", _cmd_info, "Show one zoo entry: method, dataset, repo, revision, scores.")
    cmd.add_argument("name", metavar="NAME", help="a zoo name, e.g. hscl-beta-cifar10")

    cmd = _command(commands, "eval", _cmd_eval, "Linear probe, kNN, retrieval and audit of a frozen encoder, on its "
                   "own or other datasets (JSON out).")
    cmd.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    add_eval_options(cmd)
    cmd.add_argument("--folds", type=int, help="graph encoders (tu: datasets): folds of the SVM's and the linear "
                     "head's cross-validation (default 10)")

    cmd = _command(commands, "embed", _cmd_embed, "Encode a folder of images or a dataset split to features.")
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

    cmd = _command(commands, "export", _cmd_export, "Write the encoder as a timm folder, ONNX or TorchScript.")
    cmd.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    cmd.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    cmd.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write into")
    cmd.add_argument("--output", choices=OUTPUTS, help="what the onnx / torchscript graph computes (default: "
                     "features); written to DIR/OUTPUT.onnx or DIR/OUTPUT.pt with DIR/preprocess.json")

    cmd = _command(commands, "release", _cmd_release, "Build a release folder (cast, sharded, re-evaluated) from a "
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

    cmd = _command(commands, "register", _cmd_register, "Add image release folders built on another machine and "
                   "copied here to hscl_zoo/zoo/released.json as they stand, every file pinned by its sha256.")
    cmd.add_argument("folders", type=Path, nargs="+", metavar="FOLDER", help="releases/NAME, built by hscl-zoo release")

    cmd = _command(commands, "push", _cmd_push, "Upload a release folder as it is, or check, rebuild and upload a "
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

    cmd = _command(commands, "cards", _cmd_cards, "Write the zoo's model cards, or check they are up to date.")
    cmd.add_argument("--out", type=Path, default=Path("model_cards"), help="folder of cards (default: model_cards)")
    cmd.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on differences")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hscl-zoo`` with ``argv`` (default: the process arguments); returns the exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    passed_on = {"train": _cmd_train, "finetune": _cmd_finetune}
    if args.command not in passed_on and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return passed_on[args.command](args, rest) if args.command in passed_on else args.handler(args)
    except _USER_ERRORS as error:
        print(f"{PROG} {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
