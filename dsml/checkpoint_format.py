"""Plumbing (hand-written): the checkpoint file format behind dsml.checkpoint — the zip of
`.npy` arrays with the metadata inside it, the manifest that describes it and every check of
its form, the JSON of a bit generator's state, and the names of the temporary files and
directories a save uses (so that the next save can sweep what a killed one left).

Week 6's notebook (section 2) keeps what a learner reads: the protocol — write to a temporary
file, fsync, rename, the manifest last, verify the checksum on load, fall back past a damaged
checkpoint. What it means for bytes to be "a checkpoint" lives here.

Layout of one checkpoint directory `step_<n>`:

- `state.npz`: a zip (stored, not compressed; fixed timestamps, so equal states give equal
  bytes) of one `.npy` per array and `meta.json.npy`, the metadata as UTF-8 bytes in a uint8
  array — so that one SHA-256 covers every bit of the state;
- `manifest.json`: format and version, step, the data file's name, length and SHA-256, each
  array's shape and dtype, the model's configuration and the optimizer's class.

Loading never unpickles. Any departure from this form is a `CorruptCheckpoint` naming the
directory and what is wrong; another format or version is an `IncompatibleCheckpoint`.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np

FORMAT = "dsml-checkpoint"
FORMAT_VERSION = 1
DATA_FILE = "state.npz"
MANIFEST_FILE = "manifest.json"
META_ARRAY = "meta.json"
FIXED_ZIP_DATE = (1980, 1, 1, 0, 0, 0)        # the earliest a zip can store
MANIFEST_KEYS = {"format": str, "format_version": int, "step": int, "data_file": str,
                 "data_bytes": int, "data_sha256": str, "arrays": dict}

# A save writes into a staging directory and renames it into place; re-saving a step moves the
# old directory aside first. Both names start with a dot, so they never look like a checkpoint,
# and the next save removes any it finds (a killed save's leftovers).
STAGING_SUFFIX = ".tmp"
RETIRED_SUFFIX = ".old"
LEFTOVER = re.compile(r"^\.step_\d+\..*(\.tmp|\.old)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says which and why."""


class CorruptCheckpoint(CheckpointError):
    """Incomplete, truncated, altered or malformed: its bytes are not those that were written.
    A manager falls back to the previous checkpoint."""


class IncompatibleCheckpoint(CheckpointError):
    """Intact, but of another format version, or made by another model, optimizer or data set.
    A manager skips a newest checkpoint of another format version, with a message; a restore
    into objects it does not fit is refused with every mismatch named."""


class CheckpointWarning(UserWarning):
    """Issued when a manager skips a damaged checkpoint for an older one."""


def fsync_directory(directory) -> None:
    """Flush `directory` itself to disk, making a rename or a new name in it durable (POSIX keeps
    names in the directory). Skipped where a directory cannot be opened (Windows)."""
    if os.name != "posix":
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove_tree(path) -> None:
    """Remove a checkpoint directory (or a leftover file): its manifest first, so that a removal
    cut short leaves an incomplete checkpoint, never one that looks complete."""
    path = Path(path)
    if not path.exists():
        return
    if path.is_dir():
        manifest = path / MANIFEST_FILE
        if manifest.exists():
            manifest.unlink()
            fsync_directory(path)
        shutil.rmtree(path)
    else:
        path.unlink()
    fsync_directory(path.parent)


def leftovers(directory) -> list:
    """The staging and retired entries a killed save left in `directory` (dot-names ending in
    .tmp or .old: staging directories, moved-aside old checkpoints, temporary files)."""
    return sorted(path for path in Path(directory).iterdir() if LEFTOVER.match(path.name))


# --- JSON of a bit generator's state -------------------------------------------------------------

def to_json(value):
    """A bit generator's state as JSON: ints stay ints (exactly), arrays become tagged lists."""
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    return value


def from_json(value):
    """The inverse of to_json."""
    if isinstance(value, dict):
        if set(value) == {"ndarray", "dtype"}:
            return np.array(value["ndarray"], dtype=value["dtype"])
        return {key: from_json(item) for key, item in value.items()}
    return value


