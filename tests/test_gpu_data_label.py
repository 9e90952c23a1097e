"""The docs say the CIFAR-10 the GPU runs read is a JPEG (quality 75) re-encoding: its images'
quantisation tables are libjpeg's standard tables scaled for quality 75."""

from __future__ import annotations

import io

import pytest

from helpers import REPO, missing_data

CIFAR10 = REPO.parent / "shared" / "data" / "cifar10"
# libjpeg's (IJG) base tables, row-major (ITU-T T.81, Annex K)
LUMINANCE = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
             14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
             49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]
CHROMINANCE = [17, 18, 24, 47] + [99] * 4 + [18, 21, 26, 66] + [99] * 4 + [24, 26, 56] + [99] * 5 + [47, 66] + [99] * 38


def scaled(table: list[int], quality: int) -> list[int]:
    """libjpeg's jpeg_quality_scaling and jpeg_add_quant_table (baseline: clamped to 1..255)."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return [min(max((q * scale + 50) // 100, 1), 255) for q in table]


def test_the_gpu_runs_cifar10_is_jpeg_quality_75():
    if not CIFAR10.is_dir():
        pytest.skip(missing_data(CIFAR10))
    pq = pytest.importorskip("pyarrow.parquet")
    from PIL import Image

    for split in ("train", "test"):
        rows = pq.read_table(next(CIFAR10.glob(f"{split}-*.parquet")), columns=["img"]).slice(0, 200).to_pylist()
        for row in rows:
            image = Image.open(io.BytesIO(row["img"]["bytes"]))
            assert image.format == "JPEG"
            assert list(image.quantization[0]) == scaled(LUMINANCE, 75)
            assert list(image.quantization[1]) == scaled(CHROMINANCE, 75)
