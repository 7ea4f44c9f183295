"""Pipelines: embedded digits, Fashion-MNIST (tiny IDX files), TFDS CIFAR-10 / ImageNet (mock
data), determinism."""

import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import _write_fashion, _write_idx

from keras_autoshuffle import data
from keras_autoshuffle.applications import ResizeCenterCrop
from keras_autoshuffle.data import sources


def _collect(dataset):
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset], strict=True)
    return np.concatenate(images), np.concatenate(labels)


@pytest.fixture(scope="module")
def digits():
    return data.digits(seed=3)


@pytest.fixture
def mocked_tfds():
    """TFDS random mock examples; `is_prepared` patched (the mock writes no metadata)."""
    with (
        tfds.testing.mock_data(num_examples=12),
        mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", return_value=True),
    ):
        yield


def test_digits_split_shapes_and_ranges(digits):
    train, test = digits
    # load_digits has 1797 images; 80/20 stratified -> 1437 / 360, 10 classes.
    assert (train.num_examples, test.num_examples) == (1437, 360)
    assert train.input_shape == (32, 32, 3) and train.num_classes == 10
    counts = np.bincount(test.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified: 10% of 360 each, +-1
    for split in (train, test):
        assert split.images.dtype == np.float32 and split.labels.dtype == np.int32
        assert split.images.min() >= -1.0 and split.images.max() <= 1.0
        # grey digits: the three channels are equal
        np.testing.assert_array_equal(split.images[..., 0], split.images[..., 2])


def test_digits_are_sklearn_digits_upsampled():
    from sklearn.datasets import load_digits

    (x_train, y_train), (x_test, y_test) = data.load_digits(size=8)
    reference = load_digits()
    # At 8x8 the resize is the identity: every image is one of scikit-learn's, / 16.
    expected = sorted(map(tuple, np.round(reference.images.reshape(-1, 64) / 16.0, 5)))
    ours = np.concatenate([x_train, x_test])[..., 0].reshape(-1, 64)
    assert sorted(map(tuple, np.round(ours, 5))) == expected
    assert sorted(np.concatenate([y_train, y_test])) == sorted(reference.target)


def test_training_batches_are_pure_functions_of_seed_and_epoch(digits):
    train, _ = digits
    first, labels = _collect(train.epoch_dataset(2, 64))
    again, labels_again = _collect(train.epoch_dataset(2, 64))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(labels, labels_again)
    _, other = _collect(train.epoch_dataset(3, 64))
    assert not np.array_equal(labels, other)  # a new order each epoch
    # training drops the last partial batch: 1437 // 64 = 22 batches
    assert len(labels) == 22 * 64 == train.steps(64) * 64


def test_augmentation_is_per_example_and_training_only(digits):
    train, test = digits
    seed, epoch = train.seed, 5
    order = data.epoch_permutation(train.num_examples, seed, epoch).numpy()
    images, labels = _collect(train.epoch_dataset(epoch, 32))
    np.testing.assert_array_equal(labels, train.labels[order[: len(labels)]])
    # Example i in epoch e is the crop drawn from (seed, e, i), wherever it lands.
    for position in (0, 7, 100):
        index = order[position]
        expected = data.pad_crop_flip(
            train.images[index], data.example_seed(seed, epoch, index), padding=2, flip=False
        )
        np.testing.assert_array_equal(images[position], expected.numpy())
    changed = [not np.array_equal(images[p], train.images[order[p]]) for p in range(64)]
    assert sum(changed) > 32  # most crops move the digit
    # Evaluation: stored order, no augmentation, last partial batch kept.
    eval_images, eval_labels = _collect(test.eval_dataset(100))
    np.testing.assert_array_equal(eval_images, test.images)
    np.testing.assert_array_equal(eval_labels, test.labels)


def test_fit_dataset_is_the_epochs_from_the_counters_on(digits):
    """Read from one iterator (as `fit` reads it with `steps_per_epoch`): the epochs from
    the counter's value when the iterator opens, each `steps` batches, then the next."""
    train, _ = digits
    counter = data.EpochCounter()
    dataset = train.fit_dataset(128, counter)
    assert int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY
    counter.variable.assign(4)
    steps = train.steps(128)
    read = _collect(dataset.take(2 * steps))[1]
    expected = [_collect(train.epoch_dataset(epoch, 128))[1] for epoch in (4, 5)]
    np.testing.assert_array_equal(read, np.concatenate(expected))


def test_shards_partition_each_global_batch(digits):
    train, _ = digits
    whole = _collect(train.epoch_dataset(1, 64))[1]
    shards = [_collect(train.epoch_dataset(1, 32, num_shards=2, shard_index=w))[1] for w in (0, 1)]
    for step in range(len(shards[1]) // 32):
        joined = np.concatenate([s[step * 32 : (step + 1) * 32] for s in shards])
        np.testing.assert_array_equal(joined, whole[step * 64 : (step + 1) * 64])


def test_bad_batch_size_raises(digits):
    with pytest.raises(ValueError, match="batch_size=0"):
        digits[0].epoch_dataset(0, 0)
    with pytest.raises(ValueError, match="batch_size=np.True_"):
        digits[0].epoch_dataset(0, np.bool_(True))
    # NumPy's integers are integers.
    numpy = _collect(digits[0].epoch_dataset(1, np.int64(64)))[1]
    np.testing.assert_array_equal(numpy, _collect(digits[0].epoch_dataset(1, 64))[1])
    with pytest.raises(ValueError, match="dataset='mnist'"):
        data.load("mnist")


def test_load_passes_each_source_its_options(monkeypatch):
    calls = {}
    for name in ("digits", "fashion_mnist", "cifar10", "imagenet"):
        monkeypatch.setattr(sources, name, lambda *args, _name=name: calls.setdefault(_name, args))
    assert data.DATASETS == ("digits", "fashion_mnist", "cifar10", "imagenet2012")
    for name in data.DATASETS:
        data.load(name, seed=1, data_dir="d", manual_dir="m", download=True)
    assert calls == {
        "digits": (1,),
        "fashion_mnist": (1, "d"),
        "cifar10": (1, "d", True),
        "imagenet": (1, "d", "m"),
    }


def test_cifar10_with_mock_data(mocked_tfds):
    train, test = data.cifar10(seed=1)
    assert train.images.shape == (12, 32, 32, 3) and train.images.dtype == np.float32
    # (x / 255 - mean) / std for x in [0, 255]
    low = -np.array(data.CIFAR10_MEAN) / np.array(data.CIFAR10_STD)
    high = (1 - np.array(data.CIFAR10_MEAN)) / np.array(data.CIFAR10_STD)
    assert np.all(train.images.min((0, 1, 2)) >= low - 1e-5)
    assert np.all(train.images.max((0, 1, 2)) <= high + 1e-5)
    assert set(train.labels) <= set(range(10)) and train.num_classes == 10
    images, _ = _collect(train.epoch_dataset(0, 4))
    assert images.shape == (12, 32, 32, 3)
    zeros = np.all(images == 0, axis=-1).mean()  # zero-padding shows up in crops
    assert zeros > 0
    np.testing.assert_array_equal(_collect(test.eval_dataset(5))[0], test.images)


def test_imagenet_with_mock_data(mocked_tfds):
    train, validation = data.imagenet(seed=0, size=32, shuffle_buffer=8)
    assert train.num_examples == 12 and train.num_classes == 1000
    images, labels = _collect(train.epoch_dataset(0, 4))
    assert images.shape == (12, 32, 32, 3) and images.dtype == np.float32
    assert labels.min() >= 0 and labels.max() < 1000
    low = (0 - np.array(data.IMAGENET_MEAN)) / np.array(data.IMAGENET_STD)
    high = (1 - np.array(data.IMAGENET_MEAN)) / np.array(data.IMAGENET_STD)
    assert images.min() >= low.min() - 1e-4 and images.max() <= high.max() + 1e-4
    again, labels_again = _collect(train.epoch_dataset(0, 4))
    np.testing.assert_array_equal(images, again)
    np.testing.assert_array_equal(labels, labels_again)
    first, eval_labels = _collect(validation.eval_dataset(5))
    second, _ = _collect(validation.eval_dataset(5))
    assert first.shape == (12, 32, 32, 3)
    np.testing.assert_array_equal(first, second)


def test_normalize_is_the_per_channel_formula_for_any_shape():
    # Computed as image * scale - offset along rows of pixels (speed): the formula
    # (image / 255 - mean) / std within float32 rounding, for one image or a batch, shapes
    # known or not when traced, per-channel or scalar constants; the static shape is kept.
    mean, std = data.IMAGENET_MEAN, data.IMAGENET_STD
    rng = np.random.default_rng(0)
    for shape in [(224, 224, 3), (7, 11, 3), (2, 5, 9, 3)]:
        image = rng.integers(0, 256, shape).astype(np.uint8)
        expected = (image / 255 - np.array(mean)) / np.array(std)
        np.testing.assert_allclose(data.normalize(image, mean, std), expected, atol=1e-6)
        traced = tf.function(lambda x: data.normalize(x, mean, std)).get_concrete_function(
            tf.TensorSpec([None] * (len(shape) - 1) + [3], tf.uint8)
        )
        np.testing.assert_allclose(traced(tf.constant(image)), expected, atol=1e-6)
    assert data.normalize(tf.zeros((4, 6, 3)), mean, std).shape == (4, 6, 3)
    gray = rng.integers(0, 256, (5, 4, 1)).astype(np.uint8)
    np.testing.assert_allclose(
        data.normalize(gray, 0.5, 0.25), (gray / 255 - 0.5) / 0.25, atol=1e-6
    )
    # One channel against three constants: one image per channel, as NumPy broadcasts.
    np.testing.assert_allclose(
        data.normalize(gray, mean, std), (gray / 255 - np.array(mean)) / np.array(std), atol=1e-6
    )
    with pytest.raises(ValueError, match=r"4 channels.*Received: image.shape=\(5, 4, 4\)"):
        data.normalize(np.zeros((5, 4, 4), np.uint8), mean, std)


def test_the_random_resized_crop_is_the_uint8_resize_of_its_box():
    # The crop is cast to float32 before the resize (faster): the same pixels as resizing
    # the uint8 crop of the box sampled with the torchvision ranges.
    rng = np.random.default_rng(1)
    for height, width in [(448, 597), (37, 23), (300, 300)]:
        image = tf.constant(rng.integers(0, 256, (height, width, 3)).astype(np.uint8))
        for k in range(4):
            seed = tf.constant([k, height], tf.int64)
            begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
                tf.shape(image),
                bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
                seed=tf.random.experimental.stateless_split(seed, 2)[0],
                min_object_covered=0.0,
                aspect_ratio_range=(3 / 4, 4 / 3),
                area_range=(0.08, 1.0),
                max_attempts=10,
                use_image_if_no_bounding_boxes=True,
            )
            expected = tf.image.resize(tf.slice(image, begin, size), (24, 24))
            crop = data.random_resized_crop(image, seed, size=24, flip=False)
            np.testing.assert_array_equal(crop, expected)


def test_resize_center_crop_takes_the_center():
    image = tf.reshape(tf.range(300 * 400 * 3, dtype=tf.float32), (300, 400, 3))
    out = data.resize_center_crop(image, resize=300, size=200)
    # resize is the identity (shorter side already 300): the crop starts at (50, 100)
    np.testing.assert_array_equal(out.numpy(), image.numpy()[50:250, 100:300])


# (height, width): landscape and portrait, odd and even sides, smaller and larger than 256.
# 300 x 398 -> 256 x 339 (torchvision's int; rounding gives 340), crop offset 57.5 -> 58.
EVAL_SIZES = [(375, 500), (500, 375), (300, 398), (257, 341), (100, 151), (151, 99), (256, 256)]


def test_eval_crop_is_the_applications_resize_center_crop():
    # The ImageNet evaluation transform (in a tf.data map, sides unknown when traced) gives
    # the pixels of ResizeCenterCrop, the one checked against torchvision's transform.
    images = [
        np.random.default_rng(h).uniform(0, 255, (h, w, 3)).astype("float32") for h, w in EVAL_SIZES
    ]
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(images), output_signature=tf.TensorSpec((None, None, 3), tf.float32)
    ).map(lambda image: data.resize_center_crop(image, resize=256, size=224))
    assert tuple(dataset.element_spec.shape) == (224, 224, 3)
    for image, out in zip(images, dataset, strict=True):
        expected = ResizeCenterCrop(256, 224)(image[None])[0].numpy()
        np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-5, err_msg=image.shape)


