"""Image files and folders of labelled images (issue 40): `data.images` (checked decoding
of one untrusted file), `applications.evaluation_preprocessing`, `data.image_folder` (the
scan, the recorded split, the `ImageFolderData` pipelines).

The images are tiny files written here with Pillow; expected pixels are Pillow's own
decode (`convert("RGB")`) or computed in NumPy.
"""

import importlib
import io
import os
import struct
import time
import zlib

import keras
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
    "bilevel.bmp": (_bmp("1"), "not a decodable BMP"),
    "notes.jpg": (lambda p: p.write_text("not an image"), "not an image file"),
    "empty.png": (lambda p: p.write_bytes(b""), "is empty"),
    "scan.png": (lambda p: _save(p, Image.fromarray(_pixels(3, 3)), format="TIFF"), "TIFF"),
    "cut.jpg": (_truncated("JPEG"), "not a decodable JPEG: its data is truncated or corrupt"),
    "cut.png": (_truncated("PNG"), "not a decodable PNG"),
    "cut.gif": (_truncated("GIF"), "not a decodable GIF"),
    "missing.png": (lambda p: None, "does not exist"),
    "folder.png": (lambda p: p.mkdir(), "is a folder"),
    "pipe.png": (os.mkfifo, "not a regular file"),  # opening it must not wait for a writer
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


# -- folders of labelled images ---------------------------------------------------------


def _write_class(folder, count, size=(6, 5), seed=0, suffix=".png"):
    """`count` distinct images in `folder` (the pixels depend on `seed` and the index)."""
    for i in range(count):
        image = Image.fromarray(_pixels(size[1], size[0], seed=seed * 1000 + i))
        _save(folder / f"img_{i:03d}{suffix}", image)


def _folder(root, counts):
    for seed, (name, count) in enumerate(counts.items()):
        _write_class(root / name, count, seed=seed)
    return root


def test_a_folder_is_split_per_class_with_a_seed(tmp_path):
    root = _folder(tmp_path / "photos", {"b": 10, "a": 5, "c": 2})
    split = data.scan_image_folder(root, val_fraction=0.2, split_seed=3)
    assert split.class_names == ("a", "b", "c") and split.source == "split"
    # round(n * 0.2) per class, at least 1 and at most n - 1: a 5 -> 1, b 10 -> 2, c 2 -> 1.
    for examples, counts in ((split.val, [1, 2, 1]), (split.train, [4, 8, 1])):
        assert np.bincount([label for _, label in examples]).tolist() == counts
    listed = [path for path, _ in split.train + split.val]
    assert sorted(listed) == sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))
    for path, label in split.train + split.val:
        assert path.split("/")[0] == split.class_names[label]
    np.testing.assert_array_equal(split.train_labels, [0] * 4 + [1] * 8 + [2])
    assert split == data.scan_image_folder(root, val_fraction=0.2, split_seed=3)
    other = data.scan_image_folder(root, val_fraction=0.2, split_seed=4)
    assert set(other.val) != set(split.val) and other.val_fraction == 0.2


def test_classes_and_files_are_those_keras_finds(tmp_path):
    # Unicode names, upper case before lower case, an image in a nested folder, an upper
    # case extension, a JPEG; a text file and a hidden file ignored.
    root = _folder(tmp_path, {"Zèbre": 2, "apple": 2, "日本": 3})
    _write_class(root / "apple" / "more" / "deeper", 1, seed=9, suffix=".JPG")
    (root / "apple" / "notes.txt").write_text("ignored")
    (root / "Zèbre" / ".hidden.txt").write_text("ignored")
    split = data.scan_image_folder(root, val_fraction=0.5)
    assert split.ignored == 2 and split.skipped == ()
    found = keras.utils.image_dataset_from_directory(root, image_size=(8, 8), shuffle=False)
    assert split.class_names == tuple(found.class_names) == ("Zèbre", "apple", "日本")
    expected = {
        (os.path.relpath(path, root), int(label))
        for path, label in zip(found.file_paths, np.concatenate([y for _, y in found]), strict=True)
    }
    assert set(split.train + split.val) == expected


