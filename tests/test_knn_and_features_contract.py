"""hscl_zoo.evaluation: the weighted-kNN rule on hand-built banks, extract_features on an in-memory
table against the model applied directly, and the preprocessing statement of real timm configs."""

from __future__ import annotations

import math
import re

import datasets
import numpy as np
import pytest
import timm
import torch
from PIL import Image
from torch import nn

from hscl_zoo.data.transforms import INTERPOLATIONS, eval_transform
from hscl_zoo.evaluation import extract_features, knn_top1, preprocessing
from hscl_zoo.features import encode_uint8

FEATURES = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
CFG = {"mean": (0.5, 0.4, 0.3), "std": (0.25, 0.2, 0.3), "input_size": (3, 4, 4)}
SHAPE_MESSAGE = ("encode_fn must return a (batch, dim) tensor, got {}; pool spatial maps first "
                 "(e.g. timm's forward_head(x, pre_logits=True))")


def table(n: int) -> datasets.Dataset:
    """``n`` random 4x4 RGB images with labels 0, 1, 2, 0, 1, 2, ... shifted by one (1, 2, 0, ...)."""
    rng = np.random.default_rng(n)
    images = [Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)) for _ in range(n)]
    return datasets.Dataset.from_dict({"image": images, "label": [(i + 1) % 3 for i in range(n)]},
                                      features=FEATURES)


class Encoder(nn.Module):
    """Flatten, dropout, linear; records the size and device of every batch it encodes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.drop = nn.Dropout(0.5)
        self.proj = nn.Linear(48, 5)
        self.batches: list[tuple[int, torch.device]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append((len(x), x.device))
        return self.proj(self.drop(x.flatten(1)))


class MetaEncoder(nn.Module):
    """A module whose parameters live on the meta device; it returns the batch's per-image size."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, device="meta"))
        self.devices: list[torch.device] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.devices.append(x.device)
        return torch.full((len(x), 1), float(x[0].numel()))