def test_imagenet_evaluation_is_evaluation_preprocessing_at_any_size():
    # The TFDS ImageNet pipeline's evaluation (ImageNet itself is not here: its builder is
    # stood in for) gives the pixels of `evaluation_preprocessing(size)`, whose resize is
    # round(size * 256 / 224): 183 for 160, where `size * 256 // 224` made 182.
    from keras_autoshuffle.applications import evaluation_preprocessing

    with (
        mock.patch.object(sources, "prepared_builder"),
        mock.patch.object(sources, "TFDSData") as made,
    ):
        sources.imagenet(size=160)
    eval_transform = made.call_args.args[3]
    image = np.random.default_rng(0).integers(0, 256, (210, 300, 3), dtype=np.uint8)
    jpeg = tf.io.encode_jpeg(image)
    decoded = tf.io.decode_jpeg(jpeg, channels=3).numpy().astype("float32")
    expected = evaluation_preprocessing(160)(decoded[None])[0].numpy()
    np.testing.assert_allclose(eval_transform(jpeg).numpy(), expected, rtol=0, atol=1e-5)


def test_missing_tfds_data_raises_with_instructions(tmp_path):
    with pytest.raises(data.DataMissingError, match="tfds build cifar10"):
        data.load("cifar10", data_dir=str(tmp_path))
    with pytest.raises(data.DataMissingError, match="ILSVRC2012_img_train.tar"):
        data.load("imagenet2012", data_dir=str(tmp_path), manual_dir=str(tmp_path))


