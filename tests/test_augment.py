"""hscl_zoo.data.transforms / views / loaders: SimCLR views, the eval transform, multi-view datasets,
reproducible loaders."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from hscl_zoo.data.datasets import label_array
from hscl_zoo.data.loaders import SeededSampler, make_loader
from hscl_zoo.data.transforms import (
    RandomGaussianBlur,
    blur_kernel_size,
    eval_transform,
    gaussian_blur,
    simclr_transform,
)
from hscl_zoo.data.views import MultiViewDataset

MEAN = (0.5, 0.4, 0.3)
STD = (0.2, 0.25, 0.3)


@pytest.fixture(scope="module")
def colour_image() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def small_digits(digits):
    return digits.train.select(range(48))


def normalised(array: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(array.astype(np.float32) / 255).permute(2, 0, 1)
    return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def cfg(size: int, **extra) -> dict:
    return {"mean": MEAN, "std": STD, "input_size": (3, size, size), **extra}


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_simclr_view_shape_and_seeding(colour_image, mode):
    image = colour_image.convert(mode)
    transform = simclr_transform(24, mean=MEAN, std=STD)
    torch.manual_seed(1)
    first = transform(image)
    torch.manual_seed(1)
    again = transform(image)
    second = transform(image)
    assert first.shape == (3, 24, 24) and first.dtype == torch.float32
    assert torch.isfinite(first).all()
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_simclr_without_jitter_is_crop_flip_or_gray(colour_image):
    transform = simclr_transform(32, mean=MEAN, std=STD, strength=0.0, blur=False, scale=(1.0, 1.0))
    pixels = np.asarray(colour_image)
    plain, flipped = normalised(pixels), normalised(pixels[:, ::-1].copy())
    torch.manual_seed(0)
    outcomes = {"plain": 0, "flipped": 0, "gray": 0}
    for _ in range(200):
        view = transform(colour_image)
        unnormalised = view * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)
        if torch.allclose(view, plain, atol=1e-5):
            outcomes["plain"] += 1
        elif torch.allclose(view, flipped, atol=1e-5):
            outcomes["flipped"] += 1
        elif torch.allclose(unnormalised[0], unnormalised[1], atol=1e-5):
            outcomes["gray"] += 1
    assert sum(outcomes.values()) == 200
    assert 20 <= outcomes["gray"] <= 60
    assert outcomes["plain"] > 50 and outcomes["flipped"] > 50


def test_simclr_colour_jitter_changes_colours(colour_image):
    transform = simclr_transform(32, mean=MEAN, std=STD, blur=False, scale=(1.0, 1.0))
    pixels = np.asarray(colour_image)
    candidates = (normalised(pixels), normalised(pixels[:, ::-1].copy()))
    torch.manual_seed(0)
    changed = sum(
        not any(torch.allclose(transform(colour_image), c, atol=1e-5) for c in candidates) for _ in range(50)
    )
    assert changed >= 35


def test_simclr_rejects_bad_arguments():
    with pytest.raises(ValueError, match="3 values"):
        simclr_transform(32, mean=(0.5,), std=(0.2,))
    with pytest.raises(ValueError, match="strength"):
        simclr_transform(32, mean=MEAN, std=STD, strength=-1)


@pytest.mark.parametrize(("size", "kernel"), [(16, 3), (32, 3), (64, 7), (96, 9), (224, 23)])
def test_blur_kernel_is_a_tenth_of_the_side(size, kernel):
    assert blur_kernel_size(size) == kernel


@pytest.mark.parametrize(("size", "sigma"), [(16, 0.3), (32, 1.0), (96, 1.9)])
def test_gaussian_blur_matches_torchvision(size, sigma):
    image = torch.rand(3, size, size, generator=torch.Generator().manual_seed(size))
    kernel = blur_kernel_size(size)
    expected = TF.gaussian_blur(image, [kernel, kernel], [sigma, sigma])
    torch.testing.assert_close(gaussian_blur(image, kernel, sigma), expected)


def test_random_blur_probability_and_arguments():
    image = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    blurred = sum(not torch.equal(RandomGaussianBlur(3, p=0.5)(image), image) for _ in range(200))
    assert 70 <= blurred <= 130
    assert torch.equal(RandomGaussianBlur(3, p=0.0)(image), image)
    with pytest.raises(ValueError, match="odd"):
        RandomGaussianBlur(4)


def test_eval_transform_is_identity_geometry_at_native_size(colour_image):
    out = eval_transform(cfg(32, interpolation="bicubic", crop_pct=1.0))(colour_image)
    torch.testing.assert_close(out, normalised(np.asarray(colour_image)))


def test_eval_transform_centre_crop(colour_image):
    out = eval_transform(cfg(28, crop_pct=0.875))(colour_image)
    torch.testing.assert_close(out, normalised(np.asarray(colour_image)[2:30, 2:30]))


def test_eval_transform_squash_and_grayscale():
    wide = Image.fromarray(np.full((20, 40), 128, dtype=np.uint8))
    out = eval_transform(cfg(16, crop_mode="squash"))(wide)
    assert out.shape == (3, 16, 16)
    assert torch.allclose(out[0] * STD[0] + MEAN[0], torch.tensor(128 / 255), atol=1e-3)
    assert torch.allclose(out[2] * STD[2] + MEAN[2], torch.tensor(128 / 255), atol=1e-3)


@pytest.mark.parametrize(
    ("shape", "size", "extra"),
    [
        ((64, 64), 32, {"interpolation": "bicubic", "crop_pct": 1.0}),
        ((64, 48), 56, {"interpolation": "bilinear", "crop_pct": 0.875}),
        ((96, 96), 64, {"interpolation": "bicubic", "crop_pct": 0.9, "crop_mode": "squash"}),
    ],
)
def test_eval_transform_agrees_with_timm(shape, size, extra):
    import timm.data

    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8))
    config = cfg(size, **extra)
    expected = timm.data.create_transform(**config)(image)
    torch.testing.assert_close(eval_transform(config)(image), expected)


def test_eval_transform_accepts_dataclass_config(colour_image):
    @dataclass(frozen=True)
    class PretrainedCfg:
        input_size: tuple = (3, 32, 32)
        mean: tuple = MEAN
        std: tuple = STD
        interpolation: str = "bilinear"
        crop_pct: float = 1.0
        crop_mode: str = "center"

    out = eval_transform(PretrainedCfg())(colour_image)
    torch.testing.assert_close(out, normalised(np.asarray(colour_image)))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mean": MEAN, "std": STD}, r"lacks \['input_size'\]"),
        (cfg(32, crop_mode="border"), "crop_mode 'border' is not supported"),
        (cfg(32, interpolation="lanczos"), "interpolation 'lanczos'"),
        (cfg(32, crop_pct=1.5), "crop_pct"),
        ({"mean": MEAN, "std": STD, "input_size": (32, 32)}, r"\(3, H, W\)"),
    ],
)
def test_eval_transform_bad_config(config, message):
    with pytest.raises(ValueError, match=message):
        eval_transform(config)


def test_multiview_items_are_reproducible_per_epoch(small_digits):
    dataset = MultiViewDataset(small_digits, simclr_transform(16, mean=MEAN, std=STD), views=3, seed=5)
    views, label, index = dataset[7]
    assert views.shape == (3, 3, 16, 16)
    assert (label, index) == (small_digits[7]["label"], 7)
    assert not torch.equal(views[0], views[1])
    torch.manual_seed(123)
    expected_next = torch.rand(4)
    torch.manual_seed(123)
    assert torch.equal(dataset[7][0], views)
    assert torch.equal(torch.rand(4), expected_next), "items must not disturb the caller's RNG"
    dataset.set_epoch(1)
    assert dataset.epoch == 1
    assert not torch.equal(dataset[7][0], views)
    dataset.set_epoch(0)
    assert torch.equal(dataset[7][0], views)
    other_seed = MultiViewDataset(small_digits, simclr_transform(16, mean=MEAN, std=STD), views=3, seed=6)
    assert not torch.equal(other_seed[7][0], views)


def test_label_positive_views_come_from_other_images_of_the_class(small_digits):
    transform = eval_transform(cfg(16))
    dataset = MultiViewDataset(small_digits, transform, views=3, label_positive=True, seed=0)
    labels = label_array(small_digits)
    partners = set()
    for index in range(len(dataset)):
        sources = dataset.view_sources(index)
        assert sources[0] == index
        for src in sources[1:]:
            assert labels[src] == labels[index]
            if np.sum(labels == labels[index]) > 1:
                assert src != index
        partners.update(sources[1:])
    assert len(partners) > len(dataset) // 2
    views, _, _ = dataset[0]
    for view, src in zip(views, dataset.view_sources(0)):
        torch.testing.assert_close(view, transform(small_digits[src]["image"]))
    before = [dataset.view_sources(i) for i in range(len(dataset))]
    dataset.set_epoch(1)
    assert [dataset.view_sources(i) for i in range(len(dataset))] != before


def test_multiview_bad_input(small_digits):
    transform = eval_transform(cfg(16))
    with pytest.raises(ValueError, match="views >= 2"):
        MultiViewDataset(small_digits, transform, views=1, label_positive=True)
    with pytest.raises(ValueError, match=r"missing \['image'\]"):
        MultiViewDataset(small_digits.rename_column("image", "img"), transform)


def epochs_of_batches(loader, epochs: int = 2) -> list:
    batches = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches.append([(views.clone(), labels.clone(), index.clone()) for views, labels, index in loader])
    return batches


def assert_same_batches(first: list, second: list) -> None:
    assert len(first) == len(second)
    for epoch_a, epoch_b in zip(first, second):
        assert len(epoch_a) == len(epoch_b)
        for (va, la, ia), (vb, lb, ib) in zip(epoch_a, epoch_b):
            assert torch.equal(ia, ib) and torch.equal(la, lb) and torch.equal(va, vb)


def test_make_loader_same_seed_same_batches_any_worker_count(small_digits):
    def run(seed: int, num_workers: int, persistent: bool = False) -> list:
        dataset = MultiViewDataset(small_digits, simclr_transform(16, mean=MEAN, std=STD), label_positive=True)
        loader = make_loader(dataset, 16, shuffle=True, seed=seed, num_workers=num_workers,
                             drop_last=True, persistent_workers=persistent)
        return epochs_of_batches(loader)

    reference = run(seed=0, num_workers=0)
    assert reference[0][0][0].shape == (16, 2, 3, 16, 16)
    assert not torch.equal(reference[0][0][2], reference[1][0][2]), "epochs must reshuffle"
    assert_same_batches(reference, run(seed=0, num_workers=0))
    assert_same_batches(reference, run(seed=0, num_workers=2))
    assert_same_batches(reference, run(seed=0, num_workers=1, persistent=True))
    different = run(seed=1, num_workers=0)
    assert not torch.equal(reference[0][0][2], different[0][0][2])


def test_seeded_sampler_order_depends_only_on_seed_and_epoch():
    running = SeededSampler(50, seed=7)
    first, second = list(running), list(running)
    assert sorted(first) == list(range(50)) and first != second
    resumed = SeededSampler(50, seed=7)
    resumed.set_epoch(1)
    assert list(resumed) == second
    assert list(SeededSampler(50, seed=8)) != first
    assert list(SeededSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_make_loader_bad_arguments(small_digits):
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(small_digits, 0)
    with pytest.raises(ValueError, match="num_workers"):
        make_loader(small_digits, 4, num_workers=-1)
