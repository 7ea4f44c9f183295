"""The EXIF orientation of an encoded image, read and applied with TensorFlow ops, so that
`tf.data` pipelines turn a phone's sideways photo upright, as Pillow's
`ImageOps.exif_transpose` does.

`orientation` reads the Orientation tag (0x0112, 1 upright to 8) of the first IFD, one
SHORT as cameras write it, from a JPEG's first `Exif` APP1 segment or a PNG's `eXIf` chunk
before the pixel data (BMP and GIF have none); anything else, or damaged EXIF data, gives
1: reading never fails. The work is bounded: at most `MAX_SEGMENTS` segments or chunks
walked and `MAX_EXIF_BYTES` of EXIF data read. `upright` applies it. (Pillow also reads
XMP metadata and a PNG's eXIf chunk after the pixels; this does not.)
"""

import tensorflow as tf

ORIENTATION_TAG = 0x0112
# Segments or chunks walked at most (a photo's EXIF segment is the first or second).
MAX_SEGMENTS = 64
# Bytes of the EXIF data read at most: a JPEG segment holds at most 65533.
MAX_EXIF_BYTES = 65536

_EXIF_HEADER = b"Exif\0\0"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def orientation(contents: tf.Tensor) -> tf.Tensor:
    """The EXIF orientation of an encoded image (graph-safe, never fails).

    Args:
        contents: a scalar string tensor, the file's bytes.

    Returns:
        A scalar int32 tensor from 1 (upright, also for no or unusable EXIF data) to 8.
    """
    contents = tf.convert_to_tensor(contents, tf.string)
    start, size = _find_exif(contents)
    return _tiff_orientation(contents, start, size)


def upright(image: tf.Tensor, orientation: tf.Tensor | int) -> tf.Tensor:
    """`image` turned as its EXIF `orientation` says (`ImageOps.exif_transpose`'s pixels).

    Args:
        image: one image (height, width, channels); orientations 5 to 8 swap its sides.
        orientation: a scalar int, 1 to 8 (as `orientation` returns); 1 leaves the image.

    Returns:
        The upright image, the dtype of `image`.
    """
    # 1 to 4: as stored, mirrored, upside down, both; 5 to 8: transposed, then the same.
    # (6, the usual phone photo: transposed and mirrored, a quarter turn clockwise.)
    # An identity transpose copies nothing; a reverse of no axis would copy the image.
    step = tf.cast(orientation, tf.int32) - 1
    turned = tf.transpose(image, tf.where(step >= 4, [1, 0, 2], [0, 1, 2]))
    mirror = step % 4  # 1: left-right, 2: both, 3: top-bottom
    flips = tf.boolean_mask([0, 1], [mirror >= 2, (mirror == 1) | (mirror == 2)])
    turned = tf.cond(mirror > 0, lambda: tf.reverse(turned, flips), lambda: turned)
    turned.set_shape([None, None, image.shape[-1]])
    return turned


def _bytes(contents, position, size):
    """`size` (a Python int) bytes of `contents` from `position` as int64, zeros past the
    end (a file may end anywhere)."""
    position = tf.minimum(position, tf.cast(tf.strings.length(contents), tf.int64))
    raw = tf.strings.substr(contents, position, tf.constant(size, tf.int64))
    return tf.cast(tf.io.decode_raw(raw, tf.uint8, fixed_length=size), tf.int64)


def _equals(values, text):
    return tf.reduce_all(values == tf.constant(list(text), tf.int64))


def _find_exif(contents):
    """(start, size) of a JPEG's or PNG's EXIF data (a TIFF structure); size 0 when there
    is none."""
    png = tf.strings.substr(contents, 0, len(_PNG_SIGNATURE)) == _PNG_SIGNATURE
    none = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    return tf.cond(
        png,
        lambda: _walk(contents, len(_PNG_SIGNATURE), _png_step),
        lambda: tf.cond(
            tf.io.is_jpeg(contents), lambda: _walk(contents, 2, _jpeg_step), lambda: none
        ),
    )