# --- encoding ----------------------------------------------------------------------------------

def zip_arrays(arrays: dict) -> bytes:
    """The bytes of a zip of one `.npy` per array (stored, fixed timestamps: equal arrays give
    equal bytes; object arrays refused)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            member = zipfile.ZipInfo(f"{name}.npy", date_time=FIXED_ZIP_DATE)
            with archive.open(member, "w", force_zip64=True) as file:
                np.lib.format.write_array(file, np.ascontiguousarray(arrays[name]),
                                          allow_pickle=False)
    return buffer.getvalue()


def encode(state) -> tuple:
    """(the bytes of state.npz, the manifest as a dict) for a TrainingState `state` (its `step`,
    `arrays` and `meta`); equal states give equal bytes. Object arrays are refused (they would
    need pickle)."""
    arrays = dict(state.arrays)
    arrays[META_ARRAY] = np.frombuffer(json.dumps(state.meta, sort_keys=True).encode("utf-8"),
                                       dtype=np.uint8)
    data = zip_arrays(arrays)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": state.step,
                "data_file": DATA_FILE, "data_bytes": len(data),
                "data_sha256": hashlib.sha256(data).hexdigest(),
                "arrays": {name: {"shape": list(arrays[name].shape),
                                  "dtype": arrays[name].dtype.str} for name in sorted(arrays)},
                "model": state.meta["model"], "optimizer": state.meta["optimizer"]["class"]}
    return data, manifest


def manifest_bytes(manifest: dict) -> bytes:
    """The bytes of manifest.json."""
    return json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")


# --- reading -----------------------------------------------------------------------------------

def _valid_array_spec(spec) -> bool:
    return (isinstance(spec, dict) and isinstance(spec.get("shape"), list)
            and all(isinstance(n, int) and n >= 0 for n in spec["shape"])
            and isinstance(spec.get("dtype"), str))


def _manifest_object(path: Path, keys: dict, missing: str) -> dict:
    """manifest.json of `path` as a dict holding each of `keys` with its type (a bool is not an
    int); CorruptCheckpoint if missing (`missing` says what that means), unreadable or not so."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path.name}: no {MANIFEST_FILE}, {missing}") from None
    except (OSError, ValueError) as error:       # unreadable, not UTF-8, not JSON
        raise CorruptCheckpoint(f"{path.name}: unreadable {MANIFEST_FILE} ({error})") from None
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"{path.name}: {MANIFEST_FILE} is not a JSON object")
    for key, kind in keys.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise CorruptCheckpoint(f"{path.name}: {MANIFEST_FILE} lacks a valid {key!r}")
    return manifest


def read_manifest(path) -> dict:
    """The manifest of the checkpoint directory `path`, checked for form: CorruptCheckpoint if it
    is missing or malformed (a key missing or of the wrong type, an array entry that is not
    {"shape": [...], "dtype": "..."}), IncompatibleCheckpoint if it is of another format or
    format version."""
    path = Path(path)
    manifest = _manifest_object(path, MANIFEST_KEYS, "so its write never finished")
    if manifest["format"] != FORMAT or manifest["format_version"] != FORMAT_VERSION:
        raise IncompatibleCheckpoint(
            f"{path.name}: format {manifest['format']!r} version {manifest['format_version']}; "
            f"this code reads {FORMAT!r} version {FORMAT_VERSION}")
    if manifest["data_file"] != DATA_FILE:
        raise CorruptCheckpoint(f"{path.name}: data_file must be {DATA_FILE!r}, got "
                                f"{manifest['data_file']!r}")
    bad = [name for name, spec in manifest["arrays"].items() if not _valid_array_spec(spec)]
    if bad:
        raise CorruptCheckpoint(f"{path.name}: {MANIFEST_FILE} has malformed array entries "
                                f"{bad[:3]} (each must be {{'shape': [...], 'dtype': '...'}})")
    return manifest


