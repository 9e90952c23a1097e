"""The training summary's negative count is what its name says: the count the batch size implies."""

import pytest

from hscl_zoo.publishing.hub_folder import expected_negatives_per_anchor, training_summary
from hscl_zoo.training import PretrainConfig


def counted_negatives(batch: int, views: int, classes: int, supervised: bool) -> set[int]:
    """Negatives of every anchor of a class-balanced batch (image b has label b % classes), counted one by one."""
    label = [b % classes for b in range(batch) for _ in range(views)]
    image = [b for b in range(batch) for _ in range(views)]
    return {
        sum(1 for j in range(batch * views) if image[j] != image[i] and (not supervised or label[j] != label[i]))
        for i in range(batch * views)
    }


@pytest.mark.parametrize("method", ["ucl", "hucl", "scl", "hscl-beta", "hscl-tau"])
@pytest.mark.parametrize("batch, views, classes", [(20, 2, 10), (30, 3, 5), (40, 2, 4)])
def test_expected_count_is_the_count_of_a_class_balanced_batch(method, batch, views, classes):
    cfg = PretrainConfig(method=method, batch_size=batch, views=views)
    (count,) = counted_negatives(batch, views, classes, supervised=method not in ("ucl", "hucl"))
    assert expected_negatives_per_anchor(cfg, classes) == count


def test_summary_names_it_as_expected_not_measured():
    summary = training_summary(PretrainConfig(method="scl", batch_size=500), num_processes=1, num_classes=10)
    assert summary["expected_negatives_per_anchor"] == 900
    assert "negatives_per_anchor" not in summary