def test_train_and_val_folders_are_the_split(tmp_path):
    _folder(tmp_path / "train", {"dog": 3, "cat": 2})
    _folder(tmp_path / "validation", {"dog": 1, "cat": 1})
    split = data.scan_image_folder(tmp_path)
    assert split.source == "folders" and split.class_names == ("cat", "dog")
    assert [p for p, _ in split.train] == [f"train/cat/img_00{i}.png" for i in range(2)] + [
        f"train/dog/img_00{i}.png" for i in range(3)
    ]
    assert split.val == (("validation/cat/img_000.png", 0), ("validation/dog/img_000.png", 1))
    _write_class(tmp_path / "validation" / "cow", 1)
    with pytest.raises(data.ImageFolderError, match=r"only in one: \['cow'\]"):
        data.scan_image_folder(tmp_path)


def test_linked_folders_are_followed_once(tmp_path):
    root = _folder(tmp_path / "root", {"a": 2})
    _write_class(tmp_path / "elsewhere", 3, seed=4)
    (root / "b").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    split = data.scan_image_folder(root)
    assert split.class_names == ("a", "b") and len(split.train + split.val) == 5
    (root / "a" / "again").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(data.ImageFolderError, match="two links to one folder") as caught:
        data.scan_image_folder(root)
    assert str(caught.value).endswith(f"={str(root / 'b')!r}")


def test_a_train_folder_without_a_val_folder_is_refused(tmp_path):
    _folder(tmp_path / "train", {"dog": 3, "cat": 2})
    _write_class(tmp_path / "other", 2)
    with pytest.raises(data.ImageFolderError, match=r"\['train'\].*Received: root="):
        data.scan_image_folder(tmp_path)


def _bomb(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_png_bytes(30000, 30000, 8, 2, bytes(2 * 90001)))


def _loop(root):
    _folder(root, {"a": 2, "b": 2})
    (root / "a" / "sub").mkdir()
    (root / "a" / "sub" / "loop").symlink_to(root / "a", target_is_directory=True)
    return root / "a" / "sub" / "loop"


def _bad_name(root):
    _folder(root, {"a": 2, "b": 2})
    bad = os.path.join(os.fsencode(root / "a"), b"caf\xe9.png")
    try:
        with open(bad, "wb") as f:
            f.write((root / "a" / "img_000.png").read_bytes())
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    return os.path.join(str(root / "a"), os.fsdecode(b"caf\xe9.png"))


def _classes(counts, named=None):
    """Class folders with `counts` images; the error names the root, or class `named`."""

    def make(root):
        for name in counts:
            (root / name).mkdir()
        _folder(root, counts)
        return root if named is None else root / named

    return make


def _with(make_file, relative):
    """Two classes of two images, and `make_file(root / relative)`, the file named."""

    def make(root):
        _folder(root, {"a": 2, "b": 2})
        make_file(root / relative)
        return root / relative

    return make


def _root_a_file(root):
    root.rmdir()
    return _save(root, Image.new("RGB", (2, 2)), format="PNG")


def _files_only(root):
    _write_class(root, 2)
    return root


# name: (make the folder `root`, returning the path the error names; what the error says)
BAD_FOLDERS = {
    "missing": (lambda root: root.rmdir() or root, "does not exist"),
    "a file": (_root_a_file, "is not a folder"),
    "empty": (_classes({}), "is empty"),
    "files only": (_files_only, "has no folders"),
    "one class": (_classes({"a": 3}), r"1 class folder\(s\) \['a'\]"),
    "no images": (_classes({"a": 2, "b": 0}, "b"), r"0 usable image\(s\)"),
    "one image": (_classes({"a": 2, "b": 1}, "b"), "2 images to split"),
    "case": (_classes({"Cat": 2, "cat": 2, "dog": 2}), "differ only in case"),
    "damaged": (_with(_truncated("PNG"), "a/x.png"), "not a decodable PNG.*skip_damaged=True"),
    "bomb": (_with(_bomb, "b/big.png"), "decompression bomb"),
    "too long": (
        _with(lambda path: _save(path, Image.new("RGB", (202, 2))), "a/strip.png"),
        "202 x 2 pixels",
    ),
    "link loop": (_loop, "link loop"),
    "not utf-8": (_bad_name, "not valid UTF-8"),
}


