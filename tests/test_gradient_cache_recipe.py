"""The recipe's gradient-cache step (`chunk_size`) moves the weights as the plain step does.

Both runs take one SGD step from the same seeded weights on the same views; the step is recomputed
here with plain autograd. The gradient cache normalises each chunk with its own BatchNorm
statistics (`hscl_zoo.training.gradient_cache`), so its reference encodes the chunks one at a time
with a graph and computes the loss on all of their embeddings; the plain run's reference encodes
the whole batch at once. Both references start from the recipe's initial weights (`first_step_inputs`).
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hscl_zoo
from hscl_zoo.training.pretrain import build_optimizer
from hscl_zoo.training.steps import gradient_cache_step
from test_pretrain import ONE_STEP, first_step_inputs, load_recipe

SGD = [*ONE_STEP, "--optimizer", "sgd", "--lr", "0.5"]  # the update is lr x gradient: its size is checked too


@pytest.fixture(scope="module")
def recipe():
    return load_recipe()


def reference_step(run: Path, images_per_chunk: int | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(initial weights, weights after one step) of the run's first step done with plain autograd,
    the images encoded `images_per_chunk` at a time with all their views (None: all at once)."""
    cfg, encoder, ((x, y),) = first_step_inputs(run)
    model = encoder.projection_network()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = build_optimizer(cfg, model.parameters(), fused=False)
    chunks = x.split(images_per_chunk or len(x))
    z = torch.cat([model(chunk.flatten(0, 1)) for chunk in chunks]).view(*x.shape[:2], -1)
    hscl_zoo.build_loss(cfg.method, **cfg.loss_kwargs())(z, y).backward()
    optimizer.step()
    return before, model.state_dict()


def assert_same_step(run: Path, before: dict, after: dict) -> None:
    trained = load_file(run / "hub" / "model.safetensors")
    for key, expected in after.items():
        if not expected.is_floating_point():
            assert torch.equal(trained[key], expected), key
            continue
        torch.testing.assert_close(trained[key] - before[key], expected - before[key], rtol=1e-3, atol=1e-6,
                                   msg=lambda m: f"{key}: {m}")


@pytest.mark.slow
def test_chunked_step_equals_the_plain_step_with_per_chunk_batchnorm(recipe, tmp_path):
    plain, chunked = tmp_path / "plain", tmp_path / "chunked"
    recipe.main([*SGD, "--output_dir", str(plain)])
    recipe.main([*SGD, "--output_dir", str(chunked), "--chunk_size", "32"])

    before, whole_batch = reference_step(plain, None)
    assert_same_step(plain, before, whole_batch)
    _, per_chunk = reference_step(chunked, 32)
    assert_same_step(chunked, before, per_chunk)

    still = [k for k in per_chunk if per_chunk[k].is_floating_point() and torch.equal(per_chunk[k], before[k])]
    assert all(".bn1.bias" in k for k in still), still  # zero-initialised, behind each block's zero-initialised bn2
    with pytest.raises(AssertionError):  # the references differ only by BatchNorm's statistics; the check tells them apart
        assert_same_step(chunked, before, whole_batch)


def test_gradient_cache_step_accumulates_the_per_chunk_gradient():
    """`gradient_cache_step` as the loop calls it (`backward` given, channels_last): the gradient in
    .grad equals plain autograd over the chunks encoded one at a time, and the embeddings it returns
    are the ones the loss saw."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 8))
    views, labels = torch.randn(6, 2, 3, 8, 8), torch.arange(6) % 3
    loss_fn = hscl_zoo.build_loss("hscl-beta", beta=1.0)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    z = torch.cat([model(chunk.flatten(0, 1)) for chunk in views.split(4)]).view(6, 2, -1)  # 4 images, then 2
    expected_loss = loss_fn(z, labels)
    expected_loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}

    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    loss, seen = gradient_cache_step(model, loss_fn, views, labels, chunk_size=4, backward=torch.Tensor.backward,
                                     channels_last=True)
    assert float(loss) == pytest.approx(expected_loss.item(), rel=1e-6)
    torch.testing.assert_close(seen, z.detach())
    for name, p in model.named_parameters():
        assert expected[name].abs().sum() > 0, name
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")


def test_gradient_cache_step_uses_the_memory_format_asked_and_the_given_backward():
    """Images reach the model in channels_last only when asked (the default is as given), the loss is
    back-propagated through `backward` (accelerate's, for its loss scaling), and a forward that is
    not an nn.Module is refused with the fix rather than silently skipping the buffer bookkeeping."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(4, 8))
    formats: list[bool] = []
    model[0].register_forward_pre_hook(lambda _, args: formats.append(
        args[0].is_contiguous(memory_format=torch.channels_last)))
    views, labels = torch.randn(6, 2, 3, 8, 8), torch.arange(6) % 3
    loss_fn = hscl_zoo.build_loss("scl")
    backwards: list[torch.Size] = []

    def backward(loss):
        backwards.append(loss.shape)
        loss.backward()

    gradient_cache_step(model, loss_fn, views, labels, chunk_size=4, backward=backward)
    assert formats and not any(formats), formats
    assert backwards, "the loss was not back-propagated through the given backward"
    formats.clear()
    gradient_cache_step(model, loss_fn, views, labels, chunk_size=4, backward=backward, channels_last=True)
    assert formats and all(formats), formats
    with pytest.raises(ValueError, match="encode is not an nn.Module: pass module="):
        gradient_cache_step(lambda x: model(x), loss_fn, views, labels, chunk_size=4, backward=backward)
