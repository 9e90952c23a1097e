"""The gradient cache against the computation it replaces: one graph over the whole batch.

References: `direct` encodes every view at once; `chunked_reference` encodes chunk by chunk under
one graph (the same model where batch statistics or random draws depend on the chunking).
"""

from __future__ import annotations

import copy
import os
import socket
from datetime import timedelta
from functools import partial
from typing import NamedTuple

import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from timm.layers import GroupNorm
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import hscl_zoo
from hscl_zoo import build_loss, gradient_cache_backward, prepare_batchnorm

from threaded_ranks import run_ranks

B, V, SIZE = 6, 2, 8
LABELS = torch.tensor([0, 1, 0, 2, 1, 0])


class SmallNet(nn.Module):
    """Two convolutions and a projection; ``norm`` picks GroupNorm (no batch statistics) or BatchNorm."""

    def __init__(self, norm: str = "group", dropout: float = 0.0) -> None:
        super().__init__()
        make_norm = (lambda c: nn.GroupNorm(2, c)) if norm == "group" else nn.BatchNorm2d
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), make_norm(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1), make_norm(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_views(dtype=torch.float64, batch=B, seed=0) -> torch.Tensor:
    return torch.randn(batch, V, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def direct(model, loss_fn, views, labels, chunk_size) -> torch.Tensor:
    """One graph over the whole batch (``chunk_size`` unused)."""
    loss = loss_fn(model(views.flatten(0, 1)).view(*views.shape[:2], -1), labels)
    loss.backward()
    return loss.detach()


def chunked_reference(model, loss_fn, views, labels, chunk_size) -> torch.Tensor:
    flat = views.flatten(0, 1)
    z = torch.cat([model(chunk) for chunk in flat.split(chunk_size * views.shape[1])])  # chunk_size images
    loss = loss_fn(z.view(*views.shape[:2], -1), labels)
    loss.backward()
    return loss.detach()


def cached(model, loss_fn, views, labels, chunk_size) -> torch.Tensor:
    return gradient_cache_backward(model, loss_fn, views, labels, chunk_size=chunk_size)


def assert_grads_close(a: dict, b: dict, **tol) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tol)


class Run(NamedTuple):
    model: nn.Module
    loss: torch.Tensor
    rng_after: torch.Tensor


def run_both(make_model, reference, views, labels, chunk_size, loss_fn=None) -> tuple[Run, Run]:
    """``reference`` and the cache, each from the same weights and random state (default loss H-SCL(beta))."""
    loss_fn = loss_fn or build_loss("hscl-beta")
    runs = []
    for fn in (reference, cached):
        torch.manual_seed(1)
        model = make_model()
        torch.manual_seed(0)
        loss = fn(model, loss_fn, views, labels, chunk_size)
        runs.append(Run(model, loss, torch.get_rng_state()))
    return runs[0], runs[1]


TOLERANCES = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=1e-4, atol=1e-6)}


