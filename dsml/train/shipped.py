"""Plumbing (hand-written): data sets shipped inside the package, read without any download.

`load_digits()` returns the 1,797 handwritten digits of the UCI "Optical Recognition of
Handwritten Digits" test set (Alpaydin & Kaynak, 1998; CC BY 4.0): 8×8 images whose pixels
count the ink in 4×4 blocks of a 32×32 bitmap (integers 0..16), and their labels 0..9. Source,
licence and how the file was made: dsml/train/files/README.md.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FILES = Path(__file__).resolve().parent / "files"
DIGITS_FILE = FILES / "digits.npz"
DIGITS_SHA256 = "b2dab7b501728c22e9119ad76740b2e17c77a231e42d1e592380d90886f1a05e"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images, labels): images uint8 of shape (1797, 8, 8) with values 0..16, labels int64
    of shape (1797,) with values 0..9. Fresh arrays on every call (safe to modify)."""
    if not DIGITS_FILE.exists():
        raise FileNotFoundError(f"{DIGITS_FILE} is missing: the package was installed without "
                                f"its data files; reinstall it from the repository")
    with np.load(DIGITS_FILE) as archive:
        images = np.array(archive["images"], dtype=np.uint8)
        labels = np.array(archive["labels"], dtype=np.int64)
    return images, labels
