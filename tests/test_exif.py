"""The EXIF orientation (issue 52, item 1): every read of an image file gives the upright
picture, Pillow's `ImageOps.exif_transpose` of the stored pixels, and a damaged or
hostile EXIF block reads as upright (1) without failing; a damaged file's error says what
is wrong without TensorFlow's internals (item 12).

The files are written here with Pillow (`exif=` with the Orientation tag, 0x0112) or
built by hand where Pillow would not write them.
"""

import io
import os
import pathlib
import struct
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from keras_autoshuffle import applications, data, prediction
from keras_autoshuffle.data import exif

# A picture no turn or mirror maps onto itself: random pixels, 12 x 20.
PICTURE = np.random.default_rng(52).integers(0, 256, (12, 20, 3), dtype=np.uint8)


def _exif(orientation):
    tags = Image.Exif()
    tags[exif.ORIENTATION_TAG] = orientation
    return tags.tobytes()


def _encoded(pixels, fmt, exif_bytes=None):
    buffer = io.BytesIO()
    options = {"quality": 95} if fmt == "JPEG" else {}
    if exif_bytes is not None:
        options["exif"] = exif_bytes
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


def _stored(contents):
    """The pixels as the file stores them: TensorFlow's decode, no orientation applied."""
    if tf.io.is_jpeg(contents):
        return tf.io.decode_jpeg(contents, channels=3, dct_method="INTEGER_ACCURATE").numpy()
    return tf.io.decode_png(contents, channels=3).numpy()


def _pillow_upright(pixels, exif_bytes):
    """Pillow's `exif_transpose` of `pixels` carrying `exif_bytes`."""
    image = Image.fromarray(pixels)
    image.info["exif"] = exif_bytes
    return np.asarray(ImageOps.exif_transpose(image))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_every_read_is_the_upright_picture_of_exif_transpose(tmp_path, fmt):
    for orientation in range(1, 9):
        path = tmp_path / f"{orientation}.{fmt.lower()}"
        path.write_bytes(_encoded(PICTURE, fmt, _exif(orientation)))
        contents = path.read_bytes()
        expected = _pillow_upright(_stored(contents), _exif(orientation))
        assert expected.shape[:2] == ((20, 12) if orientation >= 5 else (12, 20))
        assert int(exif.orientation(tf.constant(contents))) == orientation
        np.testing.assert_array_equal(data.read_image(path), expected, err_msg=path.name)
        np.testing.assert_array_equal(data.decode_rgb(tf.constant(contents)), expected)
        assert data.check_image_file(path) == (expected.shape[1], expected.shape[0])


def _with_segment(jpeg, marker, payload):
    """`jpeg` with a segment inserted right after its start marker."""
    return jpeg[:2] + struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload + jpeg[2:]


def _tiff(entries, order="<", directory=8, count=None):
    """A TIFF structure (EXIF data): its header, then IFD0 of `entries` (tag, type,
    count, value as 4 bytes)."""
    magic = b"II" if order == "<" else b"MM"
    head = magic + struct.pack(order + "HI", 42, directory)
    body = struct.pack(order + "H", len(entries) if count is None else count)
    for tag, kind, number, value in entries:
        body += struct.pack(order + "HHI", tag, kind, number) + value
    return head + body + b"\0\0\0\0"


def _short(value, order="<"):
    return struct.pack(order + "H", value) + b"\0\0"


