"""Views made one batch ahead (hscl_zoo.data.overlap, issue 48): the same views, bit for bit, as
the augmenter called batch by batch; the generator rewound to where the serial loop leaves it,
so a checkpoint within an epoch resumes with the right views; and an epoch of the recipe's loop
fed through it gives the same losses as the loop fed the serial views."""

from __future__ import annotations

import pytest
import torch
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.overlap import OverlappedViews
from hscl_zoo.losses import build_loss
from helpers import one_cpu_epoch

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def augmenter() -> BatchSimCLRAugment:
    return BatchSimCLRAugment(16, mean=MEAN, std=STD, views=2, seed=3)


def raw_batches(count: int, size: int = 6) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (size, 3, 20, 20), dtype=torch.uint8, generator=gen),
             torch.arange(size) % 3, torch.arange(size) + size * k) for k in range(count)]


def serial_views(batches, epoch: int) -> list[torch.Tensor]:
    augment = augmenter()
    augment.set_epoch(epoch)
    return [augment(images) for images, _, _ in batches]


@pytest.mark.parametrize("epoch", [1, 2])
def test_views_made_ahead_are_the_serial_views_bit_for_bit(epoch):
    batches = raw_batches(4)
    augment = augmenter()
    augment.set_epoch(epoch)
    made = list(OverlappedViews(batches, augment, "cpu"))
    assert len(made) == len(batches) == len(OverlappedViews(batches, augment, "cpu"))
    for (views, labels, index), expected, (_, labels_in, index_in) in zip(made, serial_views(batches, epoch), batches):
        assert torch.equal(views, expected) and torch.equal(labels, labels_in) and torch.equal(index, index_in)
    assert not torch.equal(made[0][0], serial_views(batches, epoch + 1)[0])  # the epoch's seed matters


@pytest.mark.parametrize("taken", [1, 2, 3])
def test_rewind_leaves_the_generator_where_the_serial_loop_would_and_a_resumed_pass_continues(taken):
    batches = raw_batches(4)
    augment = augmenter()
    augment.set_epoch(1)
    views = OverlappedViews(batches, augment, "cpu")
    passing = iter(views)
    for _ in range(taken):
        next(passing)
    reference = augmenter()
    reference.set_epoch(1)
    for images, _, _ in batches[:taken]:
        reference(images)
    assert not torch.equal(augment.generator.get_state(), reference.generator.get_state())  # one batch ahead
    views.rewind()
    assert torch.equal(augment.generator.get_state(), reference.generator.get_state())
    resumed = [v for v, _, _ in OverlappedViews(batches[taken:], augment, "cpu")]
    assert all(torch.equal(a, b) for a, b in zip(resumed, serial_views(batches, 1)[taken:]))


def test_rewind_after_the_last_batch_changes_nothing():
    batches = raw_batches(2)
    augment = augmenter()
    augment.set_epoch(1)
    views = OverlappedViews(batches, augment, "cpu")
    list(views)
    state = augment.generator.get_state()
    views.rewind()
    assert torch.equal(augment.generator.get_state(), state)


def epoch_losses(batches, augment: BatchSimCLRAugment | None) -> tuple[dict, list[torch.Tensor]]:
    """One epoch of the recipe's `train_epoch` over `batches` with a seeded linear encoder;
    the record and every step's embeddings."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 8))
    outputs: list[torch.Tensor] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        outputs.append(model(x))
        return outputs[-1]

    record = one_cpu_epoch(batches, augment, forward, torch.optim.SGD(model.parameters(), lr=0.5),
                           build_loss("hscl-beta"))
    return record, [z.detach() for z in outputs]


def test_an_epoch_through_the_overlap_trains_as_one_fed_the_serial_views():
    batches = raw_batches(5)
    augment = augmenter()
    augment.set_epoch(1)
    overlapped, z_overlapped = epoch_losses(batches, augment)
    premade = [(views, labels, index) for views, (_, labels, index) in zip(serial_views(batches, 1), batches)]
    serial, z_serial = epoch_losses(premade, None)
    assert len(z_overlapped) == len(z_serial) == 5
    assert all(torch.equal(a, b) for a, b in zip(z_overlapped, z_serial))
    assert overlapped["train_loss"] == serial["train_loss"]
    assert overlapped["assumption_fraction"] == serial["assumption_fraction"]


def test_the_benchmarks_page_quotes_the_gpu_measurements_as_the_files_hold_them():
    from helpers import REPO, load_script
    from hscl_zoo._files import replace_block

    report = load_script("tools", "overlap_report")
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert replace_block(page, report.BLOCK, report.render()) == page, "python tools/overlap_report.py --quote docs/benchmarks.md"
    rows = report.rates()
    # ms per step and views per second are one measurement: 512 x 2 views a step
    assert all(abs(row["img_per_s"] * row["ms_per_step"] / 1e3 - 1024) < 1e-6 for row in rows.values())
    before, after = report.outside()
    for timings in [*before, after]:  # the items add up to the run's time outside its epochs' steps
        assert abs(sum(timings["items"].values()) - timings["outside_training"]) < 1e-2
        assert abs(timings["training"] + timings["outside_training"] - timings["wall"]) < 1e-2
