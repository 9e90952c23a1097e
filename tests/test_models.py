"""ContrastiveEncoder on real timm backbones: stems, heads, config round trip, preprocessing."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from hscl_zoo.models import ContrastiveEncoder, create_model


@pytest.fixture(scope="module")
def resnet() -> ContrastiveEncoder:
    torch.manual_seed(0)
    return create_model("resnet18", num_classes=10, image_size=32, class_names=[f"c{i}" for i in range(10)])


def test_resnet_small_stem_is_the_papers_cifar_stem(resnet):
    conv1 = resnet.backbone.conv1
    assert isinstance(conv1, nn.Conv2d)
    assert conv1.kernel_size == (3, 3) and conv1.stride == (1, 1) and conv1.padding == (1, 1)
    assert isinstance(resnet.backbone.maxpool, nn.Identity)
    assert resnet.model_args["small_stem"] is True
    # 32x32 input keeps 32x32 through the stem, so the last stage is 4x4 (1x1 with the ImageNet stem).
    assert resnet.backbone.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 512, 4, 4)


def test_small_stem_chosen_from_image_size_unless_told():
    large = create_model("resnet10t", num_classes=3, image_size=128)
    assert large.model_args["small_stem"] is False
    assert isinstance(large.backbone.maxpool, nn.MaxPool2d)
    assert large.backbone.conv1[0].stride == (2, 2)

    forced_off = create_model("resnet18", num_classes=3, image_size=32, small_stem=False)
    assert forced_off.backbone.conv1.kernel_size == (7, 7)
    assert forced_off.backbone.conv1.stride == (2, 2)


def test_deep_stem_resnet_keeps_its_convs_with_stride_one():
    model = create_model("resnet10t", num_classes=3, image_size=64)
    first = model.backbone.conv1[0]
    assert first.kernel_size == (3, 3) and first.stride == (1, 1)
    assert isinstance(model.backbone.maxpool, nn.Identity)


def test_heads_and_outputs(resnet):
    x = torch.randn(2, 3, 32, 32)
    resnet.train()
    features = resnet.encode(x)
    assert features.shape == (2, resnet.num_features) == (2, 512)
    z = resnet.project(x)
    assert z.shape == (2, 128)
    torch.testing.assert_close(z.norm(dim=-1), torch.ones(2))
    assert resnet(x).shape == (2, 10)
    linear1, bn, relu, linear2 = resnet.projector
    assert (linear1.in_features, linear1.out_features, bn.num_features, linear2.out_features) == (512, 512, 512, 128)
    assert isinstance(relu, nn.ReLU)
    assert resnet.classifier.in_features == 512 and resnet.classifier.out_features == 10
    z.sum().backward()
    assert resnet.backbone.conv1.weight.grad is not None


def test_vit_at_32px_through_timm_arguments():
    model = create_model("vit_tiny_patch16_224", num_classes=5, image_size=32, patch_size=4)
    assert model.backbone.patch_embed.grid_size == (8, 8)
    assert model.model_args["img_size"] == 32 and model.model_args["patch_size"] == 4
    x = torch.randn(2, 3, 32, 32)
    assert model(x).shape == (2, 5)
    assert model.project(x).shape == (2, 128)


@pytest.mark.parametrize("backbone,fix", [("convnext_atto", "small_stem=False"), ("vit_tiny_patch16_224", "patch_size=4")])
def test_small_stem_on_other_families_is_a_clear_error(backbone, fix):
    with pytest.raises(ValueError, match="ResNet-family") as err:
        create_model(backbone, num_classes=5, image_size=32, small_stem=True)
    assert fix in str(err.value)


def test_convnext_builds_at_small_size_with_its_own_stem():
    model = create_model("convnext_atto", num_classes=5, image_size=32)
    assert model.model_args["small_stem"] is False
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)


@pytest.mark.parametrize("kwargs,message", [
    ({"backbone": "resnet19"}, "Closest timm names: .*resnet18"),
    ({"num_classes": 0}, "num_classes must be a positive int"),
    ({"image_size": 32.0}, "image_size must be a positive int"),
    ({"class_names": ["a", "b"]}, "one name per class"),
    ({"mean": [0.5, 0.5]}, "3 values"),
    ({"std": [0.5, 0.0, 0.5]}, "std must be positive"),
    ({"small_stem": "yes"}, "small_stem must be True, False or None"),
    ({"crop_pct": 1.5}, r"crop_pct must be in \(0, 1\]"),
    ({"interpolation": "cubic"}, "interpolation must be one of"),
    ({"num_classes_": None, "pretrained_cfg": {}}, "set by ContrastiveEncoder itself"),
])
def test_bad_arguments_name_the_problem(kwargs, message):
    args = {"backbone": "resnet10t", "num_classes": 3, "image_size": 32, **kwargs}
    args.pop("num_classes_", None)
    with pytest.raises(ValueError, match=message):
        create_model(**args)


def test_model_config_is_timm_shaped_json_and_rebuilds_the_architecture(resnet):
    config = json.loads(json.dumps(resnet.model_config()))
    assert config["architecture"] == "resnet18"
    assert config["num_classes"] == 10
    assert config["label_names"] == [f"c{i}" for i in range(10)]
    assert config["pretrained_cfg"]["input_size"] == [3, 32, 32]
    assert set(config["pretrained_cfg"]) >= {"mean", "std", "interpolation", "crop_pct", "crop_mode"}
    assert config["model_args"] == {"image_size": 32, "small_stem": True, "proj_hidden_dim": 512, "proj_dim": 128}
    rebuilt = ContrastiveEncoder.from_config(config)
    assert rebuilt.model_config() == config
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in resnet.state_dict().items()}


def test_from_config_rejects_plain_timm_config():
    timm_config = {"architecture": "resnet18", "num_classes": 1000, "pretrained_cfg": {"input_size": [3, 224, 224]}}
    with pytest.raises(ValueError, match="plain timm checkpoint") as err:
        ContrastiveEncoder.from_config(timm_config)
    assert "model_args.image_size" in str(err.value)


def test_from_config_rejects_inconsistent_sizes(resnet):
    config = resnet.model_config()
    config["pretrained_cfg"]["input_size"] = [3, 64, 64]
    with pytest.raises(ValueError, match="input_size"):
        ContrastiveEncoder.from_config(config)


def test_default_normalisation_is_imagenet_and_custom_is_applied():
    default = create_model("resnet10t", num_classes=2, image_size=32)
    assert default.pretrained_cfg["mean"] == pytest.approx([0.485, 0.456, 0.406])
    custom = create_model("resnet10t", num_classes=2, image_size=32, mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0])
    gray = Image.fromarray(np.full((32, 32, 3), 128, dtype=np.uint8))
    pixels = custom.transform(gray)
    assert pixels.shape == (3, 32, 32)
    expected = torch.tensor([(128 / 255 - 0.5) / 0.5, (128 / 255 - 0.25) / 0.25, 128 / 255])
    torch.testing.assert_close(pixels[:, 0, 0], expected)


def test_predict_gives_probabilities_for_pil_images(resnet):
    resnet.train()
    images = [Image.fromarray(np.random.default_rng(i).integers(0, 255, (48, 40, 3), dtype=np.uint8)) for i in range(3)]
    probs = resnet.predict(images)
    assert probs.shape == (3, 10)
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(3))
    assert resnet.training, "predict restores the caller's train/eval mode"
    one = resnet.predict(images[0].convert("L"))
    torch.testing.assert_close(one[0], resnet.eval().predict(images[0].convert("L").convert("RGB"))[0])
    with pytest.raises(TypeError, match="PIL image"):
        resnet.predict("cat.png")