def test_a_big_endian_block_among_other_segments_and_tags():
    """A camera's layout: JFIF, then EXIF in Motorola order, the orientation among other
    tags; also a comment segment before it."""
    plain = _encoded(PICTURE, "JPEG")
    entries = [
        (0x010F, 2, 4, b"Cam\0"),  # Make, ASCII
        (0x0112, 3, 1, _short(8, ">")),
        (0x011A, 5, 1, struct.pack(">I", 0)),
    ]
    contents = _with_segment(plain, 0xE1, b"Exif\0\0" + _tiff(entries, ">"))
    contents = _with_segment(contents, 0xFE, b"a comment")
    assert int(exif.orientation(tf.constant(contents))) == 8
    expected = np.rot90(_stored(plain))  # 8: a quarter turn anticlockwise
    np.testing.assert_array_equal(data.decode_rgb(tf.constant(contents)), expected)
    # After a table segment (not where cameras write it): still read, as Pillow does.
    table = plain.index(b"\xff\xdb")
    table += 2 + struct.unpack(">H", plain[table + 2 : table + 4])[0]
    block = b"Exif\0\0" + _tiff([(0x0112, 3, 1, _short(6))])
    late = plain[:table] + struct.pack(">BBH", 0xFF, 0xE1, len(block) + 2) + block + plain[table:]
    with Image.open(io.BytesIO(late)) as image:
        assert image.getexif()[0x0112] == 6
    assert int(exif.orientation(tf.constant(late))) == 6
    # A tag given twice: the first counts, as Pillow reads it.
    for values in ([6, 3], [3, 6]):
        block = b"Exif\0\0" + _tiff([(0x0112, 3, 1, _short(v)) for v in values])
        contents = _with_segment(plain, 0xE1, block)
        with Image.open(io.BytesIO(contents)) as image:
            assert image.getexif()[0x0112] == values[0]
        assert int(exif.orientation(tf.constant(contents))) == values[0]


# EXIF blocks that give no usable orientation: each reads as 1 (the stored pixels).
HOSTILE = {
    "orientation 0": _tiff([(0x0112, 3, 1, _short(0))]),
    "orientation 9": _tiff([(0x0112, 3, 1, _short(9))]),
    "orientation 65535": _tiff([(0x0112, 3, 1, _short(65535))]),
    "a LONG orientation": _tiff([(0x0112, 4, 1, struct.pack("<I", 6))]),
    "two values": _tiff([(0x0112, 3, 2, _short(6))]),
    "IFD0 past the end": _tiff([(0x0112, 3, 1, _short(6))], directory=0xFFFFFFFF),
    "entries cut off": _tiff([(0x0112, 3, 1, _short(6))])[:20],
    "65535 entries declared, none there": _tiff([], count=65535),
    "no byte order": b"XX" + _tiff([(0x0112, 3, 1, _short(6))])[2:],
    "a TIFF header only": b"II*\0",
    "empty": b"",
}


def test_a_damaged_exif_block_reads_as_upright_silently(tmp_path):
    plain = _encoded(PICTURE, "JPEG")
    path = tmp_path / "photo.jpg"
    for name, block in HOSTILE.items():
        path.write_bytes(_with_segment(plain, 0xE1, b"Exif\0\0" + block))
        assert int(exif.orientation(tf.constant(path.read_bytes()))) == 1, name
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "Corrupt EXIF data" from Pillow either
            np.testing.assert_array_equal(data.read_image(path), _stored(plain), err_msg=name)


# Files that end at or just after the EXIF header (the segment or chunk declares more).
CUT_OFF = {
    "JPEG, at the header": b"\xff\xd8\xff\xe1\x00\x10Exif",
    "JPEG, a byte later": b"\xff\xd8\xff\xe1\x00\x10Exif\x00",
    "PNG, at the header": b"\x89PNG\r\n\x1a\n\x00\x00\x00\x20eXIfExif",
    "PNG, at the chunk type": b"\x89PNG\r\n\x1a\n\x00\x00\x00\x20eXIf",
}


def test_a_file_cut_off_after_its_exif_header_reads_as_upright():
    read_in_graph = tf.function(exif.orientation)
    mapped = tf.data.Dataset.from_tensor_slices(list(CUT_OFF.values())).map(exif.orientation)
    for name, contents in CUT_OFF.items():
        assert int(exif.orientation(tf.constant(contents))) == 1, name
        assert int(read_in_graph(tf.constant(contents))) == 1, name
    assert [int(value) for value in mapped] == [1] * len(CUT_OFF)


