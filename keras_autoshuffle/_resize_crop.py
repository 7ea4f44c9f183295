"""torchvision's evaluation resize and center crop (`Resize(size)`, `CenterCrop(crop)`):
the size rule, the crop offset, and the TensorFlow resize-and-crop for images whose
sides are only known when run. `applications.ResizeCenterCrop` and the training data
pipeline's ImageNet evaluation (`data.resize_center_crop`) both use these, so the two
give the same pixels.
"""


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
    static shape has the crop's sides."""
    import tensorflow as tf

    shape = tf.shape(images)
    height, width = shape[-3], shape[-2]
    new_height, new_width = resized_size(height, width, resize_size)
    resized = tf.image.resize(images, tf.stack([new_height, new_width]), "bilinear", antialias=True)
    top, left = crop_start(new_height, crop_size), crop_start(new_width, crop_size)
    cropped = resized[..., top : top + crop_size, left : left + crop_size, :]
    return tf.ensure_shape(cropped, [*images.shape[:-3], crop_size, crop_size, images.shape[-1]])