def test_fashion_mnist_reads_idx_files(tmp_path):
    arrays = _write_fashion(tmp_path)
    train, test = data.fashion_mnist(seed=2, data_dir=tmp_path)
    assert (train.num_examples, test.num_examples) == (20, 10)
    assert train.input_shape == (28, 28, 1) and train.num_classes == test.num_classes == 10
    mean, std = data.FASHION_MNIST_MEAN[0], data.FASHION_MNIST_STD[0]
    for split, (images, labels) in zip((train, test), arrays.values(), strict=True):
        assert split.images.shape == (len(labels), 28, 28, 1)
        assert split.images.dtype == np.float32 and split.labels.dtype == np.int32
        np.testing.assert_array_equal(split.labels, labels)
        expected = (images[..., None] / 255.0 - mean) / std
        np.testing.assert_allclose(split.images, expected, rtol=1e-6, atol=1e-6)
        assert split.images.min() >= -mean / std - 1e-6
        assert split.images.max() <= (1 - mean) / std + 1e-6
    np.testing.assert_array_equal(test.labels, np.arange(10))  # every class 0..9
    # load() passes data_dir through and gives the same splits.
    loaded, _ = data.load("fashion_mnist", seed=2, data_dir=str(tmp_path))
    assert "fashion_mnist" in data.DATASETS
    np.testing.assert_array_equal(loaded.images, train.images)


