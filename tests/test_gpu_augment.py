"""hscl_zoo.data.device_augment / device_ops / raw_images: batched SimCLR views on the device, the raw
uint8 dataset. Runs on CPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from hscl_zoo.data.device_augment import BatchSimCLRAugment, spec_from_transform
from hscl_zoo.data.device_ops import color_jitter
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.raw_images import RawImageDataset, decode_image
from hscl_zoo.data.transforms import gaussian_blur, simclr_transform
from hscl_zoo.data.views import MultiViewDataset

MEAN = (0.5, 0.4, 0.3)
STD = (0.2, 0.25, 0.3)
N_STATS = 100_000
"""Draws per two-sample test of a random parameter (device-drawn against the CPU pipeline's own)."""
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
"""Where the parameters are drawn: the generator on the training device (the CPU here; a GPU too where one is)."""


def uint8_batch(b: int, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def normalise(x: torch.Tensor) -> torch.Tensor:
    return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def plain(size: int, **kw) -> BatchSimCLRAugment:
    """Every random step switched off unless re-enabled by ``kw``."""
    args = dict(mean=MEAN, std=STD, views=1, strength=0.0, blur=False, grayscale_p=0.0, flip_p=0.0,
                scale=(1.0, 1.0), ratio=(1.0, 1.0))
    args.update(kw)
    return BatchSimCLRAugment(size, **args)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance sup |F_a - F_b|."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def assert_rate(flags: torch.Tensor, p: float) -> None:
    n = flags.numel()
    rate = flags.float().mean().item()
    assert abs(rate - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / n) + 1e-9, (rate, p)


# ---------------------------------------------------------------- shapes, dtypes, determinism


def test_output_shape_dtype_and_normalisation():
    aug = BatchSimCLRAugment(24, mean=MEAN, std=STD, views=3)
    out = aug(uint8_batch(5))
    assert out.shape == (5, 3, 3, 24, 24) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    pixels = out * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5  # back in [0, 1] after undoing mean/std
    assert not torch.equal(out[:, 0], out[:, 1])  # views differ
    same = aug(uint8_batch(1).expand(5, -1, -1, -1))  # one image five times: per-sample parameters
    assert all(not torch.equal(same[0, 0], same[k, 0]) for k in range(1, 5))


def test_float_input_in_unit_range_equals_uint8_input():
    x = uint8_batch(4)
    aug = BatchSimCLRAugment(32, mean=MEAN, std=STD)
    params = aug.sample_params(8, 32, 32)
    torch.testing.assert_close(aug.apply(x, params), aug.apply(x.float() / 255, params), atol=1e-5, rtol=0)


def test_bad_inputs_are_refused():
    aug = BatchSimCLRAugment(16, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="B, 3, H, W"):
        aug(torch.zeros(2, 1, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        aug(torch.zeros(2, 3, 16, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="params has"):
        aug.apply(uint8_batch(2, 16, 16), aug.sample_params(3, 16, 16))
    with pytest.raises(ValueError, match="image_size"):
        BatchSimCLRAugment(0, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="std"):
        BatchSimCLRAugment(16, mean=MEAN, std=(1.0, 0.0, 1.0))


def test_same_seed_same_views_and_epochs_differ():
    x = uint8_batch(6)
    a = BatchSimCLRAugment(32, mean=MEAN, std=STD, seed=3)
    b = BatchSimCLRAugment(32, mean=MEAN, std=STD, seed=3)
    first_a, first_b = a(x), b(x)
    assert torch.equal(first_a, first_b)
    assert not torch.equal(a(x), first_a)  # the generator advances
    a.set_epoch(2)
    b.set_epoch(2)
    epoch2 = a(x)
    assert torch.equal(epoch2, b(x))
    a.set_epoch(2)
    assert torch.equal(a(x), epoch2)  # reseeding replays the epoch
    a.set_epoch(2, rank=1)
    assert not torch.equal(a(x), epoch2)  # another process, another stream
    a.set_epoch(3)
    assert not torch.equal(a(x), epoch2)
    gen = torch.Generator().manual_seed(11)
    via_gen = a(x, generator=gen)
    assert torch.equal(a(x, generator=torch.Generator().manual_seed(11)), via_gen)


def test_params_pack_losslessly_for_the_device_copy():
    from dataclasses import fields

    params = BatchSimCLRAugment(32, mean=MEAN, std=STD).sample_params(64, 32, 48)
    packed = params.pack()
    assert packed.shape == (64, 17)
    restored = type(params).unpack(packed)
    for field in fields(params):
        ours, theirs = getattr(restored, field.name), getattr(params, field.name)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), field.name
    assert params.to("cpu") is params
    half = params.index(slice(0, 32))
    assert len(half) == 32 and torch.equal(half.order, params.order[:32])


# ---------------------------------------------------------------- pixels against torchvision


def test_identity_settings_give_normalised_input():
    x = uint8_batch(4)
    out = plain(32)(x)[:, 0]
    torch.testing.assert_close(out, normalise(x.float() / 255), atol=1e-5, rtol=0)


@pytest.mark.parametrize("size", [20, 48])
def test_identity_settings_give_resize_and_normalise(size):
    x = uint8_batch(3)
    out = plain(size)(x)[:, 0]
    expected = normalise(TF.resize(x.float() / 255, [size, size], antialias=True))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_crop_and_flip_match_torchvision_resized_crop():
    x = uint8_batch(32, 32, 40)
    aug = plain(24, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip_p=0.5)
    params = aug.sample_params(32, 32, 40)
    out = aug.apply(x, params)[:, 0]
    assert params.flip.any() and not params.flip.all()
    assert (params.height > 24).any() and (params.height < 24).any()  # both shrinking and enlarging crops
    for k in range(32):
        box = [int(params.top[k]), int(params.left[k]), int(params.height[k]), int(params.width[k])]
        ref = TF.resized_crop(x[k].float() / 255, *box, [24, 24], antialias=True)
        if params.flip[k]:
            ref = TF.horizontal_flip(ref)
        torch.testing.assert_close(out[k], normalise(ref), atol=1e-5, rtol=0)


def test_colour_jitter_matches_torchvision_per_sample_order():
    aug = BatchSimCLRAugment(16, mean=MEAN, std=STD, views=1)
    x = torch.rand(96, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    x[0] = 0.5  # grey: hue undefined
    x[1, 0] = 1.0  # saturated channel, clamping
    params = aug.sample_params(96, 16, 16)
    out = color_jitter(x.clone(), params)
    ops = {
        0: lambda im, k: TF.adjust_brightness(im, params.brightness[k].item()),
        1: lambda im, k: TF.adjust_contrast(im, params.contrast[k].item()),
        2: lambda im, k: TF.adjust_saturation(im, params.saturation[k].item()),
        3: lambda im, k: TF.adjust_hue(im, params.hue[k].item()),
    }
    orders = {tuple(o) for o in params.order[params.jitter].tolist()}
    assert len(orders) > 8  # the order really varies per sample
    for k in range(96):
        expected = x[k]
        if params.jitter[k]:
            for op in params.order[k].tolist():
                expected = ops[op](expected, k)
        torch.testing.assert_close(out[k], expected, atol=1e-5, rtol=0)


def test_jitter_without_hue_range_skips_hue():
    aug = BatchSimCLRAugment(16, mean=MEAN, std=STD, views=1, _jitter_ranges={"brightness": (0.5, 1.5)})
    x = torch.rand(16, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    params = aug.sample_params(16, 16, 16)
    params.jitter[:] = True
    out = color_jitter(x.clone(), params, hue=False)
    expected = (x * params.brightness[:, None, None, None]).clamp(0, 1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_grayscale_and_blur_match_cpu_kernels():
    x = uint8_batch(16)
    aug = plain(32, grayscale_p=0.5, blur=True, blur_p=0.5)
    params = aug.sample_params(16, 32, 32)
    assert params.grayscale.any() and params.blur.any() and not params.blur.all()
    out = aug.apply(x, params)[:, 0]
    for k in range(16):
        ref = x[k].float() / 255
        if params.grayscale[k]:
            ref = TF.rgb_to_grayscale(ref, num_output_channels=3)
        if params.blur[k]:
            ref = gaussian_blur(ref, aug.blur_kernel, params.sigma[k].item())
        torch.testing.assert_close(out[k], normalise(ref), atol=1e-5, rtol=0)


def test_five_dimensional_input_gives_one_view_per_image():
    x = torch.stack([uint8_batch(3, seed=1), uint8_batch(3, seed=2)], dim=1)  # (3, 2, 3, 32, 32)
    out = plain(32, views=7)(x)
    assert out.shape == (3, 2, 3, 32, 32)
    torch.testing.assert_close(out, normalise(x.float() / 255), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- parameters against the CPU pipeline


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"strength": 0.5}, {"blur": False}, {"scale": (0.2, 1.0), "blur_p": 0.3}, {"strength": 0.0}],
)
def test_ranges_and_probabilities_equal_the_cpu_pipeline(kwargs):
    cpu = simclr_transform(32, mean=MEAN, std=STD, **kwargs)
    gpu = BatchSimCLRAugment(32, mean=MEAN, std=STD, **kwargs)
    cpu_spec, gpu_spec = spec_from_transform(cpu), gpu.spec()
    assert cpu_spec.keys() == gpu_spec.keys()
    for key, value in cpu_spec.items():
        if isinstance(value, tuple):
            assert gpu_spec[key] == pytest.approx(value, abs=1e-6), key
        else:
            assert gpu_spec[key] == value, key
    assert BatchSimCLRAugment.from_transform(cpu).spec() == gpu_spec


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(32, 32), (32, 48)])
def test_crop_parameters_follow_the_cpu_distribution(shape, device):
    height, width = shape
    cpu = simclr_transform(32, mean=MEAN, std=STD)
    crop = next(t for t in cpu.transforms if isinstance(t, v2.RandomResizedCrop))
    image = torch.zeros(3, height, width, dtype=torch.uint8)
    torch.manual_seed(0)
    boxes = np.array([[p["top"], p["left"], p["height"], p["width"]] for p in
                      (crop.make_params([image]) for _ in range(N_STATS))], dtype=np.float64)
    params = BatchSimCLRAugment.from_transform(cpu, seed=1, generator_device=device).sample_params(N_STATS, height, width)
    ours = torch.stack([params.top, params.left, params.height, params.width], 1).double().cpu().numpy()
    for boxes_ in (boxes, ours):  # every crop lies inside the image
        assert (boxes_[:, 0] >= 0).all() and (boxes_[:, 0] + boxes_[:, 2] <= height).all()
        assert (boxes_[:, 1] >= 0).all() and (boxes_[:, 1] + boxes_[:, 3] <= width).all()
    area = lambda b: b[:, 2] * b[:, 3] / (height * width)  # noqa: E731
    aspect = lambda b: b[:, 3] / b[:, 2]  # noqa: E731
    # area fraction in [0.08, 1] and aspect in [3/4, 4/3] up to integer rounding of the sides
    assert area(ours).min() >= 0.08 * 0.8 and area(ours).max() <= 1.0
    assert aspect(ours).min() >= 0.75 * 0.85 and aspect(ours).max() <= 4 / 3 / 0.85
    critical = 2.0 * math.sqrt(2 / N_STATS)  # KS distance at p ~ 1e-3 for two samples of N_STATS
    for stat in (area, aspect, lambda b: b[:, 0] / height, lambda b: b[:, 1] / width):
        assert ks_statistic(stat(boxes), stat(ours)) < critical
    assert abs(area(ours).mean() - area(boxes).mean()) < 0.01


@pytest.mark.parametrize("device", DEVICES)
def test_jitter_factors_and_order_follow_the_cpu_distribution(device):
    cpu = simclr_transform(32, mean=MEAN, std=STD)
    apply = next(t for t in cpu.transforms if isinstance(t, v2.RandomApply))
    jitter = apply.transforms[0]
    torch.manual_seed(0)
    draws = [jitter.make_params([torch.zeros(3, 8, 8)]) for _ in range(N_STATS)]
    params = BatchSimCLRAugment.from_transform(cpu, seed=2, generator_device=device).sample_params(N_STATS, 32, 32)
    params = params.to("cpu")
    critical = 2.0 * math.sqrt(2 / N_STATS)
    for key in ("brightness", "contrast", "saturation", "hue"):
        cpu_values = np.array([d[f"{key}_factor"] for d in draws])
        ours = getattr(params, key).numpy()
        low, high = getattr(jitter, key)
        assert ours.min() >= low and ours.max() <= high
        assert ours.min() < low + 0.01 * (high - low) and ours.max() > high - 0.01 * (high - low)
        assert ks_statistic(cpu_values, ours) < critical, key
    cpu_orders = torch.stack([d["fn_idx"] for d in draws])
    for step in range(4):  # each operation is at each step a quarter of the time, as on the CPU
        for op in range(4):
            ours = (params.order[:, step] == op).float().mean().item()
            theirs = (cpu_orders[:, step] == op).float().mean().item()
            assert abs(ours - 0.25) < 0.02 and abs(ours - theirs) < 0.025
    assert torch.equal(params.order.sort(dim=1).values, torch.arange(4).expand(N_STATS, 4))


def test_step_rates_and_sigma_follow_the_cpu_pipeline():
    cpu = simclr_transform(32, mean=MEAN, std=STD)
    spec = spec_from_transform(cpu)
    params = BatchSimCLRAugment.from_transform(cpu, seed=3).sample_params(N_STATS, 32, 32)
    assert spec["flip_p"] == 0.5 and spec["jitter_p"] == 0.8 and spec["grayscale_p"] == 0.2
    assert_rate(params.flip, spec["flip_p"])
    assert_rate(params.jitter, spec["jitter_p"])
    assert_rate(params.grayscale, spec["grayscale_p"])
    assert_rate(params.blur, spec["blur_p"])
    low, high = spec["blur_sigma"]
    sigma = params.sigma.numpy()
    assert sigma.min() >= low and sigma.max() <= high
    uniform = np.random.default_rng(0).uniform(low, high, N_STATS)  # what RandomGaussianBlur draws
    assert ks_statistic(sigma, uniform) < 2.0 * math.sqrt(2 / N_STATS)
    # the decisions are independent of each other (the CPU draws them separately)
    both = (params.flip & params.grayscale).float().mean().item()
    assert abs(both - spec["flip_p"] * spec["grayscale_p"]) < 0.015


class Recorder(torch.nn.Module):
    """Stands in for the jitter inside the CPU pipeline's RandomApply: counts the times RandomApply's
    own draw chose to apply it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, *inputs):
        self.calls += 1
        return inputs[0] if len(inputs) == 1 else inputs


def two_proportions_z(hits_a: int, hits_b: int, n: int) -> float:
    pooled = (hits_a + hits_b) / (2 * n)
    return abs(hits_a - hits_b) / n / math.sqrt(max(pooled * (1 - pooled), 1e-12) * 2 / n)


@pytest.mark.parametrize("device", DEVICES)
def test_step_decisions_and_sigma_match_the_cpu_pipelines_own_draws(device, monkeypatch):
    """The CPU pipeline's transforms decide for themselves (flip, RandomApply of the jitter,
    grayscale, blur and its sigma); each of N_STATS outcomes is read off a marker image or the blur
    call, and compared with the device-drawn parameters by a two-sample test."""
    import copy

    import hscl_zoo.data.transforms as transforms
    from torchvision import tv_tensors

    cpu = simclr_transform(32, mean=MEAN, std=STD)
    flip = next(t for t in cpu.transforms if isinstance(t, v2.RandomHorizontalFlip))
    grayscale = next(t for t in cpu.transforms if isinstance(t, v2.RandomGrayscale))
    apply = copy.deepcopy(next(t for t in cpu.transforms if isinstance(t, v2.RandomApply)))
    apply.transforms = torch.nn.ModuleList([Recorder()])
    blur = next(t for t in cpu.transforms if type(t).__name__ == "RandomGaussianBlur")
    sigmas: list[float] = []
    real_blur = transforms.gaussian_blur
    monkeypatch.setattr(transforms, "gaussian_blur", lambda image, k, sigma: (sigmas.append(sigma), image)[1])
    marker = tv_tensors.Image(torch.tensor([[[0, 255]], [[10, 20]], [[200, 30]]], dtype=torch.uint8))
    torch.manual_seed(0)
    flips = grays = 0
    for _ in range(N_STATS):
        flips += int(flip(marker)[0, 0, 0] == 255)
        out = grayscale(marker)
        grays += int(out[0, 0, 1] == out[1, 0, 1] == out[2, 0, 1])
        apply(marker)
        blur(marker.float())
    monkeypatch.setattr(transforms, "gaussian_blur", real_blur)
    cpu_counts = {"flip": flips, "jitter": apply.transforms[0].calls, "grayscale": grays, "blur": len(sigmas)}
    params = BatchSimCLRAugment.from_transform(cpu, seed=4, generator_device=device).sample_params(N_STATS, 32, 32)
    params = params.to("cpu")
    for step, hits in cpu_counts.items():
        ours = int(getattr(params, step).sum())
        assert two_proportions_z(ours, hits, N_STATS) < 4.5, (step, ours, hits)
    assert ks_statistic(params.sigma[params.blur].numpy(), np.array(sigmas)) < 2.0 * math.sqrt(2 / len(sigmas))
    # a wrong rate is caught: the flip drawn at 0.48 instead of 0.5
    assert two_proportions_z(int(0.48 * N_STATS), flips, N_STATS) > 4.5


def test_disabled_steps_are_never_drawn():
    params = BatchSimCLRAugment(32, mean=MEAN, std=STD, strength=0.0, blur=False).sample_params(2000, 32, 32)
    assert not params.jitter.any() and not params.blur.any()


# ---------------------------------------------------------------- the raw dataset


@pytest.fixture(scope="module")
def small_train(digits):
    return digits.train.select(range(40))


def test_decode_image_formats():
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert torch.equal(decode_image(Image.fromarray(rgb)), torch.from_numpy(rgb).permute(2, 0, 1))
    gray = decode_image(Image.fromarray(rgb[..., 0]))
    assert gray.shape == (3, 5, 7) and torch.equal(gray[0], gray[2])
    assert torch.equal(decode_image(rgb), torch.from_numpy(rgb).permute(2, 0, 1))
    with pytest.raises(TypeError, match="decode"):
        decode_image("not an image")


def test_raw_dataset_items_and_cache(small_train):
    raw = RawImageDataset(small_train)
    cached = RawImageDataset(small_train, cache=True)
    assert cached.cached and cached.images.shape[0] == 40 and cached.images.dtype == torch.uint8
    assert not cached.images.is_shared()  # shared only on request (share=True), see test_cuda_readiness
    for i in (0, 17, 39):
        image, label, index = raw[i]
        assert image.dtype == torch.uint8 and image.shape[0] == 3 and index == i
        assert torch.equal(image, decode_image(small_train[i]["image"]))
        assert label == small_train[i]["label"]
        assert torch.equal(cached[i][0], image) and cached[i][1:] == (label, i)
    batch = cached.__getitems__([3, 0, 39])
    assert [b[2] for b in batch] == [3, 0, 39]
    assert all(torch.equal(b[0], raw[b[2]][0]) for b in batch)
    with pytest.raises(IndexError):
        raw[40]
    with pytest.raises(IndexError):
        cached.__getitems__([0, 40])


def test_raw_dataset_label_positive_sources_match_multiview(small_train):
    raw = RawImageDataset(small_train, label_positive=True, views=3, seed=5)
    reference = MultiViewDataset(small_train, lambda im: im, views=3, label_positive=True, seed=5)
    for epoch in (1, 2):
        raw.set_epoch(epoch)
        reference.set_epoch(epoch)
        for i in (0, 9, 31):
            images, label, index = raw[i]
            sources = reference.view_sources(i)
            assert images.shape[0] == 3 and index == i and sources[0] == i
            for v, src in enumerate(sources):
                assert torch.equal(images[v], raw._image(src))
                assert int(raw.labels[src]) == label


def test_raw_loader_batches_feed_the_augmenter(small_train):
    raw = RawImageDataset(small_train, cache=True)
    loader = make_loader(raw, 8, seed=0, drop_last=True)
    loader.set_epoch(1)
    images, labels, index = next(iter(loader))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.uint8
    assert torch.equal(images, raw.images[index])
    views = BatchSimCLRAugment(16, mean=MEAN, std=STD)(images)
    assert views.shape == (8, 2, 3, 16, 16) and torch.isfinite(views).all()


def view_statistics(views: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-view luminance, contrast, saturation quantiles and the grey fraction of (n, 3, H, W) views in [0, 1]."""
    saturation = (views.amax(1) - views.amin(1)).mean((1, 2))
    q = lambda t: np.quantile(t.numpy(), [0.1, 0.5, 0.9])  # noqa: E731
    return {
        "luminance": q(views.mean((1, 2, 3))),
        "contrast": q(views.std((1, 2, 3))),
        "saturation": q(saturation),
        "grey": np.array([(saturation < 0.01).float().mean().item()]),
    }


@pytest.fixture(scope="module")
def cifar_rows_and_cpu_statistics(shared_data):
    from hscl_zoo.data.datasets import load_split

    rows = load_split("cifar10", "test", shared_data / "cifar10").select(range(300))
    cpu = simclr_transform(32, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    torch.manual_seed(0)
    cpu_views = torch.stack([cpu(rows[i]["image"]) for i in range(300) for _ in range(4)])
    return rows, view_statistics(cpu_views)


@pytest.mark.parametrize("broken", [None, {"strength": 0.0}, {"grayscale_p": 0.0}])
def test_view_pixel_statistics_match_the_cpu_pipeline(cifar_rows_and_cpu_statistics, broken):
    """On real CIFAR-10 images the views' brightness/contrast/saturation spread and grey fraction match
    the CPU pipeline's; switching jitter or grayscale off is detected (the check has teeth)."""
    rows, theirs = cifar_rows_and_cpu_statistics
    gpu = BatchSimCLRAugment(32, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), views=4, seed=0, **(broken or {}))
    ours = view_statistics(gpu(RawImageDataset(rows, cache=True).images).flatten(0, 1))
    tolerance = {"luminance": 0.03, "contrast": 0.02, "saturation": 0.03, "grey": 0.05}
    close = all(np.abs(ours[k] - theirs[k]).max() <= tolerance[k] for k in tolerance)
    assert close == (broken is None), (ours, theirs)
