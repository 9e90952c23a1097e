"""What the first GPU run would trip on, checked on the CPU: the memory estimate and its refusal,
fp16's refusal, the image cache's shared-memory placement, SyncBatchNorm's decision and conversion,
TF32 kept out of the augmentation, the kNN monitor on decoded tensors, the optional kornia row."""

from __future__ import annotations

import copy
import json
import statistics
import importlib.util
import multiprocessing
from pathlib import Path

import pytest
import torch

from hscl_zoo.data.raw_images import (
    RawImageDataset,
    batches_in_flight_warning,
    cache_placement,
    workers_need_shared_memory,
)
from hscl_zoo.models import create_model
from helpers import load_script
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
    return load_script("benchmarks", name)


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


@pytest.mark.parametrize("device, processes, setting, expected", [
    ("cuda", 1, None, False), ("cuda", 4, None, True), ("cuda", 4, False, False),
    ("cpu", 2, None, False), ("cpu", 1, True, True),
])
def test_sync_batchnorm_decision(device, processes, setting, expected):
    assert PretrainConfig(sync_batchnorm=setting).device_plan(device, processes)["sync_batchnorm"] is expected


def test_sync_batchnorm_across_cpu_processes_is_refused():
    with pytest.raises(ValueError, match="GPUs only"):
        PretrainConfig(sync_batchnorm=True).device_plan("cpu", 2)


def test_diagnostics_cadence_per_device():
    assert PretrainConfig().device_plan("cpu", 1)["diagnostics_every"] == 10
    assert PretrainConfig().device_plan("cuda", 1)["diagnostics_every"] == 25
    assert PretrainConfig(diagnostics_every=3).device_plan("cuda", 1)["diagnostics_every"] == 3


def test_sync_batchnorm_conversion_keeps_the_function_in_one_process():
    """The recipe converts with `prepare_batchnorm(model, "sync")`; in one process SyncBatchNorm
    normalises like BatchNorm, so the step is unchanged."""
    from hscl_zoo.training.gradient_cache import prepare_batchnorm

    plain = small_network(8)
    synced = prepare_batchnorm(copy.deepcopy(plain), "sync")
    kinds = {type(m) for m in synced.modules()}
    assert torch.nn.SyncBatchNorm in kinds and not any(issubclass(k, torch.nn.modules.batchnorm._BatchNorm)
                                                       and k is not torch.nn.SyncBatchNorm for k in kinds)
    x = torch.randn(6, 3, 8, 8)
    torch.testing.assert_close(synced(x), plain(x))
    assert synced.state_dict().keys() == plain.state_dict().keys()


def test_memory_estimate_of_a_sync_batchnorm_model_under_a_process_group(tmp_path):
    """The recipe converts to SyncBatchNorm, then estimates memory, inside the process group every
    multi-GPU launch creates; SyncBatchNorm itself refuses the meta probe there."""
    import torch.distributed as dist

    from hscl_zoo.training.gradient_cache import prepare_batchnorm

    plain = small_network(8)
    synced = prepare_batchnorm(copy.deepcopy(plain), "sync")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="GPU"):  # what the probe met before it probed BatchNorm
            copy.deepcopy(synced).to("meta").train()(torch.zeros(2, 3, 8, 8, device="meta"))
        assert saved_activation_bytes(synced, 8) == saved_activation_bytes(plain, 8) > 0
    finally:
        dist.destroy_process_group()
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in synced.modules()), "the model itself was changed"


def test_exact_float32_matmul_overrides_tf32_and_restores_it(digits):
    from hscl_zoo.data.device_augment import BatchSimCLRAugment
    from hscl_zoo.data.device_ops import exact_float32_matmul

    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # what Accelerate's dynamo setting does on CUDA
        with exact_float32_matmul():
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"
        with pytest.raises(RuntimeError), exact_float32_matmul():
            raise RuntimeError
        assert torch.get_float32_matmul_precision() == "high"
        augment = BatchSimCLRAugment(8, mean=(0.5,) * 3, std=(0.5,) * 3, seed=0)
        views = augment(torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8))
        assert views.shape == (4, 2, 3, 8, 8) and torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(previous)