def test_fashion_mnist_augmentation_is_a_function_of_seed_and_epoch(tmp_path):
    _write_fashion(tmp_path)
    train, test = data.fashion_mnist(seed=4, data_dir=tmp_path)
    epoch = 3
    images, labels = _collect(train.epoch_dataset(epoch, 5))
    again, labels_again = _collect(train.epoch_dataset(epoch, 5))
    np.testing.assert_array_equal(images, again)
    np.testing.assert_array_equal(labels, labels_again)
    assert images.shape == (20, 28, 28, 1)
    order = data.epoch_permutation(train.num_examples, train.seed, epoch).numpy()
    np.testing.assert_array_equal(labels, train.labels[order])
    for position in range(20):  # pad 2, random crop, random flip seeded by (seed, e, i)
        index = order[position]
        expected = data.pad_crop_flip(
            train.images[index], data.example_seed(train.seed, epoch, index), padding=2
        )
        np.testing.assert_array_equal(images[position], expected.numpy())
    changed = [not np.array_equal(images[p], train.images[order[p]]) for p in range(20)]
    assert sum(changed) > 10
    other_epoch, _ = _collect(train.epoch_dataset(epoch + 1, 5))
    assert not np.array_equal(images, other_epoch)
    other_seed, _ = data.fashion_mnist(seed=5, data_dir=tmp_path)
    assert not np.array_equal(images, _collect(other_seed.epoch_dataset(epoch, 5))[0])
    # augment=False: training is the permuted stored images; evaluation never augments.
    plain, _ = data.fashion_mnist(seed=4, data_dir=tmp_path, augment=False)
    np.testing.assert_array_equal(_collect(plain.epoch_dataset(epoch, 5))[0], plain.images[order])
    np.testing.assert_array_equal(_collect(test.eval_dataset(4))[0], test.images)


