"""One image file, untrusted: checked before it is decoded, decoded as the pipeline does.

`check_image_file` reads the header with Pillow (no pixel decoded) and refuses a format
other than JPEG, PNG, BMP and GIF, a declared size over `max_pixels` (a decompression
bomb) or a file that is not an image; then decodes it with TensorFlow (`decode_rgb`, what
the `tf.data` pipelines run), so a damaged file is found before training, not mid-way.

TensorFlow's decoders read a palette BMP as gray without an error, and cannot read 1-bit
BMPs: BMPs are also decoded by Pillow and must match. They decode every frame of a GIF to
return the first: `max_pixels` bounds the frames' pixels together. Every decode turns the
picture upright as its EXIF orientation says (`data.exif`), as Pillow's
`ImageOps.exif_transpose` does (TensorFlow's decoders and `keras.utils.load_img` do not).
"""

import io
import os
import re
import stat
import struct
import threading
import warnings

import numpy as np
import tensorflow as tf

from keras_autoshuffle import _validation
from keras_autoshuffle.data import exif

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
MAX_PIXELS = 50_000_000
MAX_FILE_BYTES = 256 * 2**20
MAX_GIF_FRAMES = 10_000
# The scales libjpeg decodes a JPEG at with `tf.io.decode_jpeg(..., ratio=r)`: 1 / r.
JPEG_RATIOS = (1, 2, 4, 8)

_HEADER_LOCK = threading.Lock()

# Pillow's format names of the four formats (a camera's multi-picture JPEG is "MPO").
_FORMATS = {"JPEG": "JPEG", "MPO": "JPEG", "PNG": "PNG", "BMP": "BMP", "GIF": "GIF"}


class ImageFileError(ValueError):
    """An image file that cannot be used: its message names the path, the problem and what
    to do.

    Attributes:
        path: the file, as received.
        problem: the problem alone, a sentence without the path or the advice.
    """

    path = None
    problem = None


def has_image_extension(path: str | os.PathLike) -> bool:
    """Whether `path` ends in one of `IMAGE_EXTENSIONS`, in any case (as Keras matches
    them): True for `photo.JPG`, False for `notes.txt`."""
    return os.fspath(path).lower().endswith(IMAGE_EXTENSIONS)


def decode_rgb(contents: tf.Tensor, min_side: int | None = None) -> tf.Tensor:
    """Decodes an encoded JPEG, PNG, BMP or GIF to upright RGB pixels, graph-safe.

    Gray is repeated to three channels, alpha dropped, a GIF's first frame kept; a JPEG is
    decoded with the accurate inverse DCT (Pillow's pixels). Decode untrusted files only
    after `check_image_file`: this op bounds nothing. With `min_side`, a JPEG is decoded
    smaller by libjpeg's DCT-domain scaling: the largest of `JPEG_RATIOS` that keeps the
    shorter side at `min_side` pixels or more (other formats at full size).

    Args:
        contents: a scalar string tensor, the file's bytes.
        min_side: None (full size, the default) or the least shorter side, a positive
            Python int, of a downscaled JPEG.

    Returns:
        A uint8 tensor (height, width, 3), upright, its static shape [None, None, 3].
    """
    min_side = _validation.optional_positive_int(min_side, "min_side")
    return _decode(tf.convert_to_tensor(contents, tf.string), min_side)[0]


@tf.function(reduce_retracing=True, autograph=False)
def _decode(contents, min_side):
    """`decode_rgb`'s pixels and the file's EXIF orientation, as one graph (run op by op,
    the orientation's walk over the file's segments takes milliseconds)."""
    orientation = exif.orientation(contents)
    return exif.upright(_decode_stored(contents, min_side), orientation), orientation


def _decode_stored(contents, min_side):
    """The pixels as the file stores them (`decode_rgb` without the orientation)."""

    def jpeg():
        if min_side is None:
            return _decode_jpeg(contents, 1)
        shape = tf.image.extract_jpeg_shape(contents)
        index = _ratio_index(shape[0], shape[1], min_side)
        return tf.switch_case(index, [lambda r=r: _decode_jpeg(contents, r) for r in JPEG_RATIOS])

    image = tf.cond(
        tf.io.is_jpeg(contents),
        jpeg,
        lambda: tf.io.decode_image(contents, channels=3, expand_animations=False),
    )
    return tf.ensure_shape(image, [None, None, 3])