def decode(path, data: bytes, manifest: dict) -> tuple:
    """(arrays, meta) of a data file whose length and checksum were already checked: opened
    without pickle, holding exactly the arrays the manifest lists with their shapes and dtypes,
    and the same step in its metadata as in the manifest. CorruptCheckpoint otherwise."""
    name = Path(path).name
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
        meta = json.loads(arrays.pop(META_ARRAY).tobytes().decode("utf-8"))
    except Exception as error:        # a bad zip, a pickled object, bad JSON: all the same here
        raise CorruptCheckpoint(f"{name}: unreadable {DATA_FILE} ({error})") from None
    listed = {key: spec for key, spec in manifest["arrays"].items() if key != META_ARRAY}
    if set(listed) != set(arrays):
        raise CorruptCheckpoint(f"{name}: the manifest lists {sorted(listed)} but "
                                f"{DATA_FILE} holds {sorted(arrays)}")
    for key, spec in listed.items():
        if list(arrays[key].shape) != spec["shape"] or arrays[key].dtype.str != spec["dtype"]:
            raise CorruptCheckpoint(f"{name}: {key} is {arrays[key].dtype.str} "
                                    f"{arrays[key].shape} but the manifest says {spec}")
    if not isinstance(meta, dict) or meta.get("step") != manifest["step"]:
        step = meta.get("step") if isinstance(meta, dict) else None
        raise CorruptCheckpoint(f"{name}: step {step} in the data, {manifest['step']} in the "
                                f"manifest")
    return arrays, meta


# --- sharded checkpoints: one file per rank, a manifest written last by rank 0 ------------------

SHARDED_FORMAT = "dsml-sharded-checkpoint"
SHARDED_KEYS = {"format": str, "format_version": int, "step": int, "world_size": int,
                "totals": dict, "dtypes": dict, "shards": list}
SHARD_KEYS = {"rank": int, "file": str, "bytes": int, "sha256": str, "offsets": dict}


def shard_file(rank: int, world_size: int) -> str:
    """The file name of rank `rank`'s shard in a checkpoint saved by `world_size` ranks."""
    return f"shard_{rank:05d}_of_{world_size:05d}.npz"


def encode_shard(rank: int, world_size: int, shards: dict) -> tuple:
    """(the bytes of rank `rank`'s shard file, its description for the manifest) for `shards`,
    name -> this rank's 1-D piece of each flat vector."""
    if not isinstance(shards, dict) or not shards:
        raise ValueError(f"shards must be a non-empty dict of name -> 1-D array, got {shards!r}")
    arrays = {}
    for name, piece in shards.items():
        piece = np.asarray(piece)
        if piece.ndim != 1:
            raise ValueError(f"shard {name!r} must be 1-D (a piece of a flat vector), got shape "
                             f"{piece.shape}")
        arrays[name] = piece
    data = zip_arrays(arrays)
    entry = {"rank": rank, "file": shard_file(rank, world_size), "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(),
             "lengths": {name: len(a) for name, a in arrays.items()},
             "dtypes": {name: a.dtype.str for name, a in arrays.items()}}
    return data, entry


def sharded_manifest(step: int, entries: list) -> dict:
    """The manifest of a sharded checkpoint from every rank's shard description (encode_shard),
    in rank order: each array's total length and dtype, and each shard's [start, stop) in it —
    the ranks' pieces laid end to end. ValueError if the ranks disagree on names or dtypes."""
    entries = sorted(entries, key=lambda entry: entry["rank"])
    names, dtypes = sorted(entries[0]["lengths"]), entries[0]["dtypes"]
    totals, shards = dict.fromkeys(names, 0), []
    for entry in entries:
        if sorted(entry["lengths"]) != names or entry["dtypes"] != dtypes:
            raise ValueError(f"rank {entry['rank']} saved arrays {entry['dtypes']}, rank "
                             f"{entries[0]['rank']} {dtypes}: every rank must save the same names "
                             f"and dtypes")
        offsets = {}
        for name in names:
            offsets[name] = [totals[name], totals[name] + entry["lengths"][name]]
            totals[name] += entry["lengths"][name]
        shards.append({"rank": entry["rank"], "file": entry["file"], "bytes": entry["bytes"],
                       "sha256": entry["sha256"], "offsets": offsets})
    return {"format": SHARDED_FORMAT, "format_version": FORMAT_VERSION, "step": step,
            "world_size": len(entries), "totals": totals, "dtypes": dict(dtypes),
            "shards": shards}


