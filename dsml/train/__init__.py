"""Plumbing (hand-written): dsml.train — the NumPy training substrate of weeks 3–6.

Models, losses and optimizers are written in notebooks/week3_data_parallelism.ipynb and exported
here. What ships with the package as data (no download at run time) is read by
`dsml.train.shipped`.
"""
from dsml.train.shipped import load_digits

__all__ = ["load_digits"]
