"""What the first GPU run would trip on, checked on the CPU: the memory estimate and its refusal,
fp16's refusal, the image cache's shared-memory placement, SyncBatchNorm's decision and conversion,
TF32 kept out of the augmentation, the kNN monitor on decoded tensors, the optional kornia row."""

from __future__ import annotations

import copy
import importlib.util
import multiprocessing
from pathlib import Path

import pytest
import torch

from hscl_zoo.data.raw_images import RawImageDataset, cache_placement, workers_need_shared_memory
from hscl_zoo.models import create_model
from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.training.resources import (
    MemoryEstimate,
    check_memory_fit,
    estimate_training_memory,
    saved_activation_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_network(size: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("resnet18", num_classes=4, image_size=size, small_stem=True).projection_network()


def real_saved_bytes(model: torch.nn.Module, size: int) -> float:
    """The same count with a real forward on the CPU, storages told apart by address."""
    seen: dict[int, int] = {}

    def pack(tensor):
        seen.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        return tensor

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(2, 3, size, size))
    return sum(n for ptr, n in seen.items() if ptr not in params) / 2


def test_activation_estimate_equals_a_real_forward_and_leaves_the_model_alone():
    model = small_network()
    before = copy.deepcopy(model.state_dict())
    estimated = saved_activation_bytes(model, 16)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "running statistics moved"
    assert estimated == pytest.approx(real_saved_bytes(copy.deepcopy(model), 16), rel=1e-6)
    assert saved_activation_bytes(model, 32) == pytest.approx(4 * estimated, rel=0.05)  # pixels x 4


def test_estimate_scales_with_the_pass_and_precision():
    model = small_network()
    kw = dict(image_size=16, local_views=512, global_views=1024, optimizer="adam")
    fp32 = estimate_training_memory(model, images_per_pass=512, mixed_precision="no", **kw)
    bf16 = estimate_training_memory(model, images_per_pass=512, mixed_precision="bf16", **kw)
    chunk = estimate_training_memory(model, images_per_pass=64, mixed_precision="no", **kw)
    assert bf16.activations == pytest.approx(fp32.activations / 2, rel=1e-6)
    assert chunk.activations == pytest.approx(fp32.activations / 8, rel=1e-6)
    n_params = sum(p.numel() for p in model.parameters())
    assert fp32.parameters == 16 * n_params  # weights, gradients, Adam's two moments, float32
    assert fp32.loss == 4 * 4 * 512 * 1024
    assert fp32.total == fp32.activations + fp32.parameters + fp32.loss


def test_memory_fit_refuses_warns_and_passes():
    estimate = MemoryEstimate(activations=40 * GIB, parameters=GIB, loss=GIB)
    with pytest.raises(ValueError, match=r"42\.0 GiB.*chunk_size.*batch_size"):
        check_memory_fit(estimate, 30 * GIB, setting="resnet50 at 64 px")
    warning = check_memory_fit(estimate, 45 * GIB, setting="resnet50 at 64 px")
    assert warning is not None and "93%" in warning and "chunk_size" in warning
    assert check_memory_fit(estimate, 80 * GIB, setting="x") is None


def test_fp16_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="gradient scaler would only skip a step.*bf16"):
        PretrainConfig(mixed_precision="fp16")


def test_cache_placement_decision():
    assert cache_placement(10**9, share=False, shm_free=0) == "private"
    assert cache_placement(10**9, share=False, shm_free=None) == "private"
    assert cache_placement(10**6, share=True, shm_free=10**7) == "shared"
    assert cache_placement(10**9, share=True, shm_free=64 * 2**20) == "none"  # a container's 64 MiB /dev/shm
    assert cache_placement(10**6, share=True, shm_free=None) == "none"
    assert workers_need_shared_memory(0) is False
    assert workers_need_shared_memory(2) is (multiprocessing.get_start_method() != "fork")


def test_cache_is_shared_only_when_asked(digits):
    rows = digits.train.select(range(20))
    private = RawImageDataset(rows, cache=True)
    assert private.cached and not private.images.is_shared()
    shared = RawImageDataset(rows, cache=True, share=True)
    assert shared.cached and shared.images.is_shared()
    assert torch.equal(shared.images, private.images)


def test_augment_bench_runs_with_or_without_kornia(capsys):
    bench = load_benchmark("train_throughput")
    bench.main(["--augment-bench", "--device", "cpu", "--batch-size", "4", "--rows", "8", "--repeats", "1",
                "--data-dir", str(ROOT / "no-such-folder")])
    out = capsys.readouterr().out
    assert "| torch (hscl_zoo.data.device_augment)" in out and "| CPU per-image pipeline" in out
    has_kornia = importlib.util.find_spec("kornia") is not None
    assert ("| kornia" in out) is has_kornia
    assert ("kornia is not installed" in out) is not has_kornia
