"""Image files and folders of labelled images (issue 40): `data.images` (checked decoding
of one untrusted file), `applications.evaluation_preprocessing`, `data.image_folder` (the
scan, the recorded split, the `ImageFolderData` pipelines).

The images are tiny files written here with Pillow; expected pixels are Pillow's own
decode (`convert("RGB")`) or computed in NumPy.
"""

import io
import struct
import time
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_autoshuffle import applications, data

MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def _pixels(height, width, channels=3, seed=0):
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _save(path, image, **options):
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return path


def _png_bytes(width, height, bit_depth, color_type, rows):
    """A PNG built by hand: IHDR as given, `rows` (bytes, filter bytes included) in IDAT."""

    def chunk(kind, body):
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _pillow_rgb(path):
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


# -- one image file -------------------------------------------------------------------

LOSSLESS = {
    "rgb.png": lambda: Image.fromarray(_pixels(5, 7)),
    "gray.png": lambda: Image.fromarray(_pixels(6, 3, 1)),
    "rgba.png": lambda: Image.fromarray(_pixels(4, 9, 4)),
    "gray_alpha.png": lambda: Image.fromarray(_pixels(3, 5, 4)).convert("LA"),
    "palette.png": lambda: Image.fromarray(_pixels(7, 5)).convert("P"),
    "rgb.bmp": lambda: Image.fromarray(_pixels(5, 3)),
    "gray.bmp": lambda: Image.fromarray(_pixels(3, 7, 1)),
    "rgba.bmp": lambda: Image.fromarray(_pixels(2, 5, 4)),
    "one.gif": lambda: Image.fromarray(_pixels(9, 4)).convert("P"),
}


@pytest.mark.parametrize("name", sorted(LOSSLESS))
def test_lossless_files_decode_to_pillows_pixels(tmp_path, name):
    path = _save(tmp_path / name, LOSSLESS[name]())
    expected = _pillow_rgb(path)
    image = data.read_image(path)
    assert image.dtype == np.uint8 and image.shape == expected.shape
    np.testing.assert_array_equal(image, expected)
    assert data.check_image_file(path) == (expected.shape[1], expected.shape[0])


def test_an_animated_gif_gives_its_first_frame(tmp_path):
    first, second = (Image.fromarray(_pixels(6, 5, seed=s)).convert("P") for s in (1, 2))
    path = _save(tmp_path / "two.GIF", first, save_all=True, append_images=[second])
    with Image.open(path) as image:
        assert image.n_frames == 2
    np.testing.assert_array_equal(data.read_image(path), _pillow_rgb(path))
    assert not np.array_equal(data.read_image(path), np.asarray(second.convert("RGB")))


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_jpeg_decodes_close_to_pillow(tmp_path, mode):
    image = Image.fromarray(_pixels(11, 13)).convert(mode)
    path = _save(tmp_path / "photo.JPEG", image, quality=95)
    decoded = data.read_image(path).astype(int)
    # The accurate inverse DCT, as Pillow's (decode_image's fast one is up to 8 off here);
    # two libjpeg builds may still round the colour conversion differently.
    assert np.abs(decoded - _pillow_rgb(path).astype(int)).max() <= 1
    assert data.check_image_file(path) == (13, 11)


def test_16_bit_png_keeps_the_high_byte(tmp_path):
    values = np.random.default_rng(0).integers(0, 65536, (3, 4, 3), dtype=np.uint16)
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in values)
    path = tmp_path / "deep.png"
    path.write_bytes(_png_bytes(4, 3, 16, 2, rows))
    np.testing.assert_array_equal(data.read_image(path), (values >> 8).astype(np.uint8))


def test_decode_rgb_in_a_graph_has_three_channels(tmp_path):
    path = _save(tmp_path / "gray.png", Image.fromarray(_pixels(4, 6, 1)))
    decode = tf.function(data.decode_rgb, input_signature=[tf.TensorSpec([], tf.string)])
    spec = decode.get_concrete_function().structured_outputs
    assert spec.shape.as_list() == [None, None, 3] and spec.dtype == tf.uint8
    np.testing.assert_array_equal(decode(path.read_bytes()).numpy(), _pillow_rgb(path))


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path):
    # 30000 x 30000 RGB (2.7 GB decoded): two rows of zeros in a file of a few hundred bytes.
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_bytes(30000, 30000, 8, 2, bytes(2 * 90001)))
    start = time.perf_counter()
    with pytest.raises(data.ImageFileError, match="decompression bomb") as caught:
        data.check_image_file(path)
    assert time.perf_counter() - start < 1.0
    assert repr(str(path)) in str(caught.value)


def test_an_image_over_max_pixels_is_refused(tmp_path):
    # 10000 x 6000: below Pillow's own bomb limits, above MAX_PIXELS (50 million).
    path = tmp_path / "large.png"
    path.write_bytes(_png_bytes(10000, 6000, 8, 0, bytes(10001)))
    with pytest.raises(data.ImageFileError, match="10000 x 6000 = 60000000 pixels"):
        data.read_image(path)
    small = _save(tmp_path / "small.png", Image.fromarray(_pixels(10, 10)))
    assert data.check_image_file(small, max_pixels=100) == (10, 10)
    with pytest.raises(data.ImageFileError, match=r"max_pixels \(99\)"):
        data.check_image_file(small, max_pixels=99)


