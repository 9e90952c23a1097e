"""Views per second of the streaming data path against the map-style one, on the same parquet.

One run, side by side, with 1 and then 2 processes (spawned here, each its own CPU share, no
DataLoader workers, so a process's rate is one core's decode + augmentation rate):

* stream: `hscl_zoo.data.streaming` (``load_dataset("parquet", ..., streaming=True)``, reshard
  by row group, ``shuffle(seed, buffer_size=1000)``, ``split_dataset_by_node``), V=2 SimCLR views;
* map: the recipe's map-style path (``load_split`` into an Arrow table, `MultiViewDataset`, a
  ``DistributedSampler`` giving each process its rows), the same transform and views.

Each process times its pass from the first request to its last full batch (datasets' reader
threads then pause 5 s at the end of a stream pass, timed apart as ``pass_end_seconds``). A
side's views/s is all its views over the slowest process's seconds.

``decode_224`` times, in one process, the per-image work a 224 px ImageNet run asks of a data
worker: decode a JPEG of ImageNet's typical size (500x375, CIFAR-10 images upscaled and saved at
quality 90, since no ImageNet is here) and cut two 224 px SimCLR views from it.

    python benchmarks/stream_vs_map.py                     # writes benchmarks/results/stream_vs_map_cpu.json
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"
RESULT = ROOT / "benchmarks" / "results" / "stream_vs_map_cpu.json"
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _pass(side: str, folder: str, rank: int, world: int, args: dict[str, Any], queue: Any) -> None:
    import torch

    torch.set_num_threads(1)
    from hscl_zoo.data.transforms import simclr_transform

    transform = simclr_transform(32, mean=MEAN, std=STD)
    start = time.perf_counter()
    if side == "stream":
        from hscl_zoo.data.streaming import StreamingViews, StreamLoader, open_stream

        views = StreamingViews(open_stream(f"parquet:{folder}"), transform, views=args["views"], seed=0,
                               buffer_size=1000, rank=rank, world_size=world)
        batches = iter(StreamLoader(views, args["batch"]))
    else:
        from torch.utils.data import DataLoader, DistributedSampler

        from hscl_zoo.data.datasets import load_split
        from hscl_zoo.data.views import MultiViewDataset

        dataset = MultiViewDataset(load_split("cifar10", "train", folder), transform, views=args["views"], seed=0)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
        batches = iter(DataLoader(dataset, batch_size=args["batch"], sampler=sampler, drop_last=True))
    opened = time.perf_counter()
    images = 0
    for batch_views, _, _ in batches:
        images += batch_views.shape[0]
        last = time.perf_counter()
    ended = time.perf_counter()
    queue.put({"side": side, "rank": rank, "images": images, "views": images * args["views"],
               "open_seconds": opened - start, "seconds": last - opened, "pass_end_seconds": ended - last,
               "views_per_second": images * args["views"] / (last - opened)})


def run_side(side: str, folder: str, world: int, args: dict[str, Any]) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_pass, args=(side, folder, r, world, args, queue)) for r in range(world)]
    for p in processes:
        p.start()
    per_process = sorted((queue.get() for _ in processes), key=lambda r: r["rank"])
    for p in processes:
        p.join()
    seconds = max(r["seconds"] for r in per_process)
    views = sum(r["views"] for r in per_process)
    return {"side": side, "processes": world, "views": views, "seconds": seconds, "views_per_second": views / seconds,
            "per_process": per_process}


def decode_224(folder: Path, images: int) -> dict[str, Any]:
    import pyarrow.parquet as pq
    import torch
    from PIL import Image

    from hscl_zoo.data.transforms import simclr_transform

    torch.set_num_threads(1)
    rows = pq.read_table(folder / "train-00000-of-00001.parquet").slice(0, images)["img"].to_pylist()
    jpegs = []
    for row in rows:
        out = io.BytesIO()
        Image.open(io.BytesIO(row["bytes"])).convert("RGB").resize((500, 375), Image.BICUBIC).save(out, "JPEG", quality=90)
        jpegs.append(out.getvalue())
    transform = simclr_transform(224, mean=MEAN, std=STD)
    start = time.perf_counter()
    for data in jpegs:
        image = Image.open(io.BytesIO(data)).convert("RGB")
    decoded = time.perf_counter()
    for data in jpegs:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        transform(image), transform(image)
    ended = time.perf_counter()
    return {"images": images, "jpeg": "500x375 RGB, quality 90", "mean_jpeg_bytes": sum(map(len, jpegs)) / images,
            "decode_images_per_second": images / (decoded - start),
            "decode_and_two_views_images_per_second": images / (ended - decoded)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rows", type=int, default=4000, help="training rows streamed (the first ROWS of the file)")
    parser.add_argument("--row-group", type=int, default=500)
    parser.add_argument("--batch", type=int, default=100, help="batch per process")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--decode-images", type=int, default=200)
    parser.add_argument("--json", type=Path, default=RESULT)
    args = parser.parse_args()
    import pyarrow.parquet as pq

    settings = {"batch": args.batch, "views": args.views}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = args.data_dir / "train-00000-of-00001.parquet"
        pq.write_table(pq.read_table(source).slice(0, args.rows), folder / "train-00000-of-00001.parquet",
                       row_group_size=args.row_group)
        pq.write_table(pq.read_table(args.data_dir / "test-00000-of-00001.parquet").slice(0, 100),
                       folder / "test-00000-of-00001.parquet")
        runs = [run_side(side, str(folder), world, settings) for world in (1, 2) for side in ("stream", "map")]
        decode = decode_224(args.data_dir, args.decode_images)
    result = {"command": command_line("benchmarks/stream_vs_map.py", None), "git_commit": git_commit(), "date": utc_now(), "machine": machine(),
              "setting": {"dataset": "cifar10 (the JPEG copy in ../shared/data/cifar10)", "rows": args.rows,
                          "row_group": args.row_group, "image_size": 32, "views": args.views,
                          "batch_per_process": args.batch, "num_workers": 0, "torch_threads_per_process": 1,
                          "stream_buffer_size": 1000},
              "runs": runs, "decode_224": decode}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    for run in runs:
        rates = ", ".join(f"{r['views_per_second']:.0f}" for r in run["per_process"])
        print(f"{run['side']:6s} {run['processes']} process(es): {run['views_per_second']:.0f} views/s (per process {rates})")
    print(f"224 px: decode {decode['decode_images_per_second']:.0f} images/s, decode + 2 views "
          f"{decode['decode_and_two_views_images_per_second']:.0f} images/s per process")


if __name__ == "__main__":
    main()
