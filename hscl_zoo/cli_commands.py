"""What each ``hscl-zoo`` command does, once `hscl_zoo.cli` has parsed its arguments: list, info,
eval, embed, train, finetune, export, release, register, push and cards. Each imports only what it
runs, so ``hscl-zoo --help``, ``list`` and ``info`` load no torch.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hscl_zoo.data.source_options import source_options
from hscl_zoo.protocol import check_metrics, top5_phrase
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.table import render, zoo_rows

if TYPE_CHECKING:
    import torch

__all__ = ["PROG", "run_eval", "cmd_list", "cmd_info", "cmd_eval", "cmd_embed", "cmd_train", "cmd_finetune", "cmd_export", "cmd_release", "cmd_register", "cmd_push", "cmd_cards"]

PROG = "hscl-zoo"


def _device(name: str | None) -> torch.device:
    import torch

    return torch.device(name if name else "cuda" if torch.cuda.is_available() else "cpu")


def cmd_list(args: argparse.Namespace) -> int:
    if not registry.list_models(args.pattern):
        raise ValueError(f"no zoo name matches {args.pattern!r}; run 'hscl-zoo list' for all.")
    sys.stdout.write(render(zoo_rows(args.pattern, published_only=args.published), args.format))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    print(registry.info(args.name))
    return 0


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


def cmd_eval(args: argparse.Namespace) -> int:
    from hscl_zoo.graphs.recipe import eval_command, is_graph_command

    if is_graph_command(args.model, args.dataset):
        eval_command(args)
        return 0
    if args.folds is not None:
        raise ValueError("--folds applies to graph encoders (tu: datasets); drop it for an image encoder.")
    run_eval(args.model, args)
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
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


def cmd_train(args: argparse.Namespace, settings: Sequence[str]) -> int:
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


def cmd_finetune(args: argparse.Namespace, settings: Sequence[str]) -> int:
    from hscl_zoo.training.finetune import main as finetune_main

    finetune_main(list(settings), prog=f"{PROG} finetune")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
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


def cmd_release(args: argparse.Namespace) -> int:
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


def cmd_register(args: argparse.Namespace) -> int:
    from hscl_zoo.publishing.release import register_release, release_entry

    entries = {folder.name: release_entry(folder) for folder in args.folders}  # every folder checked before a write
    for name, entry in entries.items():
        print(f"registered {name} in {register_release(name, entry)}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
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


def cmd_cards(args: argparse.Namespace) -> int:
    from hscl_zoo.publishing import cards

    return cards.main(["--out", str(args.out)] + (["--check"] if args.check else []))