def test_garbled_exif_blocks_never_fail():
    """Random bytes after the EXIF header, and random bytes in a TIFF structure: an
    orientation from 1 to 8 every time, no error."""
    rng = np.random.default_rng(0)
    plain = _encoded(PICTURE, "JPEG")
    valid = _tiff([(0x0112, 3, 1, _short(6))] * 3)
    for _ in range(8):
        noise = rng.integers(0, 256, rng.integers(1, 200), dtype=np.uint8).tobytes()
        flipped = bytearray(valid)
        flipped[rng.integers(0, len(valid))] ^= 1 << int(rng.integers(0, 8))
        for block in (noise, b"II*\0" + noise, bytes(flipped)):
            contents = _with_segment(plain, 0xE1, b"Exif\0\0" + block)
            assert 1 <= int(exif.orientation(tf.constant(contents))) <= 8


def test_the_work_is_bounded_whatever_a_file_declares():
    plain = _encoded(PICTURE, "JPEG")
    rotated = _with_segment(plain, 0xE1, b"Exif\0\0" + _tiff([(0x0112, 3, 1, _short(6))]))
    # The EXIF segment after more than MAX_SEGMENTS comments is not looked for.
    crowded = rotated
    for _ in range(exif.MAX_SEGMENTS):
        crowded = _with_segment(crowded, 0xFE, b"")
    # A PNG chunk that declares 2 GiB of EXIF data and ends.
    png = _encoded(PICTURE, "PNG")
    huge = png[:33] + struct.pack(">I", 2**31 - 1) + b"eXIfII*\0" + png[33:]
    started = time.perf_counter()
    assert int(exif.orientation(tf.constant(rotated))) == 6
    assert int(exif.orientation(tf.constant(crowded))) == 1
    assert int(exif.orientation(tf.constant(huge))) == 1
    assert time.perf_counter() - started < 10


def test_a_scaled_decode_is_the_same_upright_picture(tmp_path):
    """A training decode (libjpeg's 1/r scale, r chosen by the shorter side whatever the
    orientation) is turned as the full one: the transpose of the scaled stored pixels,
    and the full upright picture shrunk r times within a few levels."""
    y, x = np.mgrid[0:200, 0:320]
    photo = np.stack([x * 0.7, y * 1.2, (x + y) * 0.4], -1).astype(np.uint8)  # smooth
    contents = _encoded(photo, "JPEG", _exif(6))
    scaled = data.decode_rgb(tf.constant(contents), min_side=32).numpy()
    stored = tf.io.decode_jpeg(contents, channels=3, ratio=4, dct_method="INTEGER_ACCURATE")
    np.testing.assert_array_equal(scaled, _pillow_upright(stored.numpy(), _exif(6)))
    assert scaled.shape == (80, 50, 3)  # the stored 200 x 320 at 1/4, upright
    full = data.decode_rgb(tf.constant(contents)).numpy().astype(float)
    shrunk = full.reshape(80, 4, 50, 4, 3).mean(axis=(1, 3))
    assert np.abs(shrunk - scaled).mean() < 2


@pytest.mark.slow
def test_the_pipelines_and_the_cache_read_the_upright_picture(tmp_path):
    """Evaluation (and int8 calibration, which reads evaluation epochs) and the decoded-
    image cache that training reads give the upright picture."""
    pixels = np.random.default_rng(1).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(_encoded(pixels, "JPEG", _exif(6)))
    (tmp_path / "a" / "y.png").write_bytes(_encoded(pixels, "PNG", _exif(3)))
    examples = [("a/x.jpg", 0), ("a/y.png", 1)]
    upright = [data.read_image(tmp_path / path) for path, _ in examples]
    assert [image.shape for image in upright] == [(40, 24, 3), (24, 40, 3)]
    val = data.ImageFolderData(tmp_path, examples, 2, image_size=16, training=False)
    images, _ = next(iter(val.eval_dataset(2)))
    preprocess = applications.evaluation_preprocessing(16)
    for image, expected in zip(images.numpy(), upright, strict=True):
        np.testing.assert_allclose(image, preprocess(expected[None])[0], atol=2e-5)
    train = data.ImageFolderData(tmp_path, examples, 2, image_size=16)
    train.cache_images(tmp_path / "cache")
    for (file, height, width), expected in zip(train._cached, upright, strict=True):
        contents = tf.io.read_file(file)
        cached = data.image_cache.read_cached(contents, tf.constant([height, width]))
        np.testing.assert_array_equal(cached, expected)  # no larger than decode_min_side


