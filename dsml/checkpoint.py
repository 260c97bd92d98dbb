"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 51
import contextlib
import hashlib
import io
import json
import numbers
import os
import re
import tempfile
import threading
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "dsml-checkpoint"
FORMAT_VERSION = 1
DATA_FILE = "state.npz"
MANIFEST_FILE = "manifest.json"
PARTS = ("model", "optimizer", "rng", "data")     # what a restore can put back


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says which and why."""


class CorruptCheckpoint(CheckpointError):
    """Incomplete, truncated or altered: its bytes are not those that were written. A manager
    falls back to the previous checkpoint."""


class IncompatibleCheckpoint(CheckpointError):
    """Intact, but made by another model, optimizer or data set. Older checkpoints of the same
    run would be too, so nothing falls back: the run stops with the mismatch named."""


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


def write_atomically(path, data: bytes) -> None:
    """Replace the file at `path` by `data` so that a crash at any instant leaves the old file or
    the new one, never a mixture: a temporary file in the same directory, write, flush, fsync,
    `os.replace`, fsync the directory. On any error the temporary file is removed first."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                             suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()                  # Python's buffer -> the kernel
            os.fsync(file.fileno())       # the kernel's page cache -> the disk
        os.replace(temporary, path)       # the one atomic step
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(path.parent)


# -- cell 53
from dsml.train.data import batch_indices


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of epoch `epoch` of a run seeded `seed` (both integers ≥ 0): a
    SeedSequence hash of the pair."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0])


def _check_count(name, value, least):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an integer ≥ {least}, got {value!r}")
    return int(value)


class ShuffledBatches:
    """Mini-batches of (X, y): every example once an epoch, in a fresh seeded order each epoch,
    the last batch of an epoch smaller when batch_size does not divide len(X). `position()` is
    all a checkpoint keeps of it; `seek(position)` puts it back."""

    def __init__(self, X, y, batch_size: int, seed: int = 0):
        X, y = np.asarray(X), np.asarray(y)
        if len(X) == 0 or len(X) != len(y):
            raise ValueError(f"need as many labels as examples (at least one), got {len(X)} "
                             f"examples and {len(y)} labels")
        self.X, self.y = X, y
        self.batch_size = _check_count("batch_size", batch_size, 1)
        self.seed = _check_count("seed", seed, 0)
        self.epoch, self.index = 0, 0
        self._cached_epoch, self._cached_batches = None, None

    @property
    def batches_per_epoch(self) -> int:
        return -(-len(self.X) // self.batch_size)

    def batches_of(self, epoch: int) -> list:
        """The index arrays of epoch `epoch`'s batches, in order (the last epoch's is cached)."""
        if epoch != self._cached_epoch:
            self._cached_batches = batch_indices(len(self.X), self.batch_size,
                                                 epoch_seed(self.seed, epoch))
            self._cached_epoch = epoch
        return self._cached_batches

    def next_batch(self):
        """(X_batch, y_batch) of the batch at the current position, then advance it."""
        batch = self.batches_of(self.epoch)[self.index]
        self.index += 1
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        return self.X[batch], self.y[batch]

    def position(self) -> dict:
        """Where the loader is: epoch, index of the next batch, seed — plus the data set size and
        batch size, which must match on restore for the same position to mean the same batch."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed,
                "examples": len(self.X), "batch_size": self.batch_size}

    def mismatches(self, position: dict) -> list:
        """Why `position` cannot be sought on this loader (an empty list when it can)."""
        problems = []
        for key, here in (("examples", len(self.X)), ("batch_size", self.batch_size)):
            if position[key] != here:
                problems.append(f"the data loader has {key} = {position[key]} in the checkpoint "
                                f"but {here} here")
        if not problems and not 0 <= position["index"] < self.batches_per_epoch:
            problems.append(f"batch index {position['index']} is outside 0.."
                            f"{self.batches_per_epoch - 1}")
        return problems

    def seek(self, position: dict) -> None:
        problems = self.mismatches(position)
        if problems:
            raise IncompatibleCheckpoint("; ".join(problems))
        self.seed = int(position["seed"])
        self.epoch, self.index = int(position["epoch"]), int(position["index"])


# -- cell 55
HYPERPARAMETERS = ("lr", "weight_decay", "momentum", "betas", "eps", "trust_coefficient")
META_ARRAY = "meta.json"
FIXED_ZIP_DATE = (1980, 1, 1, 0, 0, 0)        # the earliest a zip can store


@dataclass
class TrainingState:
    """Everything a run needs to go on exactly where it was: `arrays` (name -> ndarray, copies)
    and `meta` (JSON-able scalars and configuration); `step` optimizer steps were done."""

    step: int
    arrays: dict
    meta: dict

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays, the raw size of the state."""
        return sum(array.nbytes for array in self.arrays.values())


def _to_json(value):
    """A bit generator's state as JSON: ints stay ints (exactly), arrays become tagged lists."""
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value):
    if isinstance(value, dict):
        if set(value) == {"ndarray", "dtype"}:
            return np.array(value["ndarray"], dtype=value["dtype"])
        return {key: _from_json(item) for key, item in value.items()}
    return value


