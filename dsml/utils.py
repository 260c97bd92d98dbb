"""Plumbing (hand-written): small helpers every layer may use (it imports nothing of dsml)."""
from __future__ import annotations


def add_to_class(cls):
    """Decorator: attach the function below as a method of `cls`.

    Lets a notebook build a class over several short cells, each explained on its own
    (the idea of Dive into Deep Learning's `add_to_class`)::

        @add_to_class(Simulator)
        def run(self): ...
    """
    def attach(function):
        setattr(cls, function.__name__, function)
        return function
    return attach
