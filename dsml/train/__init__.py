"""Plumbing (hand-written): dsml.train — the NumPy training substrate of weeks 3–6.

Data sets, models with explicit backward passes, losses and optimizers are written in
notebooks/week3_data_parallelism.ipynb and exported to `dsml.train.data`, `dsml.train.models`
and `dsml.train.optim`; the files shipped with the package (no download at run time) are read by
`dsml.train.shipped`.
"""
from dsml.train.data import (batch_indices, digits, gaussian_mixture, sparse_regression,
                             teacher)
from dsml.train.models import (MLP, accuracy, loss_and_grads, mean_squared_error,
                               numerical_gradient, softmax_cross_entropy)
from dsml.train.optim import OPTIMIZERS, make_optimizer
from dsml.train.shipped import load_digits

__all__ = ["load_digits", "digits", "gaussian_mixture", "teacher", "sparse_regression",
           "batch_indices", "MLP", "softmax_cross_entropy", "mean_squared_error",
           "loss_and_grads", "accuracy", "numerical_gradient", "OPTIMIZERS", "make_optimizer"]