def model_config(model) -> dict:
    """What must match for a checkpoint's parameters to fit `model`, besides their shapes."""
    return {"class": type(model).__name__, "sizes": list(getattr(model, "sizes", [])),
            "activation": getattr(model, "activation", None),
            "frozen": sorted(getattr(model, "frozen", ()))}


def capture_state(step: int, model, optimizer, rng, data, losses=()) -> TrainingState:
    """A snapshot (copies) of the training state after `step` steps: the model's parameters, the
    optimizer's state, scalars and hyper-parameters, the bit generator of `rng` (a NumPy
    Generator), the position of `data` (a ShuffledBatches) and the losses so far."""
    step = _check_count("step", step, 0)
    arrays = {f"model/{name}": np.array(value, copy=True) for name, value in model.params.items()}
    parameter_steps = {}
    for name, value in optimizer.state.items():
        if isinstance(value, tuple):              # Adam, LAMB: (m, v, steps of this parameter)
            m, v, count = value
            arrays[f"optimizer/m/{name}"] = np.array(m, copy=True)
            arrays[f"optimizer/v/{name}"] = np.array(v, copy=True)
            parameter_steps[name] = int(count)
        else:                                     # SGD with momentum, LARS: the velocity
            arrays[f"optimizer/velocity/{name}"] = np.array(value, copy=True)
    arrays["losses"] = np.array(losses, dtype=np.float64)
    hyper = {key: getattr(optimizer, key) for key in HYPERPARAMETERS if hasattr(optimizer, key)}
    meta = {"step": step, "model": model_config(model),
            "optimizer": {"class": type(optimizer).__name__, "steps": int(optimizer.steps),
                          "hyperparameters": _to_json(hyper),
                          "parameter_steps": parameter_steps,
                          "trust": {name: float(x) for name, x in optimizer.trust.items()}},
            "rng": _to_json(rng.bit_generator.state),
            "data": data.position()}
    return TrainingState(step, arrays, meta)


def encode(state: TrainingState) -> tuple:
    """(the bytes of state.npz, the manifest as a dict) for `state`; equal states give equal
    bytes. Object arrays are refused (they would need pickle)."""
    arrays = dict(state.arrays)
    arrays[META_ARRAY] = np.frombuffer(json.dumps(state.meta, sort_keys=True).encode("utf-8"),
                                       dtype=np.uint8)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            member = zipfile.ZipInfo(f"{name}.npy", date_time=FIXED_ZIP_DATE)
            with archive.open(member, "w", force_zip64=True) as file:
                np.lib.format.write_array(file, np.ascontiguousarray(arrays[name]),
                                          allow_pickle=False)
    data = buffer.getvalue()
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": state.step,
                "data_file": DATA_FILE, "data_bytes": len(data),
                "data_sha256": hashlib.sha256(data).hexdigest(),
                "arrays": {name: {"shape": list(arrays[name].shape),
                                  "dtype": arrays[name].dtype.str} for name in sorted(arrays)},
                "model": state.meta["model"], "optimizer": state.meta["optimizer"]["class"]}
    return data, manifest


# -- cell 57
MANIFEST_KEYS = {"format": str, "format_version": int, "step": int, "data_file": str,
                 "data_bytes": int, "data_sha256": str, "arrays": dict}


