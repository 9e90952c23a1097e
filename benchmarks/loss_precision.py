"""Float32 precision of the five losses against the float64 loop reference, per temperature.

For each batch kind, temperature, case of `hscl_zoo.losses.reference.PRECISION_CASES` and positives
mode it feeds `build_loss(...)` a float32 batch and `reference_loss` its float64 copy, and records
the relative error of the value and of the gradient (max |error| / max |reference entry|) on the
path the loss picks (`last_path`). Batch kinds: `random` (Gaussian features), `distinct`
(trained-looking, UCL style: distinct images, two views 1e-3 apart, so psi is tiny with view
positives) and `tight` (trained-looking, SCL style: tight classes, so psi is tiny with label
positives). The table gives, per kind and temperature, the worst value / gradient error of each
case over both positives modes, marked (g) where the general path ran; the contract is 1e-4 / 1e-3.

    python benchmarks/loss_precision.py --json benchmarks/results/loss_precision_after.json   # the committed measurement
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hscl_zoo import build_loss
from hscl_zoo.losses.reference import PRECISION_CASES, random_batch, reference_value_and_grad, relative_errors, trained_batch
from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder

KINDS = {
    "random": lambda B, d, seed: random_batch(B, 2, d, 4, seed),
    "distinct": lambda B, d, seed: trained_batch(B, 2, d, 4, seed, spread=1.0),
    "tight": lambda B, d, seed: trained_batch(B, 2, d, 4, seed, spread=0.1),
}


def measure(kind: str, temperature: float, name: str, positives: str, args: argparse.Namespace) -> dict:
    method, kwargs, eta, tau_plus = PRECISION_CASES[name]
    features, labels = KINDS[kind](args.batch, args.dim, args.seed)
    reference, reference_grad = reference_value_and_grad(features, labels, method=method, positives=positives,
                                                         temperature=temperature, eta=eta(temperature), tau_plus=tau_plus)
    loss = build_loss(method, temperature=temperature, positives=positives, **kwargs)
    value_err, grad_err = relative_errors(loss, features, labels, reference, reference_grad)
    return dict(kind=kind, temperature=temperature, case=name, positives=positives, reference=reference.item(),
                value_rel_err=value_err, grad_rel_err=grad_err, path=getattr(loss, "last_path", None))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="random,distinct,tight")
    p.add_argument("--temperatures", default="0.03,0.05,0.07,0.1,0.2,0.5")
    p.add_argument("--batch", type=int, default=24, help="images per batch (V = 2); the loop reference is slow beyond ~32")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    args = p.parse_args(argv)
    commit = git_commit()
    kinds = args.kinds.split(",")
    temperatures = [float(t) for t in args.temperatures.split(",")]
    rows = [measure(kind, T, name, positives, args)
            for kind in kinds for T in temperatures for name in PRECISION_CASES for positives in ("views", "labels")]
    command = command_line(__file__, argv)
    print("# loss_precision: float32 vs float64 loop reference, relative error value / gradient (worst of both positives modes)")
    print(f"command: {command}")
    print(f"torch {torch.__version__}, B={args.batch}, V=2, d={args.dim}, 4 classes, seed {args.seed}")
    for kind in kinds:
        print(f"\n{kind} batches\n")
        print("| T | " + " | ".join(PRECISION_CASES) + " |")
        print("|---:|" + "---:|" * len(PRECISION_CASES))
        for T in temperatures:
            cells = []
            for name in PRECISION_CASES:
                mine = [r for r in rows if r["kind"] == kind and r["temperature"] == T and r["case"] == name]
                general = " (g)" if any(r["path"] == "general" for r in mine) else ""
                cells.append(f"{max(r['value_rel_err'] for r in mine):.1e} / {max(r['grad_rel_err'] for r in mine):.1e}{general}")
            print(f"| {T} | " + " | ".join(cells) + " |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(command=command, commit=commit, finished=utc_now(), machine=machine("cpu"),
                                             torch=torch.__version__, batch=args.batch, dim=args.dim, seed=args.seed,
                                             rows=rows), indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
