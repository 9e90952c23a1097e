"""One process of a streamed pass, for tests/test_streaming.py under torchrun (gloo, CPU).

Each process streams its part of a parquet folder through `StreamLoader` for the given epochs and
writes the image keys it saw, per epoch, to OUT/rank_R.json. With --stop_after K it saves the
stream position after K batches of the last epoch and exits at once (its workers die with it);
--resume loads that position and finishes the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from torchvision.transforms import v2

from hscl_zoo.data.streaming import StreamingViews, StreamLoader, open_stream


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, nargs="+", default=[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--buffer", type=int, default=200)
    parser.add_argument("--stop_after", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    views = StreamingViews(open_stream(f"parquet:{args.data}"), v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]),
                           views=1, seed=args.seed, buffer_size=args.buffer, rank=rank, world_size=world)

    def all_have(mine: bool) -> bool:
        return int(accelerator.reduce(torch.tensor([int(mine)]), reduction="sum").item()) == world

    loader = StreamLoader(views, args.batch, num_workers=args.workers, all_have=all_have)
    state_file = out / f"position_{rank}.json"
    if args.resume:
        loader.load_state_dict(json.loads(state_file.read_text()))
    seen: dict[int, list[str]] = {}
    for epoch in args.epochs:
        loader.set_epoch(epoch)
        seen[epoch] = []
        for step, (batch_views, labels, index) in enumerate(loader, start=1):
            assert batch_views.shape == (args.batch, 1, 3, 32, 32) and labels.min() >= 0
            seen[epoch] += loader.keys
            if args.stop_after and epoch == args.epochs[-1] and step == args.stop_after:
                state_file.write_text(json.dumps(loader.state_dict()))
                (out / f"rank_{rank}.json").write_text(json.dumps(seen))
                accelerator.wait_for_everyone()
                os._exit(0)
    (out / f"rank_{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