def _form_error(path, what: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"{Path(path).name}: {MANIFEST_FILE} {what}")


def read_sharded_manifest(path) -> dict:
    """The manifest of the sharded checkpoint directory `path`, checked for form and for
    consistency (the shards of each array tile [0, total) in rank order, one per rank):
    CorruptCheckpoint if missing, malformed or inconsistent; IncompatibleCheckpoint if of
    another format or version."""
    path = Path(path)
    manifest = _manifest_object(path, SHARDED_KEYS, "so the save never finished (rank 0 "
                                                    "writes it after every shard is written)")
    if manifest["format"] != SHARDED_FORMAT or manifest["format_version"] != FORMAT_VERSION:
        raise IncompatibleCheckpoint(
            f"{path.name}: format {manifest['format']!r} version {manifest['format_version']}; "
            f"this code reads {SHARDED_FORMAT!r} version {FORMAT_VERSION}")
    names = sorted(manifest["totals"])
    if sorted(manifest["dtypes"]) != names or len(manifest["shards"]) != manifest["world_size"]:
        raise _form_error(path, "is inconsistent: names, dtypes and shards do not match")
    ends = dict.fromkeys(names, 0)
    for rank, shard in enumerate(manifest["shards"]):
        if not isinstance(shard, dict) or any(not isinstance(shard.get(key), kind)
                                              for key, kind in SHARD_KEYS.items()):
            raise _form_error(path, f"has a malformed entry for shard {rank}")
        if shard["rank"] != rank or sorted(shard["offsets"]) != names:
            raise _form_error(path, f"has shard {rank} out of order or with other arrays")
        for name in names:
            bounds = shard["offsets"][name]
            if not (isinstance(bounds, list) and len(bounds) == 2 and bounds[0] == ends[name]
                    and isinstance(bounds[1], int) and bounds[1] >= bounds[0]):
                raise _form_error(path, f"has shard {rank} of {name!r} at {bounds}, not starting "
                                        f"where shard {rank - 1} ends ({ends[name]})")
            ends[name] = bounds[1]
    if ends != manifest["totals"]:
        raise _form_error(path, f"says totals {manifest['totals']} but the shards cover {ends}")
    return manifest


def read_shard(path, shard: dict, dtypes: dict) -> dict:
    """The arrays of one shard (an entry of the manifest's "shards") of the sharded checkpoint
    in `path`, verified: the file's length and SHA-256, no pickle, exactly the manifest's arrays
    with their lengths and dtypes. CorruptCheckpoint naming the shard otherwise."""
    where = f"{Path(path).name}/{shard['file']} (rank {shard['rank']}'s shard)"
    try:
        data = (Path(path) / shard["file"]).read_bytes()
    except OSError as error:
        raise CorruptCheckpoint(f"{where}: cannot read it ({error})") from None
    if len(data) != shard["bytes"]:
        raise CorruptCheckpoint(f"{where}: {len(data):,} bytes but the manifest says "
                                f"{shard['bytes']:,} (truncated?)")
    if hashlib.sha256(data).hexdigest() != shard["sha256"]:
        raise CorruptCheckpoint(f"{where}: checksum mismatch")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as error:
        raise CorruptCheckpoint(f"{where}: unreadable ({error})") from None
    for name, (start, stop) in shard["offsets"].items():
        if name not in arrays or arrays[name].shape != (stop - start,) \
                or arrays[name].dtype.str != dtypes[name]:
            raise CorruptCheckpoint(f"{where}: {name} does not match the manifest")
    return arrays