def test_double_compilation_is_guarded():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import TorchDynamoPlugin

    from hscl_zoo.training.setup import compiled_forward

    model = torch.nn.Linear(2, 2)
    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier in-process run may have set it up
    try:
        accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="inductor"))
        assert compiled_forward(model, accelerator, requested=True) is model
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True)
    try:
        assert compiled_forward(model, accelerator, requested=False) is model
        compiled = compiled_forward(model, accelerator, requested=True)
        assert compiled is not model and compiled._orig_mod is model
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_knn_monitor_on_decoded_tensors_equals_the_pil_path(digits):
    from hscl_zoo.training.monitoring import KnnMonitor

    cfg = PretrainConfig(monitor_train_size=300, monitor_test_size=200)
    torch.manual_seed(0)
    encoder = create_model("resnet18", num_classes=10, image_size=digits.spec.image_size, small_stem=True,
                           mean=digits.spec.mean, std=digits.spec.std)
    monitor = KnnMonitor(digits, cfg, torch.device("cpu"))
    assert monitor.images is not None and monitor.images[0].dtype == torch.uint8
    assert [len(x) for x in monitor.images] == [300, 200]
    on_tensors = monitor(encoder)
    monitor.images = None  # the per-call PIL path of splits with mixed image sizes
    assert monitor(encoder) == pytest.approx(on_tensors)
    assert encoder.training


def test_monitor_and_checkpoint_cadence_and_epoch_timing(tmp_path):
    from hscl_zoo.training.pretrain import main

    run = tmp_path / "run"
    result = main(["--subset", "100", "--batch_size", "32", "--probe_epochs", "1", "--monitor_train_size", "50",
                   "--epochs", "3", "--monitor_every", "2", "--checkpoint_every", "2", "--keep_checkpoints", "5",
                   "--output_dir", str(run)])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [("knn_top1" in r, "monitor_seconds" in r) for r in records] == [(False, False), (True, True), (True, True)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch_0002", "epoch_0003"]
    for r in records:
        assert r["wall_seconds"] >= r["epoch_seconds"] > 0
    assert result["views_per_second_after_epoch1"] == pytest.approx(
        statistics.median(r["views_per_second"] for r in records[1:]))


@pytest.mark.slow
def test_recipe_with_compile_trains_like_eager(tmp_path):
    """`compile: true` compiles the model and the device augmentation's kernels (the loss stays
    eager), on the device data path: the first epoch's loss matches the eager run's."""
    from hscl_zoo.training.pretrain import main

    tiny = ["--subset", "100", "--batch_size", "32", "--probe_epochs", "1", "--monitor_train_size", "50", "--epochs", "1",
            "--device_data", "true"]
    main([*tiny, "--output_dir", str(tmp_path / "eager")])
    main([*tiny, "--compile", "true", "--output_dir", str(tmp_path / "compiled")])
    loss = lambda run: json.loads((tmp_path / run / "metrics.jsonl").read_text())["train_loss"]  # noqa: E731
    assert loss("compiled") == pytest.approx(loss("eager"), rel=1e-3)


def test_batches_in_flight_through_shared_memory_warn_when_they_would_not_fit():
    """Workers hand their ready batches to the main process through /dev/shm: 16 workers x 2 batches
    of 512 CIFAR images x 2 float views (12 MiB each) need 384 MiB, which a 64 MiB container shm
    cannot hold; uint8 images for the device augmentation (1.5 MiB a batch) fit in 1 GiB."""
    views = 512 * 2 * 3 * 32 * 32 * 4
    warning = batches_in_flight_warning(views, num_workers=16, shm_free=64 * 2**20)
    assert warning is not None and "384 MiB" in warning and "--shm-size" in warning and "gpu_augment" in warning
    assert batches_in_flight_warning(512 * 3 * 32 * 32, num_workers=16, shm_free=2**30) is None
    assert batches_in_flight_warning(views, num_workers=0, shm_free=64 * 2**20) is None
    assert batches_in_flight_warning(views, num_workers=16, shm_free=None) is None