def _jpeg_step(contents, position):
    """The first Exif APP1 segment before the scan, as Pillow reads it."""
    head = _bytes(contents, position, 10)  # FF, the marker, the size, the Exif header
    marker, size = head[1], head[2] * 256 + head[3]  # the size counts its own 2 bytes
    fill = marker == 0xFF  # padding before a marker
    found = (marker == 0xE1) & (size >= 8) & _equals(head[4:], _EXIF_HEADER)
    scan = (marker == 0xDA) | (marker == 0xD9)  # the pixel data, or the end
    ends = (head[0] != 0xFF) | ~(fill | (~scan & (size >= 2)))
    following = tf.where(fill, position + 1, position + 2 + size)
    return found, ends, following, position + 10, size - 8


def _png_step(contents, position):
    """An eXIf chunk before the first IDAT chunk (a leading `Exif` header skipped, as
    Pillow does)."""
    head = _bytes(contents, position, 14)  # the size (big-endian), the type, 6 data bytes
    size = tf.reduce_sum(head[:4] * tf.constant([2**24, 2**16, 2**8, 1], tf.int64))
    kind = head[4:8]
    prefixed = tf.cast((size >= 6) & _equals(head[8:], _EXIF_HEADER), tf.int64) * 6
    found = _equals(kind, b"eXIf")
    ends = _equals(kind, b"IDAT") | _equals(kind, b"IEND")
    return found, ends, position + 12 + size, position + 8 + prefixed, size - prefixed


def _walk(contents, first, step):
    """(start, size) of the EXIF data `step` finds walking a file's segments or chunks
    from `first`, at most MAX_SEGMENTS; (0, 0) when it ends without finding any. `step`
    returns (found, ends, next position, start, size) for the segment at a position."""

    def body(count, position, start, size):
        found, ends, following, found_start, found_size = step(contents, position)
        start = tf.where(found, found_start, start)
        size = tf.where(found, found_size, size)
        return count + 1, tf.where(found | ends, tf.constant(-1, tf.int64), following), start, size

    zero = tf.constant(0, tf.int64)
    _, _, start, size = tf.while_loop(
        lambda count, position, *_: (count < MAX_SEGMENTS) & (position >= 0),
        body,
        (tf.constant(0), tf.constant(first, tf.int64), zero, zero),
    )
    return start, size


def _tiff_orientation(contents, start, size):
    """The Orientation of the TIFF structure (EXIF data) at `start`: the first one-SHORT
    Orientation entry of IFD0 that lies whole within the data, 2..8; else 1."""
    # A file may end just after the EXIF header: substr fails at a start past the end.
    start = tf.minimum(start, tf.cast(tf.strings.length(contents), tf.int64))
    raw = tf.io.decode_raw(
        tf.strings.substr(contents, start, tf.clip_by_value(size, 0, MAX_EXIF_BYTES)), tf.uint8
    )
    length = tf.shape(raw, out_type=tf.int64)[0]
    data = tf.pad(tf.cast(raw, tf.int64), [[0, 4]])
    little = _equals(data[:2], b"II")

    def number(offsets, width):
        """The unsigned `width`-byte numbers at `offsets` (zeros past the end)."""
        indices = offsets[..., None] + tf.range(width, dtype=tf.int64)
        values = tf.gather(data, tf.clip_by_value(indices, 0, length))
        weights = tf.constant([256**i for i in range(width)], tf.int64)
        weights = tf.where(little, weights, tf.reverse(weights, [0]))
        return tf.reduce_sum(values * weights, -1)

    valid = (little | _equals(data[:2], b"MM")) & (number(tf.constant(2, tf.int64), 2) == 42)
    directory = number(tf.constant(4, tf.int64), 4)
    fitting = tf.maximum((length - directory - 2) // 12, 0)  # entries lying whole in the data
    count = tf.where(valid, tf.minimum(number(directory, 2), fitting), 0)
    indices = tf.range(count)
    entries = directory + 2 + 12 * indices
    matches = (
        (number(entries, 2) == ORIENTATION_TAG)
        & (number(entries + 2, 2) == 3)  # SHORT
        & (number(entries + 4, 4) == 1)  # one value
    )
    first = tf.reduce_min(tf.where(matches, indices, count))  # Pillow skips repeated tags
    value = tf.reduce_sum(tf.where(indices == first, number(entries + 8, 2), 0))
    return tf.cast(tf.where((value >= 2) & (value <= 8), value, 1), tf.int32)