def assert_same_step(ref: Run, ours: Run, dtype: torch.dtype) -> None:
    assert not ours.loss.requires_grad
    torch.testing.assert_close(ours.loss, ref.loss, **TOLERANCES[dtype])
    assert_grads_close(grads(ours.model), grads(ref.model), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", [1, 5, B])
@pytest.mark.parametrize("loss_name,labels", [("hscl-beta", LABELS), ("ucl", None)])
def test_equals_one_big_batch_without_batch_statistics(dtype, chunk_size, loss_name, labels):
    views = make_views(dtype)
    ref, ours = run_both(lambda: SmallNet("group").to(dtype), direct, views, labels, chunk_size, build_loss(loss_name))
    assert_same_step(ref, ours, dtype)


def test_dropout_replays_the_same_masks_in_both_passes():
    views = make_views()
    make = lambda: SmallNet("group", dropout=0.5).double()  # noqa: E731
    probe = make()
    assert not torch.equal(probe(views[0]), probe(views[0])), "dropout must be active for this test to mean anything"
    hscl = build_loss("hscl-beta")

    def noisy_loss(features, labels):  # draws random numbers too, between the two passes
        return hscl(features + 1e-3 * torch.randn_like(features), labels)

    ref, ours = run_both(make, chunked_reference, views, LABELS, 2, noisy_loss)
    assert_same_step(ref, ours, torch.float64)
    assert torch.equal(ours.rng_after, ref.rng_after), "the generator should end where the reference leaves it"


def test_timm_resnet_with_stochastic_depth_float32():
    def make():
        return timm.create_model("resnet18", num_classes=8, norm_layer=partial(GroupNorm, num_groups=4),
                                 drop_path_rate=0.5)

    ref, ours = run_both(make, chunked_reference, make_views(torch.float32, batch=4), LABELS[:4], 3)
    assert_same_step(ref, ours, torch.float32)


def test_real_encoder_in_eval_mode_equals_one_big_batch_float32():
    def make():
        encoder = hscl_zoo.create_model("resnet18", num_classes=3, image_size=SIZE)
        return nn.Sequential(encoder.backbone, encoder.projector).eval()

    ref, ours = run_both(make, direct, make_views(torch.float32, batch=4), LABELS[:4], 3)
    assert_same_step(ref, ours, torch.float32)


def bn_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def test_per_chunk_batchnorm_equals_chunked_model_and_updates_running_stats_once():
    views = make_views()
    make = lambda: prepare_batchnorm(SmallNet("batch").double(), "per-chunk")  # noqa: E731
    initial = bn_state(make())
    ref, ours = run_both(make, chunked_reference, views, LABELS, 2)
    assert_same_step(ref, ours, torch.float64)
    state = bn_state(ours.model)
    assert_grads_close(state, bn_state(ref.model), rtol=1e-12, atol=0)
    assert int(state["features.1.num_batches_tracked"]) == 3  # 6 images in chunks of 2: one update per chunk, not two
    assert not torch.equal(state["features.1.running_mean"], initial["features.1.running_mean"])
    # What "per chunk" means: it is not the gradient of the model normalising the whole batch.
    big, _ = run_both(make, direct, views, LABELS, 2)
    assert not torch.allclose(grads(ours.model)["features.0.weight"], grads(big.model)["features.0.weight"], rtol=1e-3)


def test_sync_batchnorm_converts_and_in_one_process_normalises_per_chunk():
    views = make_views()
    plain = SmallNet("batch").double()
    assert prepare_batchnorm(plain, "per-chunk") is plain
    synced = prepare_batchnorm(copy.deepcopy(plain), "sync")
    kinds = {type(m) for m in synced.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    assert kinds == {nn.SyncBatchNorm}
    loss_fn = build_loss("hscl-beta")
    plain_loss = cached(plain, loss_fn, views, LABELS, 2)
    sync_loss = cached(synced, loss_fn, views, LABELS, 2)
    torch.testing.assert_close(sync_loss, plain_loss, rtol=1e-12, atol=0)
    assert_grads_close(grads(synced), grads(plain), rtol=1e-12, atol=0)
    assert_grads_close(bn_state(synced), bn_state(plain), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="per-chunk"):
        prepare_batchnorm(plain, "global")


def test_custom_backward_scales_the_whole_gradient():
    """A loss-scaling backward (as accelerator.backward under fp16) scales every parameter's gradient."""
    views = make_views()
    ref, _ = run_both(lambda: SmallNet("group").double(), direct, views, LABELS, 5)
    torch.manual_seed(1)
    scaled = SmallNet("group").double()
    loss = gradient_cache_backward(scaled, build_loss("hscl-beta"), views, LABELS, chunk_size=5,
                                   backward=lambda value: (1024.0 * value).backward())
    torch.testing.assert_close(loss, ref.loss, rtol=1e-12, atol=0)
    assert_grads_close(grads(scaled), {k: 1024.0 * g for k, g in grads(ref.model).items()}, rtol=1e-10, atol=1e-12)


def test_plain_function_with_module_restores_buffers_and_needs_module():
    views = make_views()
    model = SmallNet("batch").double()
    loss_fn = build_loss("scl")
    with pytest.raises(ValueError, match="module="):
        gradient_cache_backward(lambda x: model(x), loss_fn, views, LABELS, chunk_size=2)
    gradient_cache_backward(lambda x: model(x), loss_fn, views, LABELS, chunk_size=2, module=model)
    assert int(model.features[1].num_batches_tracked) == 3  # 6 images in chunks of 2


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(chunk_size=0), "positive integer"),
        (dict(chunk_size=-3), "positive integer"),
        (dict(chunk_size=2.0), "positive integer"),
        (dict(chunk_size=True), "positive integer"),
        (dict(chunk_size=7), r"exceeds the 6 images .*pass chunk_size <= 6"),
        (dict(chunk_size=4, views=torch.zeros(12, 3, SIZE, SIZE)), r"\(B, V, C, H, W\).*x.view"),
        (dict(chunk_size=4, encode=lambda m: (lambda x: m(x)[:, None])), r"\(n, d\) embeddings"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, match):
    kwargs = dict(kwargs)  # the parameter's dict is shared by every run of this case: pop from a copy
    model = SmallNet().double()
    encode = kwargs.pop("encode", lambda m: m)(model)
    views = kwargs.pop("views", make_views())
    with pytest.raises(ValueError, match=match):
        gradient_cache_backward(encode, build_loss("scl"), views, LABELS, module=model, **kwargs)


def test_error_messages_name_the_problem_and_the_fix():
    model, loss_fn, views = SmallNet().double(), build_loss("scl"), make_views()

    def message(encode, views, chunk_size=2, module=model) -> str:
        with pytest.raises(ValueError) as error:
            gradient_cache_backward(encode, loss_fn, views, LABELS, chunk_size=chunk_size, module=module)
        return str(error.value)

    assert message(lambda x: model(x), views, module=None) == (
        "encode is not an nn.Module: pass module=<the model encode runs> so that its buffers "
        "(BatchNorm running statistics) are updated once and DDP reduces gradients once.")
    fix = "for a flat (B*V, C, H, W) batch pass x.view(B, V, *x.shape[1:])."
    assert message(model, views.flatten(0, 1)) == f"views must be a (B, V, C, H, W) tensor (B images, V views each), got (12, 3, 8, 8); {fix}"
    assert message(model, [views]) == f"views must be a (B, V, C, H, W) tensor (B images, V views each), got list; {fix}"
    assert message(model, views, chunk_size=7) == (
        "chunk_size=7 exceeds the 6 images of this batch (of 2 views each): pass chunk_size <= 6 (a divisor "
        "of it keeps chunks equal), or call the loss directly, as a batch that fits in one chunk needs no cache.")
    assert message(lambda x: model(x)[:, None], views) == "encode must return (n, d) embeddings for n = 4 images, got (4, 1, 5)."
    assert message(lambda x: (model(x),), views) == "encode must return (n, d) embeddings for n = 4 images, got tuple."


def test_rng_helpers_save_cuda_generators_only_once_cuda_is_in_use():
    assert not torch.cuda.is_initialized(), "this host's tests never touch CUDA"
    cpu, cuda = hscl_zoo.training.gradient_cache._rng_state()
    assert torch.equal(cpu, torch.get_rng_state()) and cuda is None
    torch.rand(3)  # moves the generator on
    hscl_zoo.training.gradient_cache._set_rng_state((cpu, []))  # what a CUDA state list of no devices restores
    assert torch.equal(torch.get_rng_state(), cpu)


# ------------------------------------------------------------------------------------------ one process group

@pytest.fixture
def one_process_group():
    """torch.distributed initialised with one gloo process: DDP and the collectives run for real, in
    this process (the two-process test below spawns, which is slow and hidden from mutation testing)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _reduction_times(ddp: nn.parallel.DistributedDataParallel) -> tuple[list[int], list[int]]:
    """Hooks on a DDP model: forward passes so far, and the forward count at each gradient all-reduce."""
    forwards, reductions = [0], []
    ddp.module.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    def hook(state, bucket):
        reductions.append(forwards[0])
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    return forwards, reductions


@pytest.mark.parametrize("compiled", [False, True], ids=["ddp", "compiled-ddp"])
def test_ddp_reduces_gradients_once_after_the_last_chunk(one_process_group, compiled):
    views, loss_fn = make_views(), build_loss("hscl-beta")
    torch.manual_seed(1)
    reference = SmallNet("group").double()
    direct(reference, loss_fn, views, LABELS, None)
    torch.manual_seed(1)
    ddp = nn.parallel.DistributedDataParallel(SmallNet("group").double())
    forwards, reductions = _reduction_times(ddp)
    # torch.compile's wrapper is only searched for the DDP inside it (its `_orig_mod`), never run here.
    module = torch.compile(ddp) if compiled else ddp
    gradient_cache_backward(ddp, loss_fn, views, LABELS, chunk_size=2, module=module)
    assert forwards[0] == 6, "3 chunks of 2 images, encoded twice"
    assert reductions == [6], "one all-reduce, in the backward of the last chunk"
    assert_grads_close(grads(ddp.module), grads(reference), rtol=1e-10, atol=1e-12)


def test_chunk_counts_are_checked_where_the_forward_pass_communicates(one_process_group):
    reason = hscl_zoo.training.gradient_cache._lockstep_reason
    DDP = nn.parallel.DistributedDataParallel
    torch.manual_seed(1)
    assert reason(DDP(SmallNet("batch").double())) == "DDP broadcasting buffers"
    assert reason(torch.compile(DDP(SmallNet("batch").double()))) == "DDP broadcasting buffers"
    assert reason(DDP(SmallNet("batch").double(), broadcast_buffers=False)) is None
    assert reason(DDP(SmallNet("group").double())) is None  # no buffers to broadcast
    assert reason(SmallNet("batch").double()) is None  # BatchNorm without DDP: nothing communicates
    synced = prepare_batchnorm(SmallNet("batch").double(), "sync")
    assert reason(synced) == "SyncBatchNorm"
    assert reason(synced.eval()) is None  # running statistics: no collective
    # One process always agrees with itself: nothing is gathered.
    lockstep = hscl_zoo.training.gradient_cache._check_lockstep
    assert lockstep(DDP(SmallNet("batch").double()), 3, torch.device("cpu")) is None
    # Through the public function: BatchNorm under DDP, the step of the per-chunk BatchNorm model.
    views, loss_fn = make_views(), build_loss("hscl-beta")
    ref, _ = run_both(lambda: SmallNet("batch").double(), chunked_reference, views, LABELS, 2)
    torch.manual_seed(1)
    ddp = DDP(SmallNet("batch").double())
    torch.manual_seed(0)
    gradient_cache_backward(ddp, loss_fn, views, LABELS, chunk_size=2)
    assert_grads_close(grads(ddp.module), grads(ref.model), rtol=1e-10, atol=1e-12)


def test_ranks_with_unequal_chunk_counts_are_refused_before_encoding():
    """Two ranks (threads on torch's threaded process group) with SyncBatchNorm: 3 and 2 chunks of 2 images
    are refused on both, before any forward pass; equal counts are gathered and pass."""
    lockstep = hscl_zoo.training.gradient_cache._check_lockstep

    def rank(rank):
        model = prepare_batchnorm(SmallNet("batch").double(), "sync")
        calls = [0]
        model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        with pytest.raises(ValueError) as error:
            gradient_cache_backward(model, build_loss("scl"), make_views(batch=6 - 2 * rank), LABELS[: 6 - 2 * rank], chunk_size=2)
        return str(error.value), calls[0], lockstep(model, 3, torch.device("cpu")), lockstep(model.eval(), 3, torch.device("cpu"))

    for message, forwards, counts, eval_counts in run_ranks(2, rank):
        assert message.startswith("with SyncBatchNorm every process must encode the same number of chunks, got [3, 2] per rank")
        assert forwards == 0 and counts == [3, 3] and eval_counts is None


def test_chunk_counts_are_gathered_on_the_views_device_whatever_torchs_default_device():
    """The lockstep check gathers the chunk counts on the device of the views, not on torch's default device
    (set elsewhere, e.g. to "cuda" next to gloo's CPU tensors). Under a "meta" default, whose tensors hold no
    value, two SyncBatchNorm ranks of 3 and 2 chunks still get the refusal naming [3, 2], and equal counts
    are gathered as [3, 3]."""
    lockstep = hscl_zoo.training.gradient_cache._check_lockstep

    def rank(rank):
        model = prepare_batchnorm(SmallNet("batch").double(), "sync")
        loss_fn, views, labels = build_loss("scl"), make_views(batch=6 - 2 * rank), LABELS[: 6 - 2 * rank]
        with torch.device("meta"):
            with pytest.raises(ValueError) as error:
                gradient_cache_backward(model, loss_fn, views, labels, chunk_size=2)
            return str(error.value), lockstep(model, 3, views.device)

    for message, counts in run_ranks(2, rank):
        assert message.startswith("with SyncBatchNorm every process must encode the same number of chunks, got [3, 2] per rank")
        assert counts == [3, 3]


def test_unequal_chunk_counts_are_refused_with_the_fix():
    refuse = hscl_zoo.training.gradient_cache._refuse_unequal_chunks
    refuse([3, 3], "SyncBatchNorm")
    refuse([2], "SyncBatchNorm")
    with pytest.raises(ValueError) as error:
        refuse([2, 3, 3], "DDP broadcasting buffers")
    assert str(error.value) == (
        "with DDP broadcasting buffers every process must encode the same number of chunks, got [2, 3, 3] per rank: "
        "give every process the same number of images (drop_last=True) or a chunk_size that yields as many "
        "chunks on each (or DDP(broadcast_buffers=False) where that is meant).")


# ------------------------------------------------------------------------------------------ two processes

SIZES = (3, 5)  # images per process; in chunks of 2 images: 2 and 3 chunks
# GroupNorm: no collective in the forward pass, so unequal chunk counts are fine; BatchNorm under
# DDP broadcasts buffers in every forward pass, so the processes get as many images each.
DISTRIBUTED_CASES = [("group", SIZES), ("batch", (4, 4))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(sizes: tuple[int, ...], rank: int) -> slice:
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def _counting_hook(counter: list[int]):
    def hook(state, bucket):
        counter[0] += 1
        return allreduce_hook(state, bucket)
    return hook


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    try:
        results = {}
        views, labels = make_views(batch=sum(SIZES)), torch.arange(sum(SIZES)) % 3
        mine = _local(SIZES, rank)
        loss_fn = build_loss("hscl-beta")
        for norm, sizes in DISTRIBUTED_CASES:
            torch.manual_seed(1)
            model = nn.parallel.DistributedDataParallel(SmallNet(norm).double())
            calls = [0]
            model.register_comm_hook(None, _counting_hook(calls))
            part = _local(sizes, rank)
            loss = gradient_cache_backward(model, loss_fn, views[part], labels[part], chunk_size=2)
            results[norm] = (loss, grads(model.module), calls[0])
        for name, model in [("ddp-bn", nn.parallel.DistributedDataParallel(SmallNet("batch").double())),
                            ("syncbn", prepare_batchnorm(SmallNet("batch").double(), "sync"))]:
            try:
                gradient_cache_backward(model, loss_fn, views[mine], labels[mine], chunk_size=2)
                results[name] = "no error"
            except ValueError as error:
                results[name] = str(error)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes importing the package: about 45 s on the shared 2-core host
def test_two_processes_equal_one_process_on_the_global_batch(tmp_path):
    world = len(SIZES)
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    views, labels = make_views(batch=sum(SIZES)), torch.arange(sum(SIZES)) % 3
    for norm, sizes in DISTRIBUTED_CASES:
        torch.manual_seed(1)
        model = SmallNet(norm).double()
        # Batch statistics per (process, chunk): encode each process's images in its chunks.
        parts = [views[_local(sizes, r)].flatten(0, 1).split(4) for r in range(world)]
        z = torch.cat([model(chunk) for part in parts for chunk in part]).view(sum(sizes), V, -1)
        expected = build_loss("hscl-beta")(z, labels[: sum(sizes)])
        expected.backward()
        mean_loss = sum(r[norm][0] for r in ranks) / world
        torch.testing.assert_close(mean_loss, expected.detach(), rtol=1e-10, atol=0, msg=norm)
        for r in ranks:  # DDP averaged the gradients: every process holds the global batch's
            assert_grads_close(r[norm][1], grads(model), rtol=1e-9, atol=1e-12)
            assert r[norm][2] == 1, "only the last chunk's backward should all-reduce (one bucket)"
    for r in ranks:
        assert "DDP broadcasting buffers" in r["ddp-bn"] and "[2, 3]" in r["ddp-bn"]
        assert "SyncBatchNorm" in r["syncbn"] and "drop_last=True" in r["syncbn"]