def test_fashion_mnist_search_order(tmp_path, monkeypatch):
    debian, keras_home = tmp_path / "debian", tmp_path / "keras"
    monkeypatch.setattr(sources, "FASHION_MNIST_DEBIAN_DIR", str(debian))
    monkeypatch.setenv("KERAS_HOME", str(keras_home))
    _write_fashion(keras_home / "datasets" / "fashion-mnist", seed=1)
    debian.mkdir()
    _write_idx(debian / "train-images-idx3-ubyte", np.zeros((20, 28, 28)))  # incomplete
    # Debian's folder lacks files: Keras' cache is used.
    train, _ = data.fashion_mnist()
    assert train.labels[0] == 1
    # Once Debian's folder is complete it comes first.
    _write_fashion(debian, seed=2)
    train, _ = data.fashion_mnist()
    assert train.labels[0] == 2
    # An explicit data_dir is the only place looked in.
    with pytest.raises(data.DataMissingError) as error:
        data.fashion_mnist(data_dir=tmp_path / "empty")
    looked = str(error.value).split("looked in: ")[1].split(". Install")[0]
    assert looked.startswith(f"{tmp_path / 'empty'} (missing train-images-idx3-ubyte[.gz]")
    assert str(debian) not in looked and str(keras_home) not in looked


def test_missing_fashion_mnist_raises_with_instructions(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "FASHION_MNIST_DEBIAN_DIR", str(tmp_path / "debian"))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    with pytest.raises(data.DataMissingError) as error:
        data.load("fashion_mnist")
    message = str(error.value)
    for text in (
        str(tmp_path / "debian"),
        str(tmp_path / "keras" / "datasets" / "fashion-mnist"),
        "t10k-labels-idx1-ubyte",
        "apt-get install dataset-fashion-mnist",
        "--data-dir DIR",
        "keras.datasets.fashion_mnist.load_data()",
    ):
        assert text in message


def test_damaged_fashion_mnist_files_raise_value_errors(tmp_path):
    _write_fashion(tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    images = tmp_path / "t10k-images-idx3-ubyte"
    gz = tmp_path / "train-images-idx3-ubyte.gz"
    good_gz = gz.read_bytes()

    def fails(pattern):
        with pytest.raises(ValueError, match=pattern) as error:
            data.fashion_mnist(data_dir=tmp_path)
        assert not isinstance(error.value, data.DataMissingError)

    images.write_bytes(images.read_bytes()[:-100])  # truncated plain file
    fails("t10k-images-idx3-ubyte is damaged or truncated")
    _write_idx(images, np.zeros((10, 28, 28)), magic=0x00000801)  # wrong magic number
    fails("t10k-images-idx3-ubyte is not an IDX file.*00000801")
    _write_idx(images, np.zeros((10, 27, 28)))  # wrong image shape
    fails(r"t10k-images-idx3-ubyte holds an array of shape \(10, 27, 28\)")
    _write_idx(images, np.zeros((9, 28, 28)))  # one label too many
    fails("holds 9 images but .*t10k-labels-idx1-ubyte holds 10 labels")
    _write_idx(images, np.zeros((10, 28, 28)))
    _write_idx(labels, np.full(10, 10))
    fails("t10k-labels-idx1-ubyte holds the label 10")
    _write_idx(labels, np.arange(10))
    gz.write_bytes(good_gz[: len(good_gz) // 2])  # truncated gzip stream
    fails("Cannot read the IDX file .*train-images-idx3-ubyte.gz")
    gz.write_bytes(good_gz)
    assert data.fashion_mnist(data_dir=tmp_path)[1].num_examples == 10


def test_real_fashion_mnist_if_installed():
    folder = data.FASHION_MNIST_DEBIAN_DIR
    names = [n + ".gz" for pair in data.FASHION_MNIST_FILES.values() for n in pair]
    if not all(os.path.exists(os.path.join(folder, n)) for n in names):
        pytest.skip(
            f"Fashion-MNIST is not installed in {folder} (apt-get install dataset-fashion-mnist)"
        )
    train, test = data.fashion_mnist(data_dir=folder)
    assert (train.num_examples, test.num_examples) == (60_000, 10_000)
    # The published class balance: 6000 per class in training, 1000 in test.
    np.testing.assert_array_equal(np.bincount(train.labels), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(test.labels), np.full(10, 1000))
    # The constants are the training set's statistics.
    assert abs(float(train.images.mean())) < 1e-3
    assert abs(float(train.images.std()) - 1.0) < 1e-3