class Counter:
    """Not a module: a plain object whose bound method encodes."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x.flatten(1)


def in_worker(image) -> torch.Tensor:
    return torch.tensor([float(torch.utils.data.get_worker_info() is not None)])


@pytest.fixture(scope="module")
def transform():
    return eval_transform(CFG)


def direct(model: nn.Module, dataset: datasets.Dataset, transform) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(torch.stack([transform(row["image"]) for row in dataset]))


def test_features_equal_the_model_on_the_transformed_images_for_every_batch_size(transform):
    data = table(7)
    model = Encoder()
    expected = direct(model, data, transform)
    for batch_size, sizes in ((1, [1] * 7), (3, [3, 3, 1]), (7, [7]), (50, [7])):
        model.train()
        model.batches.clear()
        feats, labels = extract_features(model, data, transform, batch_size=batch_size, progress=False)
        assert [size for size, _ in model.batches] == sizes
        torch.testing.assert_close(feats, expected)
        assert feats.dtype == torch.float32 and labels.dtype == torch.int64
        assert labels.tolist() == [1, 2, 0, 1, 2, 0, 1]
        assert model.training


def test_default_batch_is_256_images():
    data = datasets.Dataset.from_dict(
        {"image": [Image.new("RGB", (1, 1), (i, 0, 0)) for i in range(257)], "label": [0] * 257}, features=FEATURES)
    model = Encoder()
    model.proj = nn.Linear(3, 5)
    feats, _ = extract_features(model, data, eval_transform({**CFG, "input_size": (3, 1, 1)}), progress=False)
    assert [size for size, _ in model.batches] == [256, 1] and feats.shape == (257, 5)


def test_a_bound_method_puts_its_module_in_eval_mode_and_restores_the_mode(transform):
    data = table(4)

    class WithEncode(Encoder):
        def encode(self, x):
            return self(x)

    model = WithEncode()
    expected = direct(model, data, transform)
    for training in (True, False):
        model.train(training)
        feats, _ = extract_features(model.encode, data, transform, batch_size=3, progress=False)
        torch.testing.assert_close(feats, expected)
        assert model.training is training


def test_a_plain_function_or_a_method_of_a_plain_object_encodes_on_cpu(transform):
    data = table(5)
    pixels = torch.stack([transform(row["image"]) for row in data]).flatten(1)
    devices = []

    def encode(x):
        devices.append(x.device)
        return x.flatten(1)

    feats, labels = extract_features(encode, data, transform, batch_size=2, progress=False)
    torch.testing.assert_close(feats, pixels)
    assert devices == [torch.device("cpu")] * 3 and labels.tolist() == [1, 2, 0, 1, 2]
    counter = Counter()
    feats, _ = extract_features(counter.encode, data, transform, batch_size=2, progress=False)
    torch.testing.assert_close(feats, pixels)
    assert counter.calls == 3


def test_batches_go_to_the_device_of_the_module_or_the_one_asked_for(transform):
    data = table(3)
    model = MetaEncoder()
    feats, _ = extract_features(model, data, transform, batch_size=2, progress=False)
    assert model.devices == [torch.device("meta")] * 2
    assert feats.tolist() == [[48.0], [48.0], [48.0]]
    devices = []

    def encode(x):
        devices.append(x.device)
        return torch.ones(len(x), 1)

    extract_features(encode, data, transform, batch_size=2, device="meta", progress=False)
    assert devices == [torch.device("meta")] * 2


def test_images_are_transformed_in_workers_only_when_asked(transform):
    data = table(3)
    feats, _ = extract_features(nn.Identity(), data, in_worker, progress=False)
    assert feats.tolist() == [[0.0]] * 3
    feats, _ = extract_features(nn.Identity(), data, in_worker, num_workers=1, progress=False)
    assert feats.tolist() == [[1.0]] * 3


def test_progress_bar_named_features_is_shown_by_default_and_cleared(transform, capsys):
    extract_features(nn.Flatten(), table(4), transform, batch_size=2)
    err = capsys.readouterr().err
    assert err.startswith("\rfeatures:   0%|") and "| 0/2 [" in err
    assert "\n" not in err and err.endswith("\r")


def test_no_progress_bar_when_progress_is_false(transform, capsys):
    extract_features(nn.Flatten(), table(4), transform, batch_size=2, progress=False)
    assert capsys.readouterr().err == ""


def test_a_single_row_is_encoded_and_an_empty_table_refused(transform):
    feats, labels = extract_features(nn.Flatten(), table(1), transform, progress=False)
    assert feats.shape == (1, 48) and labels.tolist() == [1]
    empty = datasets.Dataset.from_dict({"image": [], "label": []}, features=FEATURES)
    with pytest.raises(ValueError) as info:
        extract_features(nn.Flatten(), empty, transform, progress=False)
    assert str(info.value) == "extract_features got an empty dataset"


def test_missing_columns_are_named_with_the_function(transform):
    with pytest.raises(ValueError) as info:
        extract_features(nn.Flatten(), table(2).rename_column("label", "y"), transform, progress=False)
    assert str(info.value) == ("extract_features needs columns ['image', 'label'], missing ['label'] "
                               "(found ['image', 'y']); load data with hscl_zoo.data.load_splits")


@pytest.mark.parametrize("encode, shown", [
    (nn.Identity(), "(2, 3, 4, 4)"),
    (lambda x: x.flatten()[None], "(1, 96)"),
    (lambda x: list(x.flatten(1)), "list"),
])
def test_an_output_that_is_not_a_batch_of_vectors_is_refused_with_its_shape(transform, encode, shown):
    with pytest.raises(ValueError) as info:
        extract_features(encode, table(2), transform, progress=False)
    assert str(info.value) == SHAPE_MESSAGE.format(shown)


# --- rows a training run already holds decoded (encode_uint8) ----------------------------------------

def cached(n: int) -> torch.Tensor:
    """``n`` random uint8 images (n, 3, 4, 4): an image cache."""
    return torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))


def as_float(x: torch.Tensor) -> torch.Tensor:
    """An encoder's own transform in miniature: takes a uint8 batch, on whatever device it is."""
    return x.float() / 255


def test_cached_rows_are_encoded_in_order_in_eval_mode_without_decoding(transform):
    data, images = table(5), cached(5)
    model = Encoder()
    model.proj = nn.Linear(48, 5)
    model.train()
    feats, labels = extract_features(model, data, as_float, images=images, batch_size=2, progress=False)
    assert [size for size, _ in model.batches] == [2, 2, 1]
    with torch.no_grad():
        expected = model.eval()(as_float(images))
    torch.testing.assert_close(feats, expected)
    assert labels.dtype == torch.int64 and labels.tolist() == [1, 2, 0, 1, 2]