@pytest.mark.parametrize("name", sorted(BAD_FOLDERS))
def test_bad_folders_are_refused_naming_the_path(tmp_path, name):
    make, problem = BAD_FOLDERS[name]
    root = tmp_path / "root"
    root.mkdir()
    path = make(root)
    start = time.perf_counter()
    with pytest.raises(data.ImageFolderError, match=problem) as caught:
        data.scan_image_folder(root)
    assert time.perf_counter() - start < 5
    assert str(caught.value).endswith(f"={str(path)!r}"), str(caught.value)


def test_too_many_files_are_refused(tmp_path, monkeypatch):
    # `data.image_folder` is the function of the same name.
    module = importlib.import_module("keras_autoshuffle.data.image_folder_scan")
    _folder(tmp_path, {"a": 3, "b": 3})
    monkeypatch.setattr(module, "MAX_FILES", 7)
    with pytest.raises(data.ImageFolderError, match=r"MAX_FILES \(7\).*: 8 so far"):
        data.scan_image_folder(tmp_path)


def test_damaged_files_can_be_skipped_and_are_recorded(tmp_path):
    _folder(tmp_path, {"a": 3, "b": 2})
    _truncated("JPEG")(tmp_path / "a" / "cut.jpg")
    (tmp_path / "b" / "text.png").write_text("not an image")
    _bomb(tmp_path / "b" / "bomb.png")
    (tmp_path / "b" / "readme.md").write_text("ignored")
    split = data.scan_image_folder(tmp_path, skip_damaged=True)
    assert [path for path, _ in split.skipped] == ["a/cut.jpg", "b/bomb.png", "b/text.png"]
    assert "not a decodable" in split.skipped[0][1]
    assert "decompression bomb" in split.skipped[1][1]
    assert len(split.train + split.val) == 5 and split.ignored == 1


def test_the_split_is_recorded_and_read_back(tmp_path):
    root = _folder(tmp_path / "photos", {"a": 4, "b": 3})
    record = tmp_path / "run" / "split.json"
    train, val, split = data.image_folder(root, split_seed=5, record=record)
    assert data.ImageFolderSplit.load(record, root) == split
    assert data.ImageFolderSplit.from_json(split.to_json(), root) == split
    # A file added later is not in the recorded split: a resumed run uses the same images.
    _write_class(root / "a", 6, seed=7)
    again = data.image_folder(root, split_seed=5, record=record)
    assert again[2] == split and again[0].num_examples == train.num_examples
    assert val.num_examples == len(split.val) and train.input_shape == (224, 224, 3)
    np.testing.assert_array_equal(train.labels, split.train_labels)
    with pytest.raises(data.ImageFolderError, match="val_fraction=0.2 and split_seed=5"):
        data.image_folder(root, split_seed=6, record=record)
    gone = split.val[0][0]
    os.remove(root / gone)
    with pytest.raises(data.ImageFolderError, match=f"missing or changed: {gone} .*new output"):
        data.image_folder(root, split_seed=5, record=record)


def _tampered(split, **changes):
    record = split.to_json()
    record.update(changes)
    return record


def test_a_tampered_record_is_refused_naming_the_field(tmp_path):
    root = _folder(tmp_path, {"a": 3, "b": 3})
    split = data.scan_image_folder(root)
    (path, label), rest = split.train[0], [list(e) for e in split.train[1:]]
    cases = {
        "train": [
            [[path, 2], *rest],  # label out of range
            [[path, True], *rest],
            [["a/../../etc/passwd.png", label], *rest],
            [[str(root / path), label], *rest],
            [["b/" + path.split("/")[1], label], *rest],  # not its class's folder
            [[path, label], [path, label], *rest],  # listed twice
            [e for e in rest if e[1] == 1],  # a class without training examples
        ],
        "val": [[*map(list, split.val), [path, label]]],  # also in train
        "class_names": [["b", "a"], ["a"], ["a", "a/b"]],
        "source": ["folder"],
        "val_fraction": [0, 1.5, "0.2"],
        "split_seed": [-1, 0.5],
        "ignored": [-1],
        "format": ["something else"],
        "skipped": [[["x.png"]]],
    }
    for field, values in cases.items():
        for value in values:
            with pytest.raises(data.ImageFolderError, match=f"`{field}`") as caught:
                data.ImageFolderSplit.from_json(_tampered(split, **{field: value}), root)
            assert f"Received: {field}=" in str(caught.value)
    record = tmp_path / "split.json"
    record.write_text("{not json")
    with pytest.raises(data.ImageFolderError, match="cannot be read") as caught:
        data.ImageFolderSplit.load(record, root)
    assert str(record) in str(caught.value)


