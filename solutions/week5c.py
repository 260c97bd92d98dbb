"""Reference solutions of bonus notebook 5c's exercises (expert parallelism).

Each function has the name of the notebook stub it solves; `check(id, f)` passes for each.
"""
from __future__ import annotations

import math


def dropped_tokens(choices, experts, capacity_factor):
    """Exercise 5c.1: each expert keeps ⌈c·T/E⌉ of its requests and drops the rest."""
    slots = math.ceil(capacity_factor * len(choices) / experts)
    return sum(max(choices.count(e) - slots, 0) for e in range(experts))


def dispatch_bytes(tokens, hidden, experts, k, capacity_factor, ep, itemsize):
    """Exercise 5c.2: the E × C × h buffer, of which the other ranks' (ep − 1)/ep is sent."""
    slots = math.ceil(capacity_factor * tokens * k / experts)
    return (ep - 1) * (experts // ep) * slots * hidden * itemsize