def test_cached_rows_give_int64_labels_whatever_the_tables_format():
    """A table formatted as numpy hands its int32 label column over as an int32 array."""
    data = table(3).cast_column("label", datasets.Value("int32")).with_format("numpy")
    _, labels = extract_features(nn.Flatten(), data, as_float, images=cached(3), progress=False)
    assert labels.dtype == torch.int64 and labels.tolist() == [1, 2, 0]


def test_cached_rows_keep_the_modules_mode_and_encode_with_plain_functions():
    images = cached(3)
    model = Encoder()
    for training in (True, False):
        model.train(training)
        encode_uint8(model, as_float, images)
        assert model.training is training
    torch.testing.assert_close(encode_uint8(lambda x: x.flatten(1), as_float, images), as_float(images).flatten(1))


def test_cached_batches_go_to_the_device_of_the_module_or_the_one_asked_for():
    model = MetaEncoder()
    assert encode_uint8(model, as_float, cached(3), batch_size=2).tolist() == [[48.0]] * 3
    assert model.devices == [torch.device("meta")] * 2
    devices = []

    def encode(x):
        devices.append(x.device)
        return torch.ones(len(x), 1)

    encode_uint8(encode, as_float, cached(3), batch_size=2, device="meta")
    extract_features(encode, table(3), as_float, images=cached(3), batch_size=2, device="meta", progress=False)
    assert devices == [torch.device("meta")] * 4


def test_encode_uint8_runs_256_images_a_batch_by_default():
    model = MetaEncoder()
    encode_uint8(model, as_float, torch.zeros(257, 3, 1, 1, dtype=torch.uint8))
    assert len(model.devices) == 2


def test_autocast_runs_the_encoder_in_the_precision_asked_for():
    """Under float16 autocast a linear layer's outputs are float16 numbers (float32 and bfloat16,
    autocast's CPU default, give others); without it they are float32 ones. Judged by which
    precision each output is exact in, and by closeness to the model, so it holds on any CPU."""
    images = cached(6)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 7))
    with torch.no_grad():
        full = model(as_float(images))

    def exact_in(values: torch.Tensor, dtype: torch.dtype) -> bool:
        return torch.equal(values.to(dtype).float(), values)

    half = encode_uint8(model, as_float, images, autocast_dtype=torch.float16)
    assert exact_in(half, torch.float16) and not exact_in(half, torch.bfloat16)
    torch.testing.assert_close(half, full, rtol=2e-3, atol=2e-3)
    single = encode_uint8(model, as_float, images)
    assert not exact_in(single, torch.float16)
    torch.testing.assert_close(single, full)


def test_cached_rows_show_the_features_bar_only_when_asked(capsys):
    extract_features(nn.Flatten(), table(4), as_float, images=cached(4), batch_size=2)
    err = capsys.readouterr().err
    assert err.startswith("\rfeatures:   0%|") and "| 0/2 [" in err
    assert "\n" not in err and err.endswith("\r")
    encode_uint8(nn.Flatten(), as_float, cached(4), batch_size=2)
    extract_features(nn.Flatten(), table(4), as_float, images=cached(4), batch_size=2, progress=False)
    assert capsys.readouterr().err == ""


def reference_knn(train_f, train_y, test_f, test_y, k, temperature) -> float:
    """The documented rule, in float64: k most similar by cosine, class score sum exp(s / t)."""
    train_n = train_f.double() / train_f.double().norm(dim=1, keepdim=True)
    correct = 0
    for query, label in zip(test_f.double(), test_y):
        sims = (train_n @ (query / query.norm())).tolist()
        nearest = sorted(range(len(sims)), key=lambda j: -sims[j])[:k]
        votes: dict[int, float] = {}
        for j in nearest:
            votes[int(train_y[j])] = votes.get(int(train_y[j]), 0.0) + math.exp(sims[j] / temperature)
        correct += max(votes, key=votes.get) == int(label)
    return 100.0 * correct / len(test_y)


def at_cosine(c: float) -> list[float]:
    return [c, math.sqrt(1 - c * c)]


def test_default_temperature_weighs_one_close_neighbour_over_two_further_ones():
    """exp(1 / 0.1) > 2 exp(0.9 / 0.1): the single class-0 neighbour at cosine 1 outvotes two
    class-1 neighbours at cosine 0.9 (at temperature 1 it would not: e^1 < 2 e^0.9)."""
    train = torch.tensor([at_cosine(1.0), at_cosine(0.9), at_cosine(0.9)])
    train_y = torch.tensor([0, 1, 1])
    queries = torch.tensor([[s, 0.0] for s in (0.5, 1.0, 2.0, 4.0, 8.0)])
    assert knn_top1(train, train_y, queries, torch.zeros(5, dtype=torch.int64)) == 100.0
    assert knn_top1(train, train_y, queries, torch.ones(5, dtype=torch.int64)) == 0.0
    assert knn_top1(train, train_y, queries, torch.zeros(5, dtype=torch.int64), temperature=1.0) == 0.0
    assert reference_knn(train, train_y, queries, torch.zeros(5), 200, 0.1) == 100.0