def _gradient(height, width):
    """Gray rising from left to right: mirrored, it falls."""
    row = np.linspace(0, 255, width).round().astype(np.uint8)
    return np.repeat(np.repeat(row[None, :, None], height, 0), 3, 2)


def test_evaluation_images_are_evaluation_preprocessings(tmp_path):
    root = tmp_path
    _save(root / "a" / "wide.png", Image.fromarray(_pixels(23, 41, seed=1)))
    _save(root / "a" / "tall.jpg", Image.fromarray(_pixels(37, 19, seed=2)), quality=90)
    _save(root / "b" / "gray.png", Image.fromarray(_pixels(20, 20, 1, seed=3)))
    _save(root / "b" / "anim.gif", Image.fromarray(_pixels(18, 29, seed=4)).convert("P"))
    examples = [("a/wide.png", 0), ("a/tall.jpg", 0), ("b/gray.png", 1), ("b/anim.gif", 1)]
    val = data.ImageFolderData(root, examples, 2, image_size=16, training=False)
    (images, labels), *more = list(val.eval_dataset(batch_size=4))
    assert not more and images.shape == (4, 16, 16, 3)
    np.testing.assert_array_equal(labels, [0, 0, 1, 1])
    preprocess = applications.evaluation_preprocessing(16)
    for image, (path, _) in zip(images.numpy(), examples, strict=True):
        expected = preprocess(data.read_image(root / path)[None])[0]
        np.testing.assert_allclose(image, expected, atol=2e-5)
    with pytest.raises(ValueError, match="validation split"):
        val.epoch_dataset(0, batch_size=2)


def _train_data(root, **options):
    _write_class(root / "a", 5, size=(20, 16))
    _write_class(root / "b", 4, size=(13, 21), seed=1)
    split = data.scan_image_folder(root, val_fraction=0.25)
    return data.ImageFolderData(root, split.train, 2, image_size=16, seed=7, **options), split


def _epoch(train, epoch):
    return [(x.numpy(), y.numpy()) for x, y in train.epoch_dataset(epoch, batch_size=3)]


def test_a_training_epoch_is_a_function_of_seed_and_epoch(tmp_path):
    train, split = _train_data(tmp_path)
    again = data.ImageFolderData(tmp_path, split.train, 2, image_size=16, seed=7)
    first = _epoch(train, 1)
    assert len(first) == train.num_examples // 3 == 2
    for (x, y), (x2, y2) in zip(first, _epoch(again, 1), strict=True):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    order = data.epoch_permutation(train.num_examples, 7, 1).numpy()
    np.testing.assert_array_equal(np.concatenate([y for _, y in first]), train.labels[order][:6])
    second = _epoch(train, 2)
    assert not np.array_equal(first[0][0], second[0][0])
    images = np.concatenate([x for x, _ in first])
    # Normalised: about (0 - mean) / std to (1 - mean) / std, and no NaN.
    assert np.isfinite(images).all() and images.min() >= -2.2 and images.max() <= 2.7


def test_flip_false_never_mirrors(tmp_path):
    # A full-area crop of a square keeps the whole image: flipped or not, nothing else.
    image = tf.constant(_gradient(12, 12))
    flipped = []
    for flip in (False, True):
        for seed in range(8):
            out = data.random_resized_crop(
                image, tf.constant([seed, 0]), size=12, area=(1.0, 1.0), ratio=(1, 1), flip=flip
            ).numpy()
            flipped.append(np.array_equal(out, _gradient(12, 12)[:, ::-1]))
            assert flipped[-1] or np.array_equal(out, _gradient(12, 12))
    assert not any(flipped[:8]) and any(flipped[8:])
    # The pipeline: any crop of a rising gradient, resized, rises unless it is mirrored.
    for i in range(3):
        _save(tmp_path / f"{i}.png", Image.fromarray(_gradient(18 + i, 25 + 2 * i)))
    for flip in (False, True):
        examples = [(f"{i}.png", i % 2) for i in range(3)] * 4
        train = data.ImageFolderData(tmp_path, examples, 2, 16, flip=flip)
        rising = [
            x[..., 0].mean(axis=0)[-1] > x[..., 0].mean(axis=0)[0]
            for epoch in range(2)
            for batch, _ in _epoch(train, epoch)
            for x in batch
        ]
        assert all(rising) if not flip else not all(rising)