def test_gif_frames_count_together(tmp_path):
    frames = [Image.fromarray(_pixels(10, 10, seed=s)).convert("P") for s in range(3)]
    path = _save(tmp_path / "anim.gif", frames[0], save_all=True, append_images=frames[1:])
    assert data.check_image_file(path, max_pixels=300) == (10, 10)
    with pytest.raises(data.ImageFileError, match="3 frames declare 300 pixels"):
        data.check_image_file(path, max_pixels=299)


def _bmp(mode):
    def make(path):
        _save(path, Image.fromarray(_pixels(4, 6)).convert(mode))

    return make


def _truncated(suffix, fraction=0.6):
    def make(path):
        buffer = io.BytesIO()
        Image.fromarray(_pixels(20, 30)).save(buffer, format=suffix)
        path.write_bytes(buffer.getvalue()[: int(len(buffer.getvalue()) * fraction)])

    return make


BAD_FILES = {
    "palette.bmp": (_bmp("P"), "reads this BMP variant"),
    "bilevel.bmp": (_bmp("1"), "TensorFlow cannot decode this BMP"),
    "notes.jpg": (lambda p: p.write_text("not an image"), "not an image file"),
    "empty.png": (lambda p: p.write_bytes(b""), "is empty"),
    "scan.png": (lambda p: _save(p, Image.fromarray(_pixels(3, 3)), format="TIFF"), "TIFF"),
    "cut.jpg": (_truncated("JPEG"), "TensorFlow cannot decode this JPEG"),
    "cut.png": (_truncated("PNG"), "TensorFlow cannot decode this PNG"),
    "cut.gif": (_truncated("GIF"), "TensorFlow cannot decode this GIF"),
    "missing.png": (lambda p: None, "does not exist"),
    "folder.png": (lambda p: p.mkdir(), "is a folder"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_are_refused_naming_them(tmp_path, name):
    make, problem = BAD_FILES[name]
    path = tmp_path / name
    make(path)
    for read in (data.check_image_file, data.read_image):
        with pytest.raises(data.ImageFileError, match=problem) as caught:
            read(path)
        assert str(caught.value).endswith(f"Received: path={str(path)!r}")


def test_max_pixels_must_be_a_positive_integer(tmp_path):
    path = _save(tmp_path / "a.png", Image.fromarray(_pixels(2, 2)))
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_pixels"):
            data.check_image_file(path, max_pixels=bad)


def test_image_extensions_match_in_any_case():
    assert data.has_image_extension("a/B.JPG") and data.has_image_extension("c.Png")
    assert not data.has_image_extension("d.tiff") and not data.has_image_extension("jpg")


# -- evaluation_preprocessing ---------------------------------------------------------


def test_evaluation_preprocessing_of_a_square_is_the_normalisation(tmp_path):
    # resize_size == image_size on a square of that size: the resize and crop keep it all.
    image = _pixels(40, 40)
    out = applications.evaluation_preprocessing(40, resize_size=40)(image[None])
    expected = (image / 255.0 - MEAN) / STD
    np.testing.assert_allclose(np.asarray(out)[0], expected, atol=1e-5)


def test_evaluation_preprocessing_crops_the_centre():
    # 40 x 70, resized to a shorter side of 40: unchanged; the crop starts at round(15).
    image = _pixels(40, 70, seed=4)
    out = np.asarray(applications.evaluation_preprocessing(40, 40)(image[None]))[0]
    np.testing.assert_allclose(out, (image[:, 15:55] / 255.0 - MEAN) / STD, atol=1e-5)


def test_evaluation_preprocessing_defaults_to_torchvisions_ratio():
    image = _pixels(50, 61, seed=5)[None]
    for size, resize in ((224, 256), (160, 183), (112, 128)):
        model = applications.evaluation_preprocessing(size)
        assert model.get_layer("resize_crop").resize_size == resize
        assert model.output_shape == (None, size, size, 3)
    np.testing.assert_array_equal(
        applications.imagenet_preprocessing(1.5)(image),
        applications.evaluation_preprocessing(224, 232)(image),
    )


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"image_size": 15}, "image_size"),
        ({"image_size": 4097}, "image_size"),
        ({"image_size": 64.0}, "image_size"),
        ({"image_size": True}, "image_size"),
        ({"image_size": 64, "resize_size": 63}, "resize_size"),
        ({"image_size": 64, "resize_size": 129}, "resize_size"),
        ({"image_size": 64, "resize_size": "72"}, "resize_size"),
    ],
)
def test_evaluation_preprocessing_refuses_bad_sizes(arguments, name):
    with pytest.raises(ValueError, match=f"Received: {name}="):
        applications.evaluation_preprocessing(**arguments)
