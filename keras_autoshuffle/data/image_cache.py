"""Training images decoded once, shrunk and kept on disk as raw pixels, so that each epoch
reads them instead of decoding the files again (as Ultralytics' `cache=disk`): decoding a
camera photo takes longer than the training step's share of it on a small CPU.

A cache file is `MAGIC`, the height and width (two native int32) and the upright RGB
pixels (uint8, row-major), the shorter side at most `min_side`. Its name hashes the image
file's path, size, inode, modification and change times and `min_side`, so an image
replaced in place gets a new file. Each file is written atomically; a build killed midway
is completed by the next, which checks every existing file's header and size.
"""

import hashlib
import os
import shutil

import numpy as np
import tensorflow as tf

from keras_autoshuffle import _atomic, _validation
from keras_autoshuffle.data.images import check_image_file, decode_error, decode_rgb

# The layout's version: "KAS1" files were written before the pixels were upright (EXIF
# orientation), under the same names; their header reads as damaged, so they are rebuilt.
MAGIC = b"KAS2"
HEADER_BYTES = len(MAGIC) + 8
SUFFIX = ".rgb"
# Free disk space left after the cache, beside its own bytes.
DISK_MARGIN_BYTES = 2**30


class ImageCacheError(OSError):
    """The cache cannot be written: its folder is not a folder, or the disk lacks room."""


def _shrink(image, min_side):
    """`image` resized (bilinear, antialiased, rounded) so that its shorter side is
    `min_side`, where it is longer; else as it is."""
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    shorter = tf.minimum(height, width)

    def resize():
        scale = min_side / tf.cast(shorter, tf.float64)
        size = tf.cast(tf.round(tf.cast(tf.stack([height, width]), tf.float64) * scale), tf.int32)
        resized = tf.image.resize(image, tf.maximum(size, 1), antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    return tf.cond(shorter > min_side, resize, lambda: image)


def _name(path, min_side):
    status = os.stat(path)
    # The inode's change time too: a copy that keeps the modification time (cp -p) has a new one.
    identity = (
        f"{os.path.abspath(path)}\0{status.st_size}\0{status.st_mtime_ns}\0"
        f"{status.st_ino}\0{status.st_ctime_ns}\0{min_side}"
    )
    return hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:40] + SUFFIX


def _read_header(path):
    """(height, width) of an intact cache file at `path`, else None."""
    try:
        with open(path, "rb") as f:
            header = f.read(HEADER_BYTES)
        size = os.path.getsize(path)
    except OSError:
        return None
    if len(header) != HEADER_BYTES or not header.startswith(MAGIC):
        return None
    height, width = (int(v) for v in np.frombuffer(header[len(MAGIC) :], np.int32))
    if height < 1 or width < 1 or size != HEADER_BYTES + 3 * height * width:
        return None
    return height, width


def _estimated_bytes(paths, min_side):
    """The cache's bytes at most, from the image files' headers (Pillow reads no pixels)."""
    from PIL import Image

    total = 0
    for path in paths:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except Exception:  # changed since it was checked: the check says how, naming it
            check_image_file(path)
            raise
        scale = min(1.0, min_side / min(width, height))
        total += HEADER_BYTES + 3 * (round(width * scale) + 1) * (round(height * scale) + 1)
    return total


def build_image_cache(
    paths: list[str], folder: str | os.PathLike, min_side: int
) -> list[tuple[str, int, int]]:
    """Decodes each image of `paths` once into `folder` (created), shrunk to a shorter side
    of at most `min_side`; files a previous build left intact are kept.

    Args:
        paths: the image files, checked (`data.check_image_file`) and readable.
        folder: the cache folder.
        min_side: the largest shorter side kept, a positive integer.

    Returns:
        For each path in order, `(cache file, height, width)`.

    Raises:
        ImageCacheError: `folder` is not a folder, or its disk would keep less than
            `DISK_MARGIN_BYTES` free after the files still to write.
        ImageFileError: an image file cannot be read or decoded any more (it was
            changed or removed since it was checked); the message names it.
    """
    min_side = _validation.positive_int(min_side, "min_side")
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ImageCacheError(f"The image cache's folder is a file. Received: folder={folder!r}")
    os.makedirs(folder, exist_ok=True)
    files = [os.path.join(folder, _name(path, min_side)) for path in paths]
    shapes = [_read_header(file) for file in files]
    missing = [i for i, shape in enumerate(shapes) if shape is None]
    if not missing:
        return [(file, *shape) for file, shape in zip(files, shapes, strict=True)]
    needed = _estimated_bytes([paths[i] for i in missing], min_side)
    free = shutil.disk_usage(folder).free
    if needed + DISK_MARGIN_BYTES > free:
        raise ImageCacheError(
            f"The decoded training images need about {needed / 2**30:.1f} GiB in {folder}, "
            f"which has {free / 2**30:.1f} GiB free (at least "
            f"{DISK_MARGIN_BYTES / 2**30:.0f} GiB must stay free). Free some space, or train "
            "without the cache (cache_images=False, --no-cache: each epoch decodes the "
            f"files again). Received: {len(missing)} images to cache"
        )
    decoded = tf.data.Dataset.from_tensor_slices([paths[i] for i in missing]).map(
        lambda path: _shrink(decode_rgb(tf.io.read_file(path), min_side), min_side),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    images = decoded.prefetch(2).as_numpy_iterator()
    for index in missing:
        image = _next_image(images, paths[index])
        header = MAGIC + np.array(image.shape[:2], np.int32).tobytes()

        def write(partial, image=image, header=header):
            with open(partial, "wb") as f:
                f.write(header)
                f.write(np.ascontiguousarray(image).tobytes())

        _atomic.write_atomically(files[index], write)
        shapes[index] = image.shape[:2]
    return [(file, int(h), int(w)) for file, (h, w) in zip(files, shapes, strict=True)]


def _next_image(images, path):
    """The next decoded image, that of `path`; an `ImageFileError` naming the file when it
    cannot be read (changed since it was checked), not TensorFlow's internals."""
    try:
        return next(images)
    except tf.errors.OpError as error:
        check_image_file(path)  # raises the error that says what is wrong with the file
        raise decode_error(path, error) from None


def read_cached(contents: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    """The pixels of a cache file's bytes `contents` (graph-safe), `shape` (height, width)
    as `build_image_cache` returned it: uint8 (height, width, 3)."""
    pixels = tf.io.decode_raw(tf.strings.substr(contents, HEADER_BYTES, -1), tf.uint8)
    return tf.reshape(pixels, tf.concat([shape, [3]], axis=0))
