"""The data shipped with the package: the file is the one its README describes (checksum), and
`load_digits` returns it in the documented shapes, types, ranges and class counts."""
from __future__ import annotations

import hashlib

import numpy as np

from dsml.train import load_digits
from dsml.train.shipped import DIGITS_FILE, DIGITS_SHA256

# The UCI description of the test set: images per digit 0..9.
UCI_TEST_SET_CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_the_file_is_the_documented_one():
    assert hashlib.sha256(DIGITS_FILE.read_bytes()).hexdigest() == DIGITS_SHA256
    readme = (DIGITS_FILE.parent / "README.md").read_text(encoding="utf-8")
    assert DIGITS_SHA256 in readme and "CC BY 4.0" in readme


def test_digits_have_the_documented_shapes_ranges_and_classes():
    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert labels.shape == (1797,) and labels.dtype == np.int64
    assert images.min() == 0 and images.max() == 16
    assert np.bincount(labels, minlength=10).tolist() == UCI_TEST_SET_CLASS_COUNTS


def test_each_call_returns_fresh_arrays():
    images, labels = load_digits()
    images[:] = 0
    labels[:] = -1
    again_images, again_labels = load_digits()
    assert again_images.max() == 16 and again_labels.min() == 0


def test_every_digit_has_ink():
    images, _ = load_digits()
    assert (images.reshape(len(images), -1).sum(axis=1) > 0).all()
