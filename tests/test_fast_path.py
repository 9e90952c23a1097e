"""The fast-path options give the plain path's loss (within tolerance): channels_last, torch.compile,
fused Adam, bf16 autocast, persistent workers / pinned copies, raw uint8 data + batched augment."""

from __future__ import annotations

import copy

import pytest
import torch

import hscl_zoo
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.data.transforms import eval_transform

SIZE = 8  # model inputs: small and fast on CPU
DIGITS_SIZE = 16
MEAN, STD = (0.3, 0.3, 0.3), (0.2, 0.2, 0.2)


def encoder(seed: int = 0, backbone: str = "resnet18") -> hscl_zoo.ContrastiveEncoder:
    torch.manual_seed(seed)
    return hscl_zoo.create_model(backbone, num_classes=4, image_size=SIZE, small_stem=True, mean=MEAN, std=STD)


def batch(b: int = 6, v: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b * v, 3, SIZE, SIZE, generator=gen), torch.randint(0, 3, (b,), generator=gen)


def loss_and_grads(model, loss_fn, views, labels, memory_format=torch.contiguous_format):
    model.zero_grad(set_to_none=True)
    z = model.project(views.contiguous(memory_format=memory_format)).view(labels.shape[0], -1, 128)
    loss = loss_fn(z, labels)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_grads_close(a: dict, b: dict, rtol: float, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("method", ["ucl", "hscl-beta"])
def test_channels_last_gives_the_same_loss_and_gradients(method):
    plain = encoder()
    fast = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    assert fast.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    loss_fn = hscl_zoo.build_loss(method)
    views, labels = batch()
    loss_a, grads_a = loss_and_grads(plain, loss_fn, views, labels)
    loss_b, grads_b = loss_and_grads(fast, loss_fn, views, labels, torch.channels_last)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-5)
    assert_grads_close(grads_b, grads_a, rtol=1e-3, atol=1e-4)


def test_fused_adam_takes_the_same_steps():
    """Same parameters, same gradient sequence: Adam(fused=True) lands where the default Adam does."""
    model = encoder()
    start = [p.detach().clone() for p in [*model.backbone.layer1.parameters(), *model.projector.parameters()]]
    gen = torch.Generator().manual_seed(0)
    # gradients of very different scales, as real ones are (eps matters for the small ones)
    grads = [[torch.randn(p.shape, generator=gen) * 10.0 ** float(torch.randint(-6, 1, (), generator=gen))
              for p in start] for _ in range(4)]
    results = []
    for fused in (False, True):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = torch.optim.Adam(params, lr=1e-3, weight_decay=1e-6, fused=fused)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            optimizer.step()
        results.append([p.detach() for p in params])
    unfused, fused = results
    assert all(not torch.equal(a, b) for a, b in zip(unfused, start))  # every tensor moved
    for a, b in zip(unfused, fused):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", ["hscl-tau", "hucl"])
def test_bf16_autocast_keeps_the_loss_in_float32_and_close(method):
    model = encoder(backbone="resnet10t")  # bf16 convolutions are slow on a CPU without bf16 instructions
    loss_fn = hscl_zoo.build_loss(method, **({"threshold": -0.1} if method == "hscl-tau" else {}))
    views, labels = batch(b=8)
    reference, _ = loss_and_grads(model, loss_fn, views, labels)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = model.project(views).view(8, -1, 128)
        assert z.dtype == torch.bfloat16  # the encoder did run in bf16
        loss = loss_fn(z, labels)
        loss.backward()  # inside the region, as training loops often do: the loss's backward stays float32
    assert loss.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    torch.testing.assert_close(loss.detach(), reference, rtol=2e-2, atol=2e-2)


def test_raw_data_with_identity_augment_gives_the_cpu_path_loss(digits):
    """Raw uint8 batches + BatchSimCLRAugment (random steps off) == the CPU transforms, same loss."""
    rows = digits.train.select(range(12))
    cfg = {"mean": MEAN, "std": STD, "input_size": (3, DIGITS_SIZE, DIGITS_SIZE)}
    cpu_views = torch.stack([eval_transform(cfg)(rows[i]["image"]) for i in range(12)])
    raw = RawImageDataset(rows, cache=True)
    augment = BatchSimCLRAugment(DIGITS_SIZE, mean=MEAN, std=STD, views=2, strength=0.0, blur=False, flip_p=0.0,
                                 grayscale_p=0.0, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    gpu_views = augment(raw.images)  # (12, 2, 3, S, S)
    torch.testing.assert_close(gpu_views[:, 0], cpu_views, atol=1e-5, rtol=0)
    labels = torch.as_tensor(raw.labels)
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet18", num_classes=4, image_size=DIGITS_SIZE, mean=MEAN, std=STD).eval()
    loss_fn = hscl_zoo.build_loss("scl")
    with torch.no_grad():
        cpu_loss = loss_fn(model.project(cpu_views.repeat_interleave(2, 0)).view(12, 2, -1), labels)
        gpu_loss = loss_fn(model.project(gpu_views.flatten(0, 1)).view(12, 2, -1), labels)
    torch.testing.assert_close(gpu_loss, cpu_loss, rtol=1e-5, atol=1e-5)


def test_persistent_workers_give_the_same_batches(digits):
    rows = digits.train.select(range(48))

    def epochs(**kw) -> list[list[torch.Tensor]]:
        raw = RawImageDataset(rows, label_positive=True, views=2, seed=1)
        loader = make_loader(raw, 8, seed=3, drop_last=True, **kw)
        out = []
        for epoch in (1, 2):
            loader.set_epoch(epoch)
            out.append([torch.cat([images.flatten(), index]) for images, _, index in loader])
        return out

    reference = epochs(num_workers=0)
    assert not torch.equal(torch.stack(reference[0]), torch.stack(reference[1]))  # epochs differ
    persistent = epochs(num_workers=2, persistent_workers=True)
    for a, b in zip(reference, persistent):
        assert all(torch.equal(x, y) for x, y in zip(a, b))



@pytest.mark.slow
def test_compiled_model_gives_the_same_loss_and_gradients():
    plain = encoder()
    compiled_module = copy.deepcopy(plain)
    compiled = torch.compile(compiled_module.project)
    loss_fn = hscl_zoo.build_loss("hscl-beta")
    views, labels = batch()
    loss_a, grads_a = loss_and_grads(plain, loss_fn, views, labels)
    z = compiled(views).view(labels.shape[0], -1, 128)
    loss_b = loss_fn(z, labels)
    loss_b.backward()
    grads_b = {n: p.grad for n, p in compiled_module.named_parameters() if p.grad is not None}
    torch.testing.assert_close(loss_b.detach(), loss_a, rtol=1e-4, atol=1e-4)
    assert_grads_close(grads_b, grads_a, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ucl", "hscl-beta", "hscl-tau"])
def test_compiled_loss_gives_the_same_value_and_gradient(method):
    loss_fn = hscl_zoo.build_loss(method, **({"threshold": -0.1} if method == "hscl-tau" else {}))
    compiled = torch.compile(loss_fn)
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(16, 2, 32, generator=gen)
    labels = torch.randint(0, 4, (16,), generator=gen)
    a = features.clone().requires_grad_(True)
    b = features.clone().requires_grad_(True)
    eager, fast = loss_fn(a, labels), compiled(b, labels)
    eager.backward()
    fast.backward()
    torch.testing.assert_close(fast, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6)
    assert a.grad.abs().sum() > 0  # a gradient that is really there
