"""Package a finished run as a Hub model repo, and optionally push it.

    python recipes/publish.py --run runs/default                                  # check + rebuild runs/default/hub
    python recipes/publish.py --run runs/c10 --repo-id me/hscl-beta-cifar10 --push  # upload (token: HF_TOKEN)

The folder holds model.safetensors, config.json (architecture, preprocessing, training summary),
a model card README.md rendered from hscl_zoo.zoo.cards, and metrics.json. Before anything is written
the weights are loaded back strictly, so a broken run is refused. After a push, the line to pin
the model in hscl_zoo/zoo/registry.py (repo, revision, sha256, metrics) is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import hscl_zoo
from hscl_zoo.training.publishing import METRICS_NAME, write_hub_folder
from hscl_zoo.zoo.hub import WEIGHTS_NAME, sha256_file


def build_folder(run: Path, out: Path, repo_id: str | None = None, name: str | None = None) -> Path:
    """Rebuild the Hub folder of a run (its `hub/` written by pretrain.py) into `out`."""
    source = run / "hub"
    if not (source / WEIGHTS_NAME).is_file():
        raise SystemExit(
            f"error: {run} has no finished model ({source / WEIGHTS_NAME} is missing). "
            f"Finish the run first: accelerate launch recipes/pretrain.py --output_dir {run} --resume"
        )
    try:
        model = hscl_zoo.load(f"local-dir:{source.resolve()}")
    except (ValueError, OSError) as error:
        raise SystemExit(f"error: {source} does not load back strictly, refusing to publish it: {error}") from error
    if not model.training_summary:
        raise SystemExit(f"error: {source / 'config.json'} has no training summary; publish folders written by "
                         "recipes/pretrain.py.")
    try:
        metrics = json.loads((source / METRICS_NAME).read_text())
        evaluation = metrics["evaluation"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"error: {source / METRICS_NAME} is missing or has no 'evaluation' block ({error!r}); "
                         "the run did not finish its linear probe.") from error
    return write_hub_folder(model, out, training=model.training_summary, evaluation=evaluation,
                            history=metrics.get("history"), name=name, repo_id=repo_id)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="Package a finished pretraining run for the Hugging Face Hub.")
    parser.add_argument("--run", required=True, type=Path, help="output_dir of recipes/pretrain.py")
    parser.add_argument("--out", type=Path, help="folder to write (default: <run>/hub, rebuilt in place)")
    parser.add_argument("--repo-id", help="owner/name of the Hub model repo (named in the card; needed for --push)")
    parser.add_argument("--name", help="zoo name for the card, e.g. hscl-beta-cifar10")
    parser.add_argument("--push", action="store_true", help="upload the folder (token from HF_TOKEN or the CLI login)")
    parser.add_argument("--private", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.push and not args.repo_id:
        parser.error("--push needs --repo-id owner/name.")
    folder = build_folder(args.run, args.out or args.run / "hub", args.repo_id, args.name)
    print(f"Hub-ready folder: {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")
    if args.push:
        from huggingface_hub import HfApi

        api = HfApi(token=os.environ.get("HF_TOKEN"))
        api.create_repo(args.repo_id, repo_type="model", private=args.private, exist_ok=True)
        commit = api.upload_folder(repo_id=args.repo_id, folder_path=folder, repo_type="model",
                                   commit_message=f"Upload {args.name or args.repo_id} from hscl_zoo")
        evaluation = json.loads((folder / METRICS_NAME).read_text())["evaluation"]
        print(f"pushed: {commit.commit_url}")
        print("pin it in hscl_zoo/zoo/registry.py:",
              json.dumps({"hub_repo": args.repo_id, "revision": commit.oid, "sha256": sha256_file(folder / WEIGHTS_NAME),
                          "metrics": {k: round(evaluation[k], 2) for k in ("top1", "top5", "knn_top1") if k in evaluation}}))
    return folder


if __name__ == "__main__":
    main()
