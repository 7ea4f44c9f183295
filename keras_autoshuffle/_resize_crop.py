"""torchvision's evaluation resize and center crop (`Resize(size)`, `CenterCrop(crop)`):
the size rule, the crop offset, and the TensorFlow resize-and-crop for images whose
sides are only known when run. `applications.ResizeCenterCrop` and the training data
pipeline's ImageNet evaluation (`data.resize_center_crop`) both use these, so the two
give the same pixels.

Both refuse images that cannot be resized sensibly (`check_sides`): a side of 0 pixels,
or a longer side more than `MAX_ASPECT_RATIO` times the shorter one (resizing the shorter
side to 256 would make a 1 x 100000 image 256 x 25,600,000, 78 GB in float32, only to keep
its central 224 x 224).
"""

# The longest image accepted, as a multiple of its shorter side: resized, the longer side is
# at most MAX_ASPECT_RATIO * resize_size (25,600 pixels at 256, 79 MB per RGB float32 image).
MAX_ASPECT_RATIO = 100


def _empty_message(name):
    return f"`{name}` must have at least 1 pixel on each side. Received: {name}.shape="


def _long_message(name):
    return (
        f"`{name}` must have a longer side at most {MAX_ASPECT_RATIO} times the shorter "
        "(MAX_ASPECT_RATIO: the resize of the shorter side would make the longer one that "
        f"many times the resize size, or more). Received: {name}.shape="
    )


def check_sides(height, width, shape, name="images"):
    """ValueError naming `name` and its `shape` unless `height` and `width` (Python ints)
    are >= 1 and the longer is at most MAX_ASPECT_RATIO times the shorter."""
    short, long = min(height, width), max(height, width)
    if short < 1:
        raise ValueError(_empty_message(name) + str(tuple(shape)))
    if long > MAX_ASPECT_RATIO * short:
        raise ValueError(_long_message(name) + str(tuple(shape)))


def tf_check_sides(images, height, width, name="images"):
    """`images` (a TensorFlow tensor) once its sides (scalar tensors, read when run) pass
    `check_sides`'s rule; else an InvalidArgumentError with the same message when run."""
    import tensorflow as tf

    short = tf.cast(tf.minimum(height, width), tf.int64)
    long = tf.cast(tf.maximum(height, width), tf.int64)
    shape = tf.shape(images)
    empty = tf.debugging.Assert(short >= 1, [_empty_message(name), shape], summarize=8)
    with tf.control_dependencies([empty]):
        check = tf.debugging.Assert(
            long <= MAX_ASPECT_RATIO * short, [_long_message(name), shape], summarize=8
        )
    with tf.control_dependencies([check]):
        return tf.identity(images)


def resized_size(height, width, size):
    """torchvision's `Resize(size)` output (height, width): the shorter side `size`, the
    longer one `int(size * long / short)`. Python ints, or TensorFlow tensors."""
    if isinstance(height, int) and isinstance(width, int):
        if width <= height:
            return int(size * height / width), size
        return size, int(size * width / height)
    import tensorflow as tf

    short, long = tf.minimum(height, width), tf.maximum(height, width)
    new_long = (size * long) // short  # = int(size * long / short) for positive ints
    tall = width <= height
    return tf.where(tall, new_long, size), tf.where(tall, size, new_long)


def crop_start(side, crop):
    """torchvision's `CenterCrop` offset: `int(round((side - crop) / 2))`, Python's round
    (halves to even), for ints or TensorFlow tensors."""
    if isinstance(side, int):
        return int(round((side - crop) / 2.0))
    half = (side - crop) // 2
    return half + ((side - crop) % 2) * (half % 2)


def tf_resize_center_crop(images, resize_size, crop_size):
    """`Resize(resize_size)` (bilinear, antialiased) then `CenterCrop(crop_size)` of float
    TensorFlow images, channels last, one image (rank 3) or a batch (rank 4), their sides
    read when run (for `tf.data` maps and graphs traced with unknown sides). The result's
    static shape has the crop's sides. Sides refused by `check_sides`: ValueError where
    they are known when traced, else InvalidArgumentError when run, before any resize."""
    import tensorflow as tf

    static = images.shape[-3:-1]
    if static[0] is not None and static[1] is not None:
        check_sides(static[0], static[1], images.shape)
    shape = tf.shape(images)
    height, width = shape[-3], shape[-2]
    images = tf_check_sides(images, height, width)
    new_height, new_width = resized_size(height, width, resize_size)
    resized = tf.image.resize(images, tf.stack([new_height, new_width]), "bilinear", antialias=True)
    top, left = crop_start(new_height, crop_size), crop_start(new_width, crop_size)
    cropped = resized[..., top : top + crop_size, left : left + crop_size, :]
    return tf.ensure_shape(cropped, [*images.shape[:-3], crop_size, crop_size, images.shape[-1]])
