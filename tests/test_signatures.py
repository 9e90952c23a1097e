"""The loop and the protocols take a state or settings object, not long lists (issue 55): read
with `ast` from the source, so a parameter added anywhere in hscl_zoo/ is counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from hscl_zoo.evaluation import EvalOptions
from hscl_zoo.probes import ProbeSettings, linear_probe

PACKAGE = Path(__file__).resolve().parents[1] / "hscl_zoo"
MAX_PARAMETERS = 12
AT_MOST_SIX = {"train_epochs", "train_epoch", "train_step", "evaluate_model", "linear_probe"}
MIRRORS_A_CONFIGURATION = {"BatchSimCLRAugment.__init__", "ContrastiveEncoder.__init__"}
"""Constructors whose parameters are a public configuration's keys, one each."""


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return count - bool(a.args and a.args[0].arg in ("self", "cls"))


def functions() -> dict[str, int]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for owner in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            prefix = f"{owner.name}." if isinstance(owner, ast.ClassDef) else ""
            for node in owner.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{path.relative_to(PACKAGE)}:{prefix}{node.name}"] = parameters(node)
    return found


def test_no_function_takes_a_long_list_of_parameters():
    counted = functions()
    long = {name: n for name, n in counted.items() if n > MAX_PARAMETERS
            and name.split(":")[1] not in MIRRORS_A_CONFIGURATION}
    assert long == {}, "gather the parameters into a settings or state object (hscl_zoo/training/state.py)"
    loop = {name: n for name, n in counted.items() if name.split(":")[1] in AT_MOST_SIX}
    assert len(loop) == len(AT_MOST_SIX) and max(loop.values()) <= 6, loop


def test_the_settings_objects_keep_the_keyword_options_users_pass():
    feats, labels = torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 3
    by_keywords = linear_probe(feats, labels, feats, labels, num_classes=3, epochs=2, lr=0.1, seed=1, progress=False)
    assert by_keywords.protocol["epochs"] == 2 and by_keywords.protocol["lr"] == 0.1
    with pytest.raises(TypeError, match=r"^linear_probe\(\) got an unexpected keyword argument 'epoch'$"):
        linear_probe(feats, labels, feats, labels, num_classes=3, epoch=2)
    assert ProbeSettings().epochs == 100 and EvalOptions().metrics == ("linear", "knn", "retrieval", "audit")
