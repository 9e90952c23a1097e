"""Time and peak memory of `hscl_zoo.retrieval.retrieval_metrics` on random features.

One process per measurement: the peak resident memory of a fresh process (`ru_maxrss`) is what
the chunked ranking adds to the features themselves, which the result also states. The default
is the size the module promises to fit in CPU memory, 50,000 queries against 10,000 gallery
images (512-d features, 100 classes).

    python benchmarks/retrieval_bench.py --json benchmarks/results/retrieval_cpu.json
    python benchmarks/retrieval_bench.py --queries 10000 --gallery 50000 --device cuda
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from provenance import command_line, git_commit, machine, utc_now

from hscl_zoo.retrieval import retrieval_metrics


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=50_000)
    parser.add_argument("--gallery", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--max_chunk_bytes", type=int, default=256 * 2**20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(args.classes, args.dim, generator=generator)
    query_labels = torch.randint(0, args.classes, (args.queries,), generator=generator)
    gallery_labels = torch.randint(0, args.classes, (args.gallery,), generator=generator)
    query = centres[query_labels] + 3.0 * torch.randn(args.queries, args.dim, generator=generator)
    gallery = centres[gallery_labels] + 3.0 * torch.randn(args.gallery, args.dim, generator=generator)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    metrics = retrieval_metrics(query, query_labels, gallery, gallery_labels, max_chunk_bytes=args.max_chunk_bytes,
                                device=args.device)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    features_mib = (query.numel() + gallery.numel()) * 4 / 2**20
    result = {
        "benchmark": "retrieval_metrics",
        "command": command_line(__file__, argv),
        "queries": args.queries, "gallery": args.gallery, "dim": args.dim, "classes": args.classes,
        "max_chunk_bytes": args.max_chunk_bytes, "device": args.device,
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(peak / 1024, 1),
        "peak_rss_growth_during_call_mib": round((peak - before) / 1024, 1),
        "features_mib": round(features_mib, 1),
        "full_similarity_matrix_mib": round(args.queries * args.gallery * 8 / 2**20, 1),
        "metrics": metrics,
        "machine": machine(args.device), "commit": git_commit(), "date": utc_now(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
