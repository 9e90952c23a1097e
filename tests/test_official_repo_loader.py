"""benchmarks/official_repo.py takes only the loss function out of a training script and removes
its `.cuda()` calls, nothing else; shown on a stand-in script with the official file's shape (a
top level that cannot run here, the function under its expected name and signature)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from official_repo import load_official_loss  # noqa: E402

STAND_IN = '''
import package_that_is_not_installed
raise SystemExit("the script's top level must not run")


def nce_supervised_hard(out_1, out_2, label, beta, gradient_imp=True):
    out = torch.cat([out_1, out_2], dim=0)
    mask = torch.ones((out.shape[0], out.shape[0])).cuda()
    scale = torch.tensor(beta).cuda().float()
    return (mask * (out @ out.t())).sum() * scale + 0 * label.sum()


def helper():
    return torch.zeros(1).cuda()
'''


def write_repo(tmp_path: Path, text: str) -> Path:
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "main.py").write_text(text)
    return tmp_path


def test_loads_the_function_without_running_the_script_and_strips_cuda(tmp_path):
    loss = load_official_loss(write_repo(tmp_path, STAND_IN), "cpu")
    assert loss.cuda_calls_removed == 2  # the function's two; helper() is not taken
    features = torch.randn(3, 2, 4)
    z = torch.nn.functional.normalize(features, dim=-1)
    out = torch.cat([z[:, 0], z[:, 1]])
    expected = (out @ out.T).sum() * 2.0
    torch.testing.assert_close(loss(features, torch.arange(3), 2.0), expected)
    assert loss.source == tmp_path / "main" / "main.py"


def test_on_cuda_the_function_is_left_as_written(tmp_path):
    assert load_official_loss(write_repo(tmp_path, STAND_IN), "cuda").cuda_calls_removed == 0


@pytest.mark.parametrize("text, message", [
    ("def other(out_1, out_2, label, beta):\n    return 0\n", "defines no top-level function nce_supervised_hard"),
    ("def nce_supervised_hard(x, y):\n    return 0\n", r"takes \['x', 'y'\]"),
])
def test_a_script_without_the_expected_function_is_refused(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_official_loss(write_repo(tmp_path, text))


def test_a_folder_without_the_script_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="rjiang03/H-SCL"):
        load_official_loss(tmp_path)