def test_default_k_is_200_neighbours():
    """100 class-0 points at cosine 1 beat 100 class-1 points at 0.9999 (k = 200); a 201st
    neighbour, class 1 at 0.999, would tip the vote: e^9.99 > 100 (e^10 - e^9.999)."""
    train = torch.tensor([at_cosine(1.0)] * 100 + [at_cosine(0.9999)] * 100 + [at_cosine(0.999)] * 5)
    train_y = torch.tensor([0] * 100 + [1] * 105)
    query, label = torch.tensor([[3.0, 0.0]]), torch.tensor([0])
    assert knn_top1(train, train_y, query, label) == 100.0
    assert knn_top1(train, train_y, query, label, k=201) == 0.0
    assert reference_knn(train, train_y, query, label, 200, 0.1) == 100.0
    assert reference_knn(train, train_y, query, label, 201, 0.1) == 0.0


def test_chunks_cover_every_test_point_from_the_first():
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    train_y = torch.tensor([0, 1])
    test = torch.tensor([[1.0, 0.1], [0.1, 1.0], [2.0, 0.0], [0.0, 3.0], [1.0, 0.2]])
    for chunk_size in (1, 2, 1024):
        assert knn_top1(train, train_y, test, torch.tensor([0, 1, 0, 1, 0]), k=1, chunk_size=chunk_size) == 100.0
        assert knn_top1(train, train_y, test, torch.tensor([1, 1, 1, 1, 1]), k=1, chunk_size=chunk_size) == 40.0


def test_hits_are_counted_exactly_past_float32_integers():
    """2^24 + 1 test points, all equal to the one training point: every one is a hit."""
    n = 2**24 + 1
    test = torch.ones(1, 1).expand(n, 1)
    labels = torch.zeros((), dtype=torch.int64).expand(n)
    assert knn_top1(torch.ones(1, 1), torch.zeros(1, dtype=torch.int64), test, labels, chunk_size=2**22) == 100.0


def test_knn_works_under_a_float64_default_dtype():
    train = torch.tensor([at_cosine(1.0), at_cosine(0.9), at_cosine(0.9)])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert knn_top1(train, torch.tensor([0, 1, 1]), train[:1], torch.tensor([0])) == 100.0
    finally:
        torch.set_default_dtype(previous)


def test_the_search_runs_on_the_requested_device():
    """On the meta device every step runs on shapes alone, so only reading the count fails."""
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(RuntimeError, match=r"^Tensor.item\(\) cannot be called on meta tensors$"):
        knn_top1(train, torch.tensor([0, 1]), train, torch.tensor([0, 1]), device="meta")
    meta = train.to("meta")
    with pytest.raises(RuntimeError, match=r"^Tensor.item\(\) cannot be called on meta tensors$"):
        knn_top1(meta, torch.tensor([0, 1], device="meta"), meta, torch.tensor([0, 1], device="meta"))
    for args in ((meta, torch.tensor([0, 1]), train, torch.tensor([0, 1])),
                 (train, torch.tensor([0, 1]), meta, torch.tensor([0, 1]))):
        with pytest.raises(NotImplementedError, match=r"^Cannot copy out of meta tensor; no data!$"):
            knn_top1(*args, device="cpu")