def test_predict_classifies_the_upright_picture(tmp_path):
    """`autoshuffle-predict`'s reading (`prediction.predict_files`) gives the model the
    upright picture; here a model of raw pixels that records what it is given."""
    given = []

    def run(batch):
        given.append(batch)
        return np.full((len(batch), 2), 0.5, np.float32)

    classifier = prediction.Classifier(run, ["a", "b"], preprocess=None)
    path = tmp_path / "phone.jpg"
    path.write_bytes(_encoded(PICTURE, "JPEG", _exif(6)))
    prediction.predict_files(classifier, [path])
    expected = _pillow_upright(_stored(path.read_bytes()), _exif(6))
    np.testing.assert_array_equal(given[0][0], expected)


# -- a damaged file's error (item 12) --------------------------------------------------


def _cut_jpeg(path):
    """A JPEG whose header is intact (Pillow reads it) and whose data is cut short."""
    contents = _encoded(PICTURE, "JPEG")
    path.write_bytes(contents[: len(contents) * 2 // 3])
    with Image.open(path) as image:
        assert image.size == (20, 12)
    return path


def _assert_plain(error, path):
    message = str(error)
    assert "not a decodable JPEG: its data is truncated or corrupt" in message
    assert f"Received: path={str(path)!r}" in message
    for internal in ("function_node", "job:localhost", "{{", "[Op:", "Graph execution"):
        assert internal not in message, message


def test_a_damaged_file_is_named_without_tensorflows_internals(tmp_path):
    (tmp_path / "a").mkdir()
    path = _cut_jpeg(tmp_path / "a" / "cut.jpg")
    for read in (data.read_image, data.check_image_file):
        with pytest.raises(data.ImageFileError) as caught:
            read(path)
        _assert_plain(caught.value, path)
    # The scan names it too, ending with what to do.
    (tmp_path / "b").mkdir()
    for name in ("x.png", "y.png"):
        (tmp_path / "b" / name).write_bytes(_encoded(PICTURE, "PNG"))
    with pytest.raises(data.ImageFolderError) as caught:
        data.scan_image_folder(tmp_path)
    assert str(path) in str(caught.value) and "not a decodable JPEG" in str(caught.value)
    assert "function_node" not in str(caught.value)
    # A file damaged after it was checked: the cache build names it.
    good = tmp_path / "b" / "x.png"
    train = data.ImageFolderData(tmp_path, [("b/x.png", 0), ("b/y.png", 1)], 2, 16)
    _cut_jpeg(good)
    with pytest.raises(data.ImageFileError) as caught:
        train.cache_images(tmp_path / "cache")
    _assert_plain(caught.value, good)
    assert os.path.exists(tmp_path / "cache")


def test_predict_names_a_damaged_file_without_tensorflows_internals(tmp_path):
    classifier = prediction.Classifier(lambda batch: np.ones((len(batch), 1)), ["a"], None)
    path = _cut_jpeg(tmp_path / "cut.jpg")
    with pytest.raises(data.ImageFileError) as caught:
        prediction.predict_files(classifier, [path])
    _assert_plain(caught.value, path)
    (result,) = prediction.predict_files(classifier, [path], skip_damaged=True)
    _assert_plain(result["error"], path)


def test_a_cache_file_written_before_the_upright_pixels_is_rebuilt(tmp_path):
    # "KAS1" files hold the stored (sideways) pixels under the names of today's files.
    from keras_autoshuffle.data import image_cache

    path = tmp_path / "photo.jpg"
    path.write_bytes(_encoded(PICTURE, "JPEG"))
    [(file, height, width)] = image_cache.build_image_cache([str(path)], tmp_path / "c", 64)
    fresh = pathlib.Path(file).read_bytes()
    old = b"KAS1" + fresh[4 : image_cache.HEADER_BYTES] + bytes(3 * height * width)
    pathlib.Path(file).write_bytes(old)
    image_cache.build_image_cache([str(path)], tmp_path / "c", 64)
    assert pathlib.Path(file).read_bytes() == fresh