def _photo(height, width, seed=0):
    """Photo-like pixels: smooth gradients, a few sharp-edged patches, noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    image = np.stack([128 + 90 * np.sin(rng.uniform(2, 6) * (x + y) + c) for c in range(3)], -1)
    for _ in range(4):
        top, left = rng.integers(0, height // 2), rng.integers(0, width // 2)
        image[top : top + height // 3, left : left + width // 3] += rng.uniform(-60, 60, 3)
    image += rng.normal(0, 6, image.shape)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


# image_size 16: a training JPEG decodes at 1/r, r the largest of 2, 4, 8 keeping its
# shorter side ceil(side / r) >= 32 pixels. (width, height) and the r expected:
# 249 -> ceil(249 / 8) = 32 (a floor would give 31, r = 4); 200 -> 50 at r = 4, 25 at 8;
# 70 -> 35 at r = 2; 62 -> 31 at r = 2, so full size; a PNG is never scaled.
SCALED = {
    "a/tall.jpg": ((249, 300), 8),
    "a/wide.jpg": ((260, 200), 4),
    "b/half.jpg": ((90, 70), 2),
    "b/small.jpg": ((80, 62), 1),
    "b/big.png": ((300, 300), 1),
}


def test_training_decodes_large_jpegs_smaller_and_evaluation_does_not(tmp_path):
    for name, (size, _) in SCALED.items():
        image = _photo(size[1], size[0], seed=len(name))
        _save(tmp_path / name, image, **({"quality": 90} if name.endswith(".jpg") else {}))
    decoded = {}
    for name, ((width, height), ratio) in SCALED.items():
        contents = (tmp_path / name).read_bytes()
        if name.endswith(".jpg"):  # libjpeg's scaled decode, called directly
            expected = tf.io.decode_jpeg(
                contents, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE"
            ).numpy()
        else:
            expected = _pillow_rgb(tmp_path / name)
        assert expected.shape == (-(-height // ratio), -(-width // ratio), 3)
        decoded[name] = data.decode_rgb(tf.constant(contents), min_side=32).numpy()
        np.testing.assert_array_equal(decoded[name], expected)
        np.testing.assert_array_equal(
            data.decode_rgb(tf.constant(contents)), data.read_image(tmp_path / name)
        )
    # The training pipeline crops those pixels: each image is the random-resized crop of
    # its example's seed, normalised (computed here without the pipeline).
    examples = [(name, i % 2) for i, name in enumerate(SCALED)]
    train = data.ImageFolderData(tmp_path, examples, 2, image_size=16, seed=5)
    assert train.decode_min_side == 32
    for epoch in (0, 1):
        (images, labels), *more = list(train.epoch_dataset(epoch, batch_size=len(SCALED)))
        assert not more
        order = data.epoch_permutation(len(SCALED), 5, epoch).numpy()
        np.testing.assert_array_equal(labels, [examples[i][1] for i in order])
        for image, index in zip(images.numpy(), order, strict=True):
            seed = data.example_seed(5, epoch, index)
            crop = data.random_resized_crop(tf.constant(decoded[examples[index][0]]), seed, 16)
            np.testing.assert_allclose(image, (crop.numpy() / 255 - MEAN) / STD, atol=1e-5)
    # Evaluation decodes the full image: evaluation_preprocessing's pixels.
    (images, _), *more = list(train.epoch_dataset(0, batch_size=len(SCALED), training=False))
    preprocess = applications.evaluation_preprocessing(16)
    for image, (name, _) in zip(images.numpy(), examples, strict=True):
        expected = preprocess(data.read_image(tmp_path / name)[None])[0]
        np.testing.assert_allclose(image, expected, atol=2e-5)
    with pytest.raises(ValueError, match="min_side"):
        data.decode_rgb(tf.constant(b""), min_side=0)


# -- the decoded-image cache ----------------------------------------------------------


def test_cached_training_images_are_the_decoded_ones_shrunk(tmp_path):
    """Each cached image is the training decode shrunk to a shorter side of
    `decode_min_side` (32 here): Pillow's antialiased bilinear resize of it (the same
    triangle filter) within 2 levels; an image no larger is cached as decoded, exactly; a
    training epoch from the cache is the random-resized crops of those pixels."""
    for name, (size, _) in SCALED.items():
        image = _photo(size[1], size[0], seed=len(name))
        _save(tmp_path / name, image, **({"quality": 90} if name.endswith(".jpg") else {}))
    _save(tmp_path / "b" / "tiny.png", Image.fromarray(_pixels(20, 30, seed=3)))
    names = [*SCALED, "b/tiny.png"]
    examples = [(name, i % 2) for i, name in enumerate(names)]
    train = data.ImageFolderData(tmp_path, examples, 2, image_size=16, seed=5)
    train.cache_images(tmp_path / "cache")
    assert train.cached
    files = sorted(os.listdir(tmp_path / "cache"))
    assert len(files) == len(names)
    cached, shrunk = {}, {}
    for name in names:
        decoded = data.decode_rgb(tf.constant((tmp_path / name).read_bytes()), min_side=32)
        decoded = decoded.numpy()
        height, width = decoded.shape[:2]
        scale = min(1.0, 32 / min(height, width))
        size = (round(width * scale), round(height * scale))
        expected = np.asarray(Image.fromarray(decoded).resize(size, Image.BILINEAR))
        cached[name] = expected if scale < 1 else decoded
        shrunk[name] = scale < 1
    epoch = list(train.epoch_dataset(0, batch_size=len(names)))[0][0].numpy()
    order = data.epoch_permutation(len(names), 5, 0).numpy()
    for image, index in zip(epoch, order, strict=True):
        name = examples[index][0]
        # The crop's box depends on the image's shape only: the cached shape is Pillow's.
        seed = data.example_seed(5, 0, index)
        crop = data.random_resized_crop(tf.constant(cached[name]), seed, 16).numpy()
        tolerance = 2.5 / 255 / STD.min() if shrunk[name] else 1e-5  # 2 levels, or exact
        np.testing.assert_allclose(image, (crop / 255 - MEAN) / STD, atol=tolerance, err_msg=name)


def test_the_cache_is_reused_and_a_damaged_file_rewritten(tmp_path, monkeypatch):
    train, _ = _train_data(tmp_path / "images")
    uncached = _epoch(train, 1)
    cache = tmp_path / "cache"
    train.cache_images(cache)
    # Images no larger than decode_min_side: the cached epoch is the uncached one.
    for (x, y), (x2, y2) in zip(uncached, _epoch(train, 1), strict=True):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    files = sorted(cache.iterdir())
    stamps = {f: f.stat().st_mtime_ns for f in files}
    damaged = files[0]
    damaged.write_bytes(damaged.read_bytes()[:-5])  # a kill mid-write, say
    again = data.ImageFolderData(*_same(train))
    again.cache_images(cache)
    assert [f.stat().st_mtime_ns == stamps[f] for f in files] == [False] + [True] * (len(files) - 1)
    for (x, _), (x2, _) in zip(uncached, _epoch(again, 1), strict=True):
        np.testing.assert_array_equal(x, x2)
    # An edited image gets a new cache file.
    path = train.path(0)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    again.cache_images(cache)
    assert len(list(cache.iterdir())) == len(files) + 1
    # No room: refused up front, naming the folder and what to do; nothing written.
    monkeypatch.setattr(data.image_cache, "DISK_MARGIN_BYTES", 2**62)
    with pytest.raises(data.image_cache.ImageCacheError, match="cache_images=False") as caught:
        data.ImageFolderData(*_same(train)).cache_images(tmp_path / "other")
    assert str(tmp_path / "other") in str(caught.value)
    assert not any((tmp_path / "other").iterdir())
    with pytest.raises(ValueError, match="training=False"):
        data.ImageFolderData(train.root, train.examples, 2, 16, training=False).cache_images(cache)


def _same(train):
    return train.root, train.examples, train.num_classes, train.image_size, train.flip, True, 7