def test_knn_messages_name_the_split_and_the_setting():
    feats, labels = torch.ones(3, 2), torch.zeros(3, dtype=torch.int64)
    cases = [
        ((feats, labels[:2], feats, labels), {},
         "train labels must be (N,) with N = 3 rows of features, got shape (2,)"),
        ((feats, labels, feats[:, 0], labels), {}, "test features must be (N, D), got shape (3,)"),
        ((feats, labels, feats, labels), {"k": 0}, "k must be >= 1, got 0"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError) as info:
            knn_top1(*args, **kwargs)
        assert str(info.value) == message


IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def test_preprocessing_of_a_real_timm_config():
    """torchvision's ResNet-18 in timm: 224 input, crop_pct 0.875 (224 / 0.875 = 256), bilinear."""
    cfg = timm.create_model("resnet18.tv_in1k", pretrained=False).pretrained_cfg
    assert preprocessing(cfg) == {
        "input_size": [3, 224, 224],
        "resize": "shorter side to 256 (bilinear, antialiased), then centre crop 224x224",
        **IMAGENET,
    }


def test_preprocessing_of_a_squash_config_with_a_crop():
    cfg = {"input_size": (3, 24, 40), "crop_pct": 0.875, "crop_mode": "squash", "interpolation": "nearest", **IMAGENET}
    assert preprocessing(cfg) == {
        "input_size": [3, 24, 40],
        "resize": "27x45 ignoring aspect ratio (nearest, antialiased), then centre crop 24x40",
        **IMAGENET,
    }
    assert preprocessing({**cfg, "crop_mode": "center"})["resize"] == (
        "shorter side to 27 (nearest, antialiased), then centre crop 24x40")


def test_preprocessing_defaults_keep_the_whole_image_and_name_the_interpolation_the_transform_uses():
    cfg = {"input_size": (3, 16, 16), **IMAGENET}
    resize = preprocessing(cfg)["resize"]
    found = re.fullmatch(r"shorter side to 16 \((\w+), antialiased\), then centre crop 16x16", resize)
    assert found
    image = Image.fromarray((np.arange(24 * 30 * 3) % 251).astype(np.uint8).reshape(24, 30, 3))
    named = {**cfg, "interpolation": found.group(1)}
    assert torch.equal(eval_transform(cfg)(image), eval_transform(named)(image))
    other = next(name for name in INTERPOLATIONS if name != found.group(1) and name != "nearest")
    assert not torch.equal(eval_transform(cfg)(image), eval_transform({**cfg, "interpolation": other})(image))


def test_knn_does_not_overflow_at_a_small_temperature():
    """One class-0 neighbour at cosine 1 against five class-1 neighbours at cosine 0.99: at T = 0.01 the
    scores are e^100 against 5 e^99 = e^100.6, so class 1 wins; exp(s / T) alone overflows float32 to a tie."""
    c = 0.99
    train = torch.tensor([[1.0, 0.0]] + [[c, math.sqrt(1 - c * c)]] * 5)
    labels = torch.tensor([0, 1, 1, 1, 1, 1])
    test = torch.tensor([[1.0, 0.0]])
    for temperature in (0.02, 0.01):
        assert knn_top1(train, labels, test, torch.tensor([1]), k=6, temperature=temperature) == 100.0
    # below T = 0.01 / ln 5 the single nearer neighbour outweighs the five: e^0 > 5 e^-2 at T = 0.005
    assert knn_top1(train, labels, test, torch.tensor([0]), k=6, temperature=0.005) == 100.0


def test_features_from_a_runs_uint8_cache_equal_those_of_the_decoded_images(transform):
    """A run's image cache (RawImageDataset, cache=True) encoded batch by batch through the same
    transform gives the decoded path's features to float32 rounding (scaling and normalising a
    batch tensor is the per-image arithmetic in another call), with the table's labels."""
    from hscl_zoo.data.raw_images import RawImageDataset

    data = table(7)
    model = Encoder()
    expected = direct(model, data, transform)
    cache = RawImageDataset(data, cache=True).images
    for batch_size, sizes in ((3, [3, 3, 1]), (256, [7])):
        model.train()
        model.batches.clear()
        feats, labels = extract_features(model, data, transform, batch_size=batch_size, progress=False, images=cache)
        assert [size for size, _ in model.batches] == sizes
        torch.testing.assert_close(feats, expected)
        assert feats.dtype == torch.float32 and labels.tolist() == [1, 2, 0, 1, 2, 0, 1]
        assert model.training


@pytest.mark.parametrize("images, shown", [
    (torch.zeros(6, 3, 4, 4, dtype=torch.uint8), "torch.uint8 (6, 3, 4, 4)"),
    (torch.zeros(7, 3, 4, 4), "torch.float32 (7, 3, 4, 4)"),
])
def test_a_cache_that_is_not_the_tables_rows_is_refused_with_its_shape(transform, images, shown):
    with pytest.raises(ValueError, match=re.escape(f"images must be the dataset's 7 rows as a uint8 (N, 3, H, W) "
                                                   f"tensor, got {shown}")):
        extract_features(Encoder(), table(7), transform, progress=False, images=images)
