"""Load the official H-SCL loss function from a local copy of its repository, for timing only.

The paper's code (github.com/rjiang03/H-SCL, not part of hscl_zoo and never committed here)
defines its H-SCL(beta) loss in its training script:

    main/main.py:  def nce_supervised_hard(out_1, out_2, label, beta, gradient_imp=True)

`out_1`, `out_2` are the two views' L2-normalised projections (B, d), `label` the (B,) labels;
it returns the mean loss over all (anchor, positive) pairs with M = 2B - 2 and the temperature
fixed at 0.5 (the script exponentiates 2 * cosine). Two versions of the file exist: one computes
the hardening weights with gradient for every beta, the other (for `gradient_imp=True`) only for
beta >= 1 and detached below. `loss_bench.py` checks which of hscl_zoo's `detach_weights`
settings the loaded function matches before timing it.

`load_official_loss(path, device)` takes the repository folder (or `main/main.py` itself) and
changes exactly this, nothing else:

1. Only the `nce_supervised_hard` definition is taken from the file (parsed with `ast`): the
   script's top level imports packages the loss never uses (POT, pandas, its data and model
   modules) and sets seeds and globals on import, so it is not executed.
2. On a CPU device every `.cuda()` call without arguments in that function is replaced by its
   receiver (`torch.zeros((n, n)).cuda()` becomes `torch.zeros((n, n))`); on a CUDA device the
   function is left exactly as written (its buffers go to the current CUDA device).
3. It runs in a fresh namespace holding the names the script imports at its top that are
   available here: `torch`, `nn`, `F` (torch.nn.functional), `np`.

The function body, its arithmetic and its Python loop over rows are executed as they are.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FUNCTION_NAME = "nce_supervised_hard"
SCRIPT = Path("main") / "main.py"
TEMPERATURE = 0.5
"""The temperature the official function hard-codes (it computes exp(2 * cosine))."""


@dataclass(frozen=True)
class OfficialLoss:
    """The loaded function and what was done to it."""

    fn: Callable[..., torch.Tensor]
    source: Path
    cuda_calls_removed: int

    def __call__(self, features: torch.Tensor, labels: torch.Tensor, beta: float) -> torch.Tensor:
        """H-SCL(beta) of `features` (B, 2, d), normalised first as the official model's forward does."""
        z = F.normalize(features, dim=-1)
        return self.fn(z[:, 0], z[:, 1], labels, beta, True)


class _StripCuda(ast.NodeTransformer):
    """Replaces `x.cuda()` (no arguments) by `x`, counting the replacements."""

    def __init__(self) -> None:
        self.removed = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and not node.args and not node.keywords:
            self.removed += 1
            return func.value
        return node


def script_path(path: str | Path) -> Path:
    """`main/main.py` inside a repository folder, or the file itself when a file is given."""
    path = Path(path).expanduser()
    script = path / SCRIPT if path.is_dir() else path
    if not script.is_file():
        raise FileNotFoundError(
            f"--official-repo {path}: no {SCRIPT} there. Pass the folder of a local clone of "
            "https://github.com/rjiang03/H-SCL (or its main/main.py).")
    return script


def load_official_loss(path: str | Path, device: str = "cpu") -> OfficialLoss:
    """`nce_supervised_hard` from the official script at `path`, with `.cuda()` removed on the CPU."""
    script = script_path(path)
    tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == FUNCTION_NAME]
    if not found:
        raise ValueError(f"{script} defines no top-level function {FUNCTION_NAME}(out_1, out_2, label, beta, "
                         "gradient_imp); is it the H-SCL repository's training script?")
    params = [arg.arg for arg in found[0].args.args]
    if params[:4] != ["out_1", "out_2", "label", "beta"]:
        raise ValueError(f"{script}: {FUNCTION_NAME} takes {params}, expected (out_1, out_2, label, beta, "
                         "gradient_imp); this loader knows only that signature.")
    stripper = _StripCuda()
    function = found[0] if device.startswith("cuda") else stripper.visit(found[0])
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace: dict[str, object] = {"torch": torch, "nn": nn, "F": F, "np": np, "__name__": "official_hscl"}
    exec(compile(module, str(script), "exec"), namespace)
    return OfficialLoss(fn=namespace[FUNCTION_NAME], source=script, cuda_calls_removed=stripper.removed)