def _decode_jpeg(contents, ratio):
    # decode_image's JPEG default is libjpeg's fast, inexact inverse DCT (pixels up to 8
    # off Pillow's); the accurate one gives Pillow's pixels, and is no slower. With a
    # ratio, libjpeg's scaled accurate inverse DCTs.
    return tf.io.decode_jpeg(contents, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE")


def _ratio_index(height, width, min_side):
    """The index in JPEG_RATIOS of the largest ratio r with ceil(shorter / r) >= min_side
    (a scalar int32 tensor); 0 (r = 1) when none larger keeps it."""
    shorter = tf.minimum(tf.cast(height, tf.int32), tf.cast(width, tf.int32))
    keeps = [(shorter + r - 1) // r >= min_side for r in JPEG_RATIOS[1:]]  # nested: 2, 4, 8
    return tf.add_n([tf.cast(keep, tf.int32) for keep in keeps])


def check_image_file(path: str | os.PathLike, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Checks that the pipeline can decode an image file, bounding memory and time.

    Args:
        path: the file.
        max_pixels: the most pixels (width * height, all frames of a GIF together) the
            file may declare; refused before any pixel is decoded.

    Returns:
        The upright image's (width, height), the stored sides swapped when the EXIF
            orientation turns it a quarter (5 to 8).

    Raises:
        ImageFileError: the file is missing, empty, larger than `MAX_FILE_BYTES`, not an
            image, an image of another format, declares more than `max_pixels` pixels,
            or is damaged (TensorFlow or, for a BMP, Pillow cannot decode it: the
            message says so in plain words, without TensorFlow's internals).
        ValueError: `max_pixels` is not a positive integer.
    """
    return _read_checked(path, max_pixels)[0]


def read_image(path: str | os.PathLike, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Reads an image file, checked as `check_image_file` does, as RGB pixels.

    Args:
        path: the file.
        max_pixels: the most pixels the file may declare (see `check_image_file`).

    Returns:
        A uint8 array (height, width, 3), the picture upright (its EXIF orientation
            applied).

    Raises:
        ImageFileError: as `check_image_file`.
        ValueError: `max_pixels` is not a positive integer.
    """
    return _read_checked(path, max_pixels)[1]


def _read_checked(path, max_pixels):
    max_pixels = _validation.positive_int(max_pixels, "max_pixels")
    path = os.fspath(path)
    contents = _read_bytes(path)
    image = _open_header(contents, path, max_pixels)
    width, height = image.size
    kind = _FORMATS[image.format]
    if kind == "GIF":
        _check_gif_frames(contents, path, max_pixels)
    try:
        pixels, orientation = (t.numpy() for t in _decode(tf.constant(contents), None))
    except tf.errors.OpError as error:
        raise decode_error(path, error, kind) from None
    if orientation >= 5:  # turned a quarter: the upright picture's sides are swapped
        width, height = height, width
    if pixels.shape != (height, width, 3):
        raise _error(
            path,
            f"TensorFlow decodes it as {pixels.shape[1]} x {pixels.shape[0]} pixels where its "
            f"header declares {width} x {height}",
        )
    if kind == "BMP":
        _check_bmp(image, pixels, path)
    return (width, height), pixels


def decode_error(
    path: str | os.PathLike, error: tf.errors.OpError, kind: str = "image"
) -> ImageFileError:
    """The `ImageFileError` for a file TensorFlow failed to decode (`decode_rgb`), in
    plain words with the decoder's own reason, none of TensorFlow's internals.

    Args:
        path: the file.
        error: what TensorFlow raised while decoding it.
        kind: the file's format ("JPEG", "PNG", "BMP", "GIF"), or "image".

    Returns:
        The error to raise.
    """
    reason = _decoder_reason(error.message)
    return _error(
        os.fspath(path),
        f"The file is not a decodable {kind}: its data is truncated or corrupt"
        + (f" (the decoder says: {reason})" if reason else ""),
    )


def _decoder_reason(message):
    """The decoder's own sentence in a TensorFlow error message: the last line left once
    node names ({{...}}, [[...]]), op names ([Op:...]) and the traceback are removed."""
    message = re.sub(r"\{\{.*?\}\}|\[\[.*?\]\]|\[Op:[^\]]*\]", "", message)
    lines = [line.strip() for line in message.splitlines()]
    skipped = ("Graph execution error", "Detected at node", "File ")
    lines = [line for line in lines if line and not line.startswith(skipped)]
    return lines[-1][:300].rstrip(".") if lines else ""


def _error(path, problem, advice="Replace it with an intact JPEG or PNG, or remove it."):
    error = ImageFileError(f"{problem}. {advice} Received: path={path!r}")
    error.path, error.problem = path, problem
    return error


def _read_bytes(path):
    try:
        # Non-blocking: opening a named pipe must not wait for a writer.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise _error(path, "The file does not exist", "Check the path.") from None
    except OSError as error:
        raise _error(path, f"The file cannot be read ({error.strerror})", "Check it.") from None
    try:
        status = os.fstat(descriptor)
        if stat.S_ISDIR(status.st_mode):
            raise _error(path, "This is a folder, not an image file", "Pass a file.")
        if not stat.S_ISREG(status.st_mode):  # a device or a pipe: endless, or never ends
            raise _error(path, "This is not a regular file", "Pass an image file.")
        if status.st_size > MAX_FILE_BYTES:
            raise _error(
                path,
                f"The file has {status.st_size} bytes, more than MAX_FILE_BYTES "
                f"({MAX_FILE_BYTES}), the most an image file is read with",
                "Resize or recompress it.",
            )
        with os.fdopen(descriptor, "rb", closefd=False) as f:
            contents = f.read(MAX_FILE_BYTES + 1)  # the file may grow after the stat
    except OSError as error:
        raise _error(path, f"The file cannot be read ({error.strerror})", "Check it.") from None
    finally:
        os.close(descriptor)
    if len(contents) > MAX_FILE_BYTES:
        raise _error(path, f"The file has more than {MAX_FILE_BYTES} bytes", "Resize it.")
    if not contents:
        raise _error(path, "The file is empty")
    return contents


def _open_header(contents, path, max_pixels):
    """The file opened by Pillow (its header read, no pixel decoded), checked."""
    from PIL import Image, UnidentifiedImageError

    # catch_warnings changes process-wide filters: one header at a time (they are quick).
    with _HEADER_LOCK, warnings.catch_warnings():
        # Our own limit decides below; Pillow's warning would only add noise. So would its
        # "Corrupt EXIF data" (a damaged EXIF block reads as upright, `data.exif`).
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="PIL")
        try:
            image = Image.open(io.BytesIO(contents))
        except Image.DecompressionBombError as error:
            raise _error(
                path,
                f"The image declares too many pixels, a possible decompression bomb ({error})",
                "Remove it, or resize it if it is a genuine image.",
            ) from None
        except UnidentifiedImageError:
            raise _error(path, "This is not an image file Pillow can read") from None
        except Exception as error:  # malformed headers raise many kinds of errors
            raise _error(path, f"The image's header is damaged ({error})") from None
    if image.format not in _FORMATS:
        raise _error(
            path,
            f"This is a {image.format} image; only JPEG, PNG, BMP and GIF files are read",
            "Convert it to PNG or JPEG.",
        )
    width, height = image.size
    if width < 1 or height < 1:
        raise _error(path, f"The image declares {width} x {height} pixels")
    if width * height > max_pixels:
        raise _error(
            path,
            f"The image declares {width} x {height} = {width * height} pixels, more than "
            f"max_pixels ({max_pixels}): a possible decompression bomb, checked before "
            "decoding",
            "Remove it, resize it, or raise max_pixels if it is a genuine image.",
        )
    return image


def _check_gif_frames(contents, path, max_pixels):
    """Refuses a GIF whose frames together declare more than `max_pixels` pixels, or more
    than MAX_GIF_FRAMES frames: TensorFlow decodes them all to return the first."""
    pixels, frames = 0, 0
    for width, height in _gif_frame_sizes(contents):
        pixels, frames = pixels + width * height, frames + 1
        if pixels > max_pixels or frames > MAX_GIF_FRAMES:
            raise _error(
                path,
                f"The GIF's first {frames} frames declare {pixels} pixels together, more "
                f"than max_pixels ({max_pixels}) or MAX_GIF_FRAMES ({MAX_GIF_FRAMES}) "
                "frames (TensorFlow decodes every frame to read the first)",
                "Save its first frame as a PNG.",
            )


def _gif_frame_sizes(contents):
    """The (width, height) of each frame a GIF's blocks declare (no pixel decoded). A
    damaged block structure ends the walk: the decoders report the damage."""
    end = len(contents)
    position = 13  # the header and the logical screen descriptor
    if end < position:
        return
    flags = contents[10]
    if flags & 0x80:  # a global color table
        position += 3 << ((flags & 7) + 1)
    while position < end:
        block = contents[position]
        if block == 0x2C:  # an image descriptor
            if position + 10 > end:
                return
            yield struct.unpack_from("<HH", contents, position + 5)
            flags = contents[position + 9]
            position += 10
            if flags & 0x80:  # a local color table
                position += 3 << ((flags & 7) + 1)
            position += 1  # the LZW minimum code size
        elif block == 0x21:  # an extension: its label, then data sub-blocks
            position += 2
        else:  # 0x3B, the trailer, or damage
            return
        while position < end:  # data sub-blocks, up to an empty one
            size = contents[position]
            position += 1 + size
            if size == 0:
                break


def _check_bmp(image, pixels, path):
    """TensorFlow reads a palette BMP as gray without an error: a BMP must decode to the
    same pixels with Pillow."""
    try:
        expected = np.asarray(image.convert("RGB"))
    except Exception as error:  # damaged pixel data raises many kinds of errors
        raise _error(path, f"Pillow cannot decode this BMP file ({error})") from None
    if not np.array_equal(expected, pixels):
        raise _error(
            path,
            f"TensorFlow reads this BMP variant (Pillow mode {image.mode}, e.g. a palette "
            "BMP) as other pixels than Pillow does",
            "Convert it to PNG, or save it as a 24-bit BMP.",
        )
