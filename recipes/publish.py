"""Package a finished run as a Hub model repo, and optionally push it.

    python recipes/publish.py --run runs/default                                  # check + rebuild runs/default/hub
    python recipes/publish.py --run runs/c10 --repo-id me/hscl-beta-cifar10 --push  # upload (token: HF_TOKEN)

The folder holds model.safetensors, config.json (architecture, preprocessing, training summary),
a model card README.md rendered from hscl_zoo.zoo.cards, and metrics.json. Before anything is written
the weights are loaded back strictly, so a broken run is refused. After a push, the way to load it
is printed; a zoo name is published with a release instead (``hscl-zoo release``, then ``push``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hscl_zoo.publishing.hub_folder import push_hub_folder, rebuild_hub_folder


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
    try:
        folder = rebuild_hub_folder(args.run, args.out or args.run / "hub", repo_id=args.repo_id, name=args.name)
    except (ValueError, OSError) as error:
        raise SystemExit(f"error: {error}") from error
    print(f"Hub-ready folder: {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")
    if args.push:
        result = push_hub_folder(folder, args.repo_id, private=args.private,
                                 commit_message=f"Upload {args.name or args.repo_id} from hscl_zoo")
        print(f"pushed: {result.commit_url}")
        print(f"load it with hscl_zoo.load('hf-hub:{result.repo_id}@{result.revision}')")
    return folder


if __name__ == "__main__":
    main()
