"""The code of `experiments/finetune_throughput.py` (issue 40's benchmark), on tiny inputs:
its arguments, photos, the JPEG scale it reports, its rows. No timing is asserted here."""

import argparse
import io
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from experiments import finetune_throughput as bench
from keras_autoshuffle import data


def test_photos_are_parsed_and_bad_ones_refused():
    assert bench.parse_photos("1600x1200:200") == (1600, 1200, 200)
    assert bench.parse_photos("640X480:3") == (640, 480, 3)
    for bad in ("1600x1200", "1600:200", "0x5:3", "axb:1", "4x4:0"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_photos(bad)


def _jpeg_bits_per_pixel(pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return 8 * len(buffer.getvalue()) / (pixels.shape[0] * pixels.shape[1])


def test_photos_are_seeded_and_compress_between_flat_colour_and_noise():
    image = bench.photo(240, 320, seed=3)
    assert image.shape == (240, 320, 3) and image.dtype == np.uint8
    np.testing.assert_array_equal(image, bench.photo(240, 320, seed=3))
    assert not np.array_equal(image, bench.photo(240, 320, seed=4))
    noise = np.random.default_rng(0).integers(0, 256, image.shape, dtype=np.uint8)
    flat = np.full(image.shape, 128, np.uint8)
    bits = _jpeg_bits_per_pixel(image)
    assert 4 * _jpeg_bits_per_pixel(flat) < bits < _jpeg_bits_per_pixel(noise) / 2


def test_the_reported_scale_is_the_pipelines():
    # min_side 32: shorter sides 249 -> 1/8 (ceil(249 / 8) = 32), 200 -> 1/4, 70 -> 1/2,
    # 62 -> 1/1; the pipeline's decode (data.decode_rgb) gives ceil(side / r) pixels.
    for (width, height), ratio in {
        (300, 249): 8,
        (200, 260): 4,
        (90, 70): 2,
        (80, 62): 1,
    }.items():
        assert bench.expected_ratio(width, height, 32) == ratio
        buffer = io.BytesIO()
        Image.fromarray(bench.photo(height, width, 0)).save(buffer, "JPEG", quality=90)
        decoded = data.decode_rgb(tf.constant(buffer.getvalue()), min_side=32)
        assert decoded.shape == (-(-height // ratio), -(-width // ratio), 3)


def test_photos_are_written_once_in_two_classes(tmp_path):
    root, examples = bench.write_photos(tmp_path, 40, 30, 3)
    assert examples == [
        ("c0/photo_0000.jpg", 0),
        ("c1/photo_0001.jpg", 1),
        ("c0/photo_0002.jpg", 0),
    ]
    path = tmp_path / "40x30_q90" / "c1" / "photo_0001.jpg"
    assert str(path).startswith(root) and data.check_image_file(path) == (40, 30)
    path.write_bytes(b"kept")  # an existing file is not written again
    assert bench.write_photos(tmp_path, 40, 30, 3) == (root, examples)
    assert path.read_bytes() == b"kept"


def test_rows_hold_images_per_second_and_paired_ratios(tmp_path):
    photos, widths = [(1600, 1200, 64)], [0.5]
    pipe_full, pipe_scaled = ("pipeline", "1600x1200", "full"), ("pipeline", "1600x1200", "scaled")
    pipe_cached = ("pipeline", "1600x1200", "cached")
    step1, step2 = ("step", 0.5, 1), ("step", 0.5, 2)
    counts = {pipe_full: 64, pipe_scaled: 64, pipe_cached: 64, step1: 32, step2: 32}
    samples = {  # seconds per round, three rounds
        pipe_full: [4.0, 2.0, 8.0],
        pipe_scaled: [1.0, 1.0, 2.0],
        pipe_cached: [0.25, 0.5, 0.5],
        step1: [0.5, 0.25, 1.0],
        step2: [2.0, 1.0, 4.0],
    }
    rows = bench.summarise(samples, counts, photos, widths, min_side=448)
    by = {(r["measure"], r.get("decode"), r.get("phase")): r for r in rows}
    scaled = by[("pipeline", "scaled", None)]
    assert scaled["jpeg_scale"] == "1/2" and by[("pipeline", "full", None)]["jpeg_scale"] == "1/1"
    assert scaled["images_per_s"]["rounds"] == [64.0, 64.0, 32.0]
    assert scaled["images_per_s"]["median"] == 64.0
    assert by[("step", None, 2)]["images_per_s"]["rounds"] == [16.0, 32.0, 8.0]
    # Per round: scaled / full images/s = 4, 2, 4; pipeline / step: phase 1 64/64, 64/128,
    # 32/32 -> 1, 0.5, 1; phase 2 64/16, 64/32, 32/8 -> 4, 2, 4.
    assert by[("scaled_over_full_decode", None, None)]["ratio"]["median"] == 4.0
    phase1, phase2 = (by[("pipeline_over_step", "scaled", p)] for p in (1, 2))
    assert phase1["ratio"]["median"] == 1.0 and phase1["meets_target"] is False
    assert phase2["ratio"]["median"] == 4.0 and phase2["meets_target"] is True
    # Cached: 256, 128, 128 images/s; over scaled 4, 2, 4; over the phase 1 step 4, 2, 4.
    assert by[("pipeline", "cached", None)]["jpeg_scale"] is None
    assert by[("cached_over_scaled_decode", None, None)]["ratio"]["median"] == 4.0
    cached1 = by[("pipeline_over_step", "cached", 1)]
    assert cached1["ratio"]["median"] == 4.0 and cached1["meets_target"] is True
    document = {
        "rows": rows,
        "command": "python -m experiments.finetune_throughput",
        "rounds_done": 3,
        "environment": {"cpu": "x", "cores": 2, "tensorflow": "2", "onednn": "off"},
        "settings": {
            "target": 3.0,
            "photos": ["1600x1200:64"],
            "widths": [0.5],
            "size": 224,
            "batch": 32,
            "jpeg_quality": 90,
        },
    }
    text = bench.page(document)
    # Cached over the steps: phase 1 4x [2, 4], phase 2 16x: both by the median, one by
    # the interval's lower end.
    assert "in 2 of 2 cases (widths, phases, photo sizes) by the median ratio, 1 by" in text
    assert "| 1600x1200 | 128.0 | 64.0 | 16.0 |" in text
    path = tmp_path / "rows" / "out.json"
    bench.write_rows(str(path), {"rows": rows})
    assert json.loads(path.read_text()) == {"rows": rows}
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]