def read_manifest(path) -> dict:
    """The manifest of the checkpoint directory `path`, checked for form; CorruptCheckpoint if it
    is missing or malformed, IncompatibleCheckpoint if it is of another format version."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path.name}: no {MANIFEST_FILE}, so its write never "
                                f"finished") from None
    except (OSError, ValueError) as error:       # unreadable, not UTF-8, not JSON
        raise CorruptCheckpoint(f"{path.name}: unreadable {MANIFEST_FILE} ({error})") from None
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"{path.name}: {MANIFEST_FILE} is not a JSON object")
    for key, kind in MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind):
            raise CorruptCheckpoint(f"{path.name}: {MANIFEST_FILE} lacks a valid {key!r}")
    if manifest["format"] != FORMAT or manifest["format_version"] != FORMAT_VERSION:
        raise IncompatibleCheckpoint(
            f"{path.name}: format {manifest['format']!r} version {manifest['format_version']}; "
            f"this code reads {FORMAT!r} version {FORMAT_VERSION}")
    if manifest["data_file"] != DATA_FILE:
        raise CorruptCheckpoint(f"{path.name}: data_file must be {DATA_FILE!r}, got "
                                f"{manifest['data_file']!r}")
    return manifest


def read_checkpoint(path) -> TrainingState:
    """Load and verify the checkpoint directory `path` (length, SHA-256, arrays against the
    manifest); CorruptCheckpoint saying what is wrong otherwise."""
    path = Path(path)
    manifest = read_manifest(path)
    try:
        data = (path / DATA_FILE).read_bytes()
    except OSError as error:
        raise CorruptCheckpoint(f"{path.name}: cannot read {DATA_FILE} ({error})") from None
    if len(data) != manifest["data_bytes"]:
        raise CorruptCheckpoint(f"{path.name}: {DATA_FILE} has {len(data):,} bytes but the "
                                f"manifest says {manifest['data_bytes']:,} (truncated?)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest["data_sha256"]:
        raise CorruptCheckpoint(f"{path.name}: checksum mismatch, SHA-256 of {DATA_FILE} is "
                                f"{digest[:12]}… but the manifest says "
                                f"{manifest['data_sha256'][:12]}…")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        meta = json.loads(arrays.pop(META_ARRAY).tobytes().decode("utf-8"))
    except Exception as error:        # a bad zip, a pickled object, bad JSON: all the same here
        raise CorruptCheckpoint(f"{path.name}: unreadable {DATA_FILE} ({error})") from None
    listed = {name: spec for name, spec in manifest["arrays"].items() if name != META_ARRAY}
    if set(listed) != set(arrays):
        raise CorruptCheckpoint(f"{path.name}: the manifest lists {sorted(listed)} but "
                                f"{DATA_FILE} holds {sorted(arrays)}")
    for name, spec in listed.items():
        if list(arrays[name].shape) != spec.get("shape") or arrays[name].dtype.str != \
                spec.get("dtype"):
            raise CorruptCheckpoint(f"{path.name}: {name} is {arrays[name].dtype.str} "
                                    f"{arrays[name].shape} but the manifest says {spec}")
    if meta.get("step") != manifest["step"]:
        raise CorruptCheckpoint(f"{path.name}: step {meta.get('step')} in the data, "
                                f"{manifest['step']} in the manifest")
    return TrainingState(manifest["step"], arrays, meta)


# -- cell 59
def _check_parts(parts) -> tuple:
    parts = tuple(parts)
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise ValueError(f"parts must be among {', '.join(PARTS)}; got {unknown}")
    return parts


def _shape(array_or_shape) -> tuple:
    return tuple(getattr(array_or_shape, "shape", array_or_shape))


def _model_mismatches(state, model) -> list:
    saved = {name[len("model/"):]: array for name, array in state.arrays.items()
             if name.startswith("model/")}
    problems = []
    for name in [*model.params, *(name for name in saved if name not in model.params)]:
        if name not in saved:
            problems.append(f"{name} is in the model but not in the checkpoint")
        elif name not in model.params:
            problems.append(f"{name} is in the checkpoint but not in the model")
        elif saved[name].shape != model.params[name].shape:
            problems.append(f"{name} has shape {_shape(saved[name])} in the checkpoint but "
                            f"{_shape(model.params[name])} in the model")
        elif saved[name].dtype != model.params[name].dtype:
            problems.append(f"{name} is {saved[name].dtype} in the checkpoint but "
                            f"{model.params[name].dtype} in the model")
    here = model_config(model)
    for key in ("class", "activation", "frozen"):
        if state.meta["model"].get(key) != here[key]:
            problems.append(f"the model's {key} is {state.meta['model'].get(key)!r} in the "
                            f"checkpoint but {here[key]!r} here")
    return problems


def _optimizer_mismatches(state, optimizer, model) -> list:
    saved = state.meta["optimizer"]
    if saved["class"] != type(optimizer).__name__:
        return [f"the optimizer is {saved['class']} in the checkpoint but "
                f"{type(optimizer).__name__} here"]
    problems = []
    for name, array in state.arrays.items():
        if name.startswith("optimizer/"):
            parameter = name.split("/", 2)[2]
            if parameter not in model.params:
                problems.append(f"optimizer state for {parameter}, which the model lacks")
            elif array.shape != model.params[parameter].shape:
                problems.append(f"optimizer state {name} has shape {_shape(array)} but the "
                                f"parameter {_shape(model.params[parameter])}")
    return problems


def restore(state: TrainingState, model, optimizer, rng, data, parts=PARTS) -> None:
    """Put `state` back into `model`, `optimizer`, `rng` and `data` (those named in `parts`),
    after checking that it fits them all; IncompatibleCheckpoint naming every mismatch if not."""
    parts = _check_parts(parts)
    problems = []
    if "model" in parts:
        problems += _model_mismatches(state, model)
    if "optimizer" in parts and not problems:     # its shapes follow the model's: say it once
        problems += _optimizer_mismatches(state, optimizer, model)
    if "rng" in parts:
        kind, here = state.meta["rng"].get("bit_generator"), type(rng.bit_generator).__name__
        if kind != here:
            problems.append(f"the bit generator is {kind} in the checkpoint but {here} here")
    if "data" in parts:
        problems += data.mismatches(state.meta["data"])
    if problems:
        raise IncompatibleCheckpoint(f"checkpoint of step {state.step} does not fit: "
                                     + "; ".join(problems))
    if "model" in parts:
        for name, param in model.params.items():
            np.copyto(param, state.arrays[f"model/{name}"])
    if "optimizer" in parts:
        _restore_optimizer(state, optimizer)
    if "rng" in parts:
        rng.bit_generator.state = _from_json(state.meta["rng"])
    if "data" in parts:
        data.seek(state.meta["data"])


def _restore_optimizer(state, optimizer) -> None:
    saved = state.meta["optimizer"]
    optimizer.state = {}
    for name, count in saved["parameter_steps"].items():
        optimizer.state[name] = (state.arrays[f"optimizer/m/{name}"].copy(),
                                 state.arrays[f"optimizer/v/{name}"].copy(), count)
    for name, array in state.arrays.items():
        if name.startswith("optimizer/velocity/"):
            optimizer.state[name[len("optimizer/velocity/"):]] = array.copy()
    optimizer.steps = saved["steps"]
    optimizer.trust = dict(saved["trust"])
    for key, value in saved["hyperparameters"].items():
        setattr(optimizer, key, tuple(value) if isinstance(value, list) else value)


# -- cell 61
from dsml.utils import add_to_class

STEP_DIRECTORY = re.compile(r"^step_(\d+)$")


class CheckpointManager:
    """Checkpoints of one run in `directory` (which must exist and be writable, unless
    create=True makes it): step_<n> subdirectories, the newest `keep_last` complete ones kept."""

    def __init__(self, directory, keep_last: int = 3, create: bool = False):
        self.keep_last = _check_count("keep_last", keep_last, 1)
        directory = Path(directory)
        if not directory.exists():
            if not create:
                raise FileNotFoundError(f"checkpoint directory {directory} does not exist; "
                                        f"create it, or pass create=True")
            directory.mkdir(parents=True)
        if not directory.is_dir():
            raise NotADirectoryError(f"checkpoint directory {directory} is not a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(f"checkpoint directory {directory} is not writable; "
                                  f"checkpoints could not be saved there")
        self.directory = directory
        self.last_write_seconds = None      # how long the latest write took, wherever it ran
        self._writer, self._writer_error = None, None

    def path_of(self, step: int) -> Path:
        return self.directory / f"step_{step:08d}"

    def checkpoints(self) -> list:
        """(step, path) of every step_<n> directory, complete or not, oldest first."""
        found = []
        for path in self.directory.iterdir():
            match = STEP_DIRECTORY.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def complete_steps(self) -> list:
        """Steps whose checkpoint has a manifest (written to the end; not yet verified)."""
        return [step for step, path in self.checkpoints() if (path / MANIFEST_FILE).exists()]

    def save(self, step: int, model, optimizer, rng, data, losses=()) -> Path:
        """Write the checkpoint of step `step` now and rotate; returns its directory."""
        self.wait()
        return self.write(capture_state(step, model, optimizer, rng, data, losses))

    def write(self, state: TrainingState) -> Path:
        """Write `state` as step_<state.step> (data file, then manifest) and rotate."""
        started = time.perf_counter()
        data, manifest = encode(state)
        path = self.path_of(state.step)
        try:
            if not path.exists():
                path.mkdir()
                fsync_directory(self.directory)
            elif (path / MANIFEST_FILE).exists():         # invalidate the old one first
                (path / MANIFEST_FILE).unlink()
                fsync_directory(path)
            write_atomically(path / DATA_FILE, data)
            write_atomically(path / MANIFEST_FILE,
                             json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
        except BaseException as error:
            with contextlib.suppress(OSError):
                self._remove(path)
            if isinstance(error, OSError):
                left = (f"its unfinished directory {path} could not be removed (it has no "
                        f"manifest, so it is never loaded)" if path.exists()
                        else "nothing of it was left")
                raise type(error)(error.errno, f"could not write checkpoint {path.name} in "
                                  f"{self.directory} ({error.strerror}); {left}, older "
                                  f"checkpoints are untouched") from error
            raise
        self.rotate()
        self.last_write_seconds = time.perf_counter() - started
        return path

    def rotate(self) -> list:
        """Delete every checkpoint older than the newest `keep_last` complete ones; returns the
        steps deleted. Incomplete checkpoints newer than those are left alone."""
        complete = self.complete_steps()
        if not complete:
            return []
        oldest_kept = complete[-self.keep_last:][0]
        removed = []
        for step, path in self.checkpoints():
            if step < oldest_kept:
                self._remove(path)
                removed.append(step)
        return removed

    def _remove(self, path) -> None:
        if not path.exists():
            return
        manifest = path / MANIFEST_FILE
        if manifest.exists():                  # first: from now on it is merely incomplete
            manifest.unlink()
            fsync_directory(path)
        for leftover in path.iterdir():
            leftover.unlink()
        path.rmdir()
        fsync_directory(self.directory)


# -- cell 63
@add_to_class(CheckpointManager)
def latest(self) -> tuple:
    """(the newest checkpoint that verifies, notes on the newer ones skipped): (None, notes)
    when no checkpoint was ever completed; CorruptCheckpoint when some were and none
    verifies. Each note is also issued as a CheckpointWarning."""
    self.wait()
    skipped, completed = [], False
    for step, path in reversed(self.checkpoints()):
        completed = completed or (path / MANIFEST_FILE).exists()
        try:
            state = read_checkpoint(path)
        except CorruptCheckpoint as problem:
            skipped.append(str(problem))
            continue
        notes = [f"skipped {reason}; resuming from {path.name} instead"
                 for reason in skipped]
        for note in notes:
            warnings.warn(note, CheckpointWarning, stacklevel=2)
        return state, notes
    if completed:
        raise CorruptCheckpoint(f"no checkpoint in {self.directory} verifies: "
                                + "; ".join(skipped))
    notes = [f"skipped {reason}; no earlier checkpoint, starting from step 0"
             for reason in skipped]
    for note in notes:
        warnings.warn(note, CheckpointWarning, stacklevel=2)
    return None, notes


@add_to_class(CheckpointManager)
def restore_latest(self, model, optimizer, rng, data, parts=PARTS) -> tuple:
    """restore() the newest good checkpoint into the live objects; returns (its state or
    None, notes) as latest() does."""
    state, notes = self.latest()
    if state is not None:
        restore(state, model, optimizer, rng, data, parts)
    return state, notes


# -- cell 65
@add_to_class(CheckpointManager)
def save_async(self, step: int, model, optimizer, rng, data, losses=()) -> None:
    """Snapshot the state now, write it in a background thread (after the previous one)."""
    self.wait()
    state = capture_state(step, model, optimizer, rng, data, losses)
    self._writer = threading.Thread(target=self._write_in_background, args=(state,),
                                    name=f"checkpoint step {step}", daemon=True)
    self._writer.start()


@add_to_class(CheckpointManager)
def _write_in_background(self, state) -> None:
    try:
        self.write(state)
    except BaseException as error:          # handed to the training thread by wait()
        self._writer_error = error


@add_to_class(CheckpointManager)
def wait(self) -> None:
    """Wait for the background write, if any; re-raise its error."""
    if self._writer is not None:
        self._writer.join()
        self._writer = None
    error, self._writer_error = self._writer_error, None
    if error is not None:
        raise error


# -- cell 67
from dsml.train.models import loss_and_grads


class SimulatedCrash(RuntimeError):
    """Raised by train(crash_at=k) before step k, in place of the process dying. `losses` holds
    the losses of the steps done, the work since the last checkpoint (to be redone) included;
    `resumed_from` is the step this attempt had resumed from (None: it started afresh)."""

    def __init__(self, step: int, losses: list, resumed_from=None):
        super().__init__(f"simulated crash before step {step}")
        self.step, self.losses, self.resumed_from = step, list(losses), resumed_from


@dataclass
class TrainResult:
    """losses: one per step 0..steps-1 (restored ones included); resumed_from: the step of the
    checkpoint resumed from (None: a fresh start); notes: checkpoints skipped on the way;
    saved: the steps this call checkpointed."""

    losses: list
    resumed_from: object
    notes: list
    saved: list


def train(model, optimizer, data, steps: int, *, rng, manager=None, checkpoint_every: int = 0,
          resume: bool = True, asynchronous: bool = False, input_noise: float = 0.0,
          loss: str = "cross_entropy", crash_at=None, resume_parts=PARTS) -> TrainResult:
    """Train `model` for `steps` optimizer steps on batches from `data` (a ShuffledBatches),
    with inputs + input_noise · N(0, 1) noise from `rng`; checkpoint through `manager` after every
    `checkpoint_every` steps (0: never; save_async if `asynchronous`); with `resume`, start from
    the manager's newest good checkpoint. Deterministic: the same objects, seeds and crash points
    give bit-identical results."""
    steps = _check_count("steps", steps, 0)
    checkpoint_every = _check_count("checkpoint_every", checkpoint_every, 0)
    if checkpoint_every and manager is None:
        raise ValueError(f"checkpoint_every={checkpoint_every} needs a manager")
    if not input_noise >= 0:
        raise ValueError(f"input_noise must be ≥ 0, got {input_noise}")
    losses, start, resumed_from, notes = [], 0, None, []
    if resume and manager is not None:
        state, notes = manager.latest()
        if state is not None:
            if state.step > steps:
                raise ValueError(f"the newest checkpoint is of step {state.step}, beyond "
                                 f"steps={steps}")
            restore(state, model, optimizer, rng, data, resume_parts)
            start = resumed_from = state.step
            losses = state.arrays["losses"].tolist()
    saved = []
    for step in range(start, steps):
        if step == crash_at:
            if manager is not None:
                manager.wait()      # let a background write end: what is on disk is then fixed
            raise SimulatedCrash(step, losses, resumed_from)
        X_batch, y_batch = data.next_batch()
        if input_noise:
            X_batch = X_batch + input_noise * rng.standard_normal(X_batch.shape)
        value, grads = loss_and_grads(model, X_batch, y_batch, loss)
        optimizer.step(model.params, grads)
        losses.append(value)
        if checkpoint_every and (step + 1) % checkpoint_every == 0:
            save = manager.save_async if asynchronous else manager.save
            save(step + 1, model, optimizer, rng, data, losses)
            saved.append(step + 1)
    if manager is not None:
        manager.wait()
    return TrainResult(losses, resumed_from, notes, saved)
