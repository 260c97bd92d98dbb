"""Plumbing (hand-written): a measured network model in a small JSON file, loadable as a preset.

`dsml calibrate` measures α and β with a ping-pong (and γ with `np.add`) on this machine and
writes them with `save_network`; the simulator then loads them with `load_network(path)`, like
a preset from `dsml.net.presets.network(name)`:

    {"format": "dsml-network/1", "model": "AlphaBeta",
     "alpha": 1.2e-05, "beta": 1.1e-10, "gamma": 1.8e-10,
     "measured": {"engine": "processes", "host": "...", "sizes": [...], ...}}

α and β are in s and s/byte, γ in s/byte. "measured" records how the numbers were obtained
(free-form; `load_network` ignores it, `load_measurement` returns it).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from dsml.net.alphabeta import AlphaBeta

FORMAT = "dsml-network/1"


def save_network(network: AlphaBeta, path, measured: dict | None = None) -> Path:
    """Write `network` (an AlphaBeta) and how it was measured to `path`, atomically (a
    temporary file renamed into place, so a reader never sees half a file). Returns the path."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: directory {path.parent} does not exist")
    record = {"format": FORMAT, "model": "AlphaBeta", "alpha": network.alpha,
              "beta": network.beta, "gamma": network.gamma, "measured": measured or {}}
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        temporary.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _read(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no network file at {path} (write one with `dsml calibrate --output "
                         f"{path}`)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a dsml network file: not JSON ({error})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dsml network file: expected \"format\": \"{FORMAT}\"")
    if record.get("model") != "AlphaBeta":
        raise ValueError(f"{path}: unknown network model {record.get('model')!r}; "
                         f"this version reads AlphaBeta")
    units = {"alpha": "s", "beta": "s/B", "gamma": "s/B"}
    for key, unit in units.items():
        value = record.get(key)
        # JSON's true/false are Python bools, which are ints: not a time.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: \"{key}\" must be a number of {unit} (finite, ≥ 0), "
                             f"got {value!r}" if key in record else
                             f"{path}: \"{key}\" is missing (a number of {unit}, finite, ≥ 0)")
        try:
            number = float(value)
        except OverflowError:                # a 400-digit integer
            number = math.inf
        if not math.isfinite(number):        # (a negative one: AlphaBeta refuses it below)
            text = repr(value)
            shown = text if len(text) <= 40 else f"{text[:20]}… ({len(text)} digits)"
            raise ValueError(f"{path}: \"{key}\" must be a finite number of {unit} (≥ 0), "
                             f"got {shown}")
        record[key] = number
    return record


def load_network(path) -> AlphaBeta:
    """The AlphaBeta model saved at `path` (by `save_network` or `dsml calibrate`)."""
    record = _read(path)
    try:
        return AlphaBeta(record["alpha"], record["beta"], record["gamma"])
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def load_measurement(path) -> dict:
    """What the file says about how its numbers were measured (engine, host, sizes, times)."""
    return dict(_read(path).get("measured") or {})
