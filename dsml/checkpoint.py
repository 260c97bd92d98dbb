"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 58
import contextlib
import hashlib
import os
import re
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The file format (zip layout, manifest fields and their checks, JSON of a bit generator) is
# plumbing in dsml.checkpoint_format; this section writes the protocol around it.
from dsml.checkpoint_format import (DATA_FILE, MANIFEST_FILE, RETIRED_SUFFIX, STAGING_SUFFIX,
                                    CheckpointError, CheckpointWarning, CorruptCheckpoint,
                                    IncompatibleCheckpoint, decode, encode, from_json,
                                    fsync_directory, leftovers, manifest_bytes, read_manifest,
                                    remove_tree, to_json)

PARTS = ("model", "optimizer", "rng", "data")     # what a restore can put back


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


# -- cell 60
from dsml.train.data import batch_indices
from dsml.validate_args import integer


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of epoch `epoch` of a run seeded `seed` (both integers ≥ 0): a
    SeedSequence hash of the pair."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0])


def _check_count(name, value, least):
    return integer(name, value, least)


# -- cell 61
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


# -- cell 62
from dsml.utils import add_to_class


@add_to_class(ShuffledBatches)
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


@add_to_class(ShuffledBatches)
def seek(self, position: dict) -> None:
    problems = self.mismatches(position)
    if problems:
        raise IncompatibleCheckpoint("; ".join(problems))
    self.seed = int(position["seed"])
    self.epoch, self.index = int(position["epoch"]), int(position["index"])


# -- cell 64
HYPERPARAMETERS = ("lr", "weight_decay", "momentum", "betas", "eps", "trust_coefficient")


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
                          "hyperparameters": to_json(hyper),
                          "parameter_steps": parameter_steps,
                          "trust": {name: float(x) for name, x in optimizer.trust.items()}},
            "rng": to_json(rng.bit_generator.state),
            "data": data.position()}
    return TrainingState(step, arrays, meta)


# -- cell 66
def read_checkpoint(path) -> TrainingState:
    """Load and verify the checkpoint directory `path`, in the order a damaged one fails: its
    manifest (present, and of the right form: read_manifest), the data file's length (a
    truncated write), its SHA-256 (any flipped bit), then its contents (decode: no pickle,
    exactly the arrays the manifest lists). CorruptCheckpoint saying what is wrong, or
    IncompatibleCheckpoint for another format version."""
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
    arrays, meta = decode(path, data, manifest)
    return TrainingState(manifest["step"], arrays, meta)


# -- cell 68
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


# -- cell 69
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
        rng.bit_generator.state = from_json(state.meta["rng"])
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


# -- cell 71
from dsml.utils import add_to_class

STEP_DIRECTORY = re.compile(r"^step_(\d+)$")


class CheckpointManager:
    """Checkpoints of one run in `directory` (which must exist and be writable, unless
    create=True makes it): step_<n> subdirectories, the newest `keep_last` that verify kept."""

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


# -- cell 72
@add_to_class(CheckpointManager)
def write(self, state: TrainingState) -> Path:
    """Write `state` as step_<state.step>: into a staging directory (the data file, then the
    manifest, each atomically), which is then renamed into place; rotate. Leftovers of a
    killed save are removed first."""
    started = time.perf_counter()
    self.sweep()
    data, manifest = encode(state)
    path, staging = self.path_of(state.step), None
    try:
        staging = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{path.name}.",
                                        suffix=STAGING_SUFFIX))
        write_atomically(staging / DATA_FILE, data)
        write_atomically(staging / MANIFEST_FILE, manifest_bytes(manifest))   # last
        self.publish(staging, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            if staging is not None:
                remove_tree(staging)
        if isinstance(error, OSError):
            left = (f"its staging directory {staging.name} could not be removed (the next "
                    f"save removes it)" if staging is not None and staging.exists()
                    else "nothing of it was left")
            raise type(error)(error.errno, f"could not write checkpoint {path.name} in "
                              f"{self.directory} ({error.strerror}); {left}, older "
                              f"checkpoints are untouched") from error
        raise
    self.last_write_seconds = time.perf_counter() - started
    self.rotate()
    return path


@add_to_class(CheckpointManager)
def publish(self, staging: Path, path: Path) -> None:
    """Rename the complete `staging` directory to `path`. Re-saving a step swaps: the old
    checkpoint is renamed aside first and removed only once the new one is in place, so a
    kill at any instant leaves a whole checkpoint of that step (recover() puts the old one
    back if the kill fell between the two renames)."""
    retired = None
    if path.exists():
        retired = path.with_name(f".{path.name}.{os.getpid()}{RETIRED_SUFFIX}")
        os.rename(path, retired)
    os.rename(staging, path)
    fsync_directory(self.directory)
    if retired is not None:
        remove_tree(retired)


# -- cell 73
@add_to_class(CheckpointManager)
def recover(self) -> None:
    """Put back a checkpoint that a killed re-save had renamed aside and not yet replaced."""
    for entry in leftovers(self.directory):
        match = re.match(r"^\.(step_\d+)\.", entry.name)
        if entry.name.endswith(RETIRED_SUFFIX) and not (self.directory / match[1]).exists():
            os.rename(entry, self.directory / match[1])
            fsync_directory(self.directory)


@add_to_class(CheckpointManager)
def sweep(self) -> list:
    """recover(), then remove what killed saves left (staging directories, temporary files,
    checkpoints renamed aside); returns their names."""
    self.recover()
    removed = leftovers(self.directory)
    for entry in removed:
        remove_tree(entry)
    return [entry.name for entry in removed]


@add_to_class(CheckpointManager)
def rotate(self) -> list:
    """Delete every checkpoint older than the newest `keep_last` that verify (read and
    checksummed: a damaged one does not count); returns the steps deleted. Unverified
    checkpoints newer than those are left alone: latest() skips them with a message."""
    kept = []
    for step, path in reversed(self.checkpoints()):
        if len(kept) == self.keep_last:
            break
        with contextlib.suppress(CheckpointError):
            read_checkpoint(path)
            kept.append(step)
    if not kept:
        return []
    removed = []
    for step, path in self.checkpoints():
        if step < kept[-1]:
            remove_tree(path)
            removed.append(step)
    return removed


# -- cell 75
@add_to_class(CheckpointManager)
def latest(self) -> tuple:
    """(the newest checkpoint that verifies, notes on the newer ones skipped): (None, notes)
    when no checkpoint was ever completed; CorruptCheckpoint when some were and none
    verifies. Each note is also issued as a CheckpointWarning."""
    self.wait()
    self.recover()
    skipped, completed = [], False
    for step, path in reversed(self.checkpoints()):
        completed = completed or (path / MANIFEST_FILE).exists()
        try:
            state = read_checkpoint(path)
        except CheckpointError as problem:     # damaged, malformed, or another format version
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


# -- cell 77
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


# -- cell 79
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


# -- cell 80
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


# -- cell 99
from dsml.checkpoint_format import (encode_shard, read_shard, read_sharded_manifest, shard_file,
                                    sharded_manifest)
from dsml.data_parallel import shard_bounds

SHARD_TAG = 61          # the tag of the save's messages to and from rank 0


def save_sharded(comm, directory, step: int, shards: dict):
    """Rank program body (`yield from` it): write this rank's `shards` (name -> its 1-D piece
    of each flat vector, pieces in rank order) into `directory` atomically, report the file's
    length and SHA-256 to rank 0, which writes the manifest last; every rank returns once the
    manifest is on disk. Returns the directory."""
    directory = Path(directory)
    data, entry = encode_shard(comm.rank, comm.size, shards)
    write_atomically(directory / entry["file"], data)
    if comm.rank != 0:
        yield comm.send(0, entry, tag=SHARD_TAG)
        yield comm.recv(0, tag=SHARD_TAG)             # the manifest is written: done
        return directory
    entries = [entry]
    for rank in range(1, comm.size):
        entries.append((yield comm.recv(rank, tag=SHARD_TAG)))
    write_atomically(directory / MANIFEST_FILE, manifest_bytes(sharded_manifest(step, entries)))
    for rank in range(1, comm.size):
        yield comm.send(rank, "saved", tag=SHARD_TAG)
    return directory


def load_resharded(directory, rank: int, world_size: int) -> dict:
    """Rank `rank` of `world_size`'s shard of every array of the sharded checkpoint in
    `directory`, whatever world size saved it: [start, stop) = shard_bounds(total, world_size,
    rank) of each flat vector, copied from the old shards that overlap it, each verified
    before use (CorruptCheckpoint names a damaged one). Bit-identical to slicing the whole."""
    if not (isinstance(world_size, int) and world_size >= 1 and 0 <= rank < world_size):
        raise ValueError(f"need 0 ≤ rank < world_size with world_size ≥ 1, got rank {rank!r}, "
                         f"world_size {world_size!r}")
    manifest = read_sharded_manifest(directory)
    verified, mine = {}, {}
    for name, total in manifest["totals"].items():
        start, stop = shard_bounds(total, world_size, rank)
        piece = np.empty(stop - start, dtype=manifest["dtypes"][name])
        for shard in manifest["shards"]:
            low, high = shard["offsets"][name]
            first, last = max(low, start), min(high, stop)
            if first >= last:
                continue                               # no overlap: never read
            if shard["rank"] not in verified:
                verified[shard["rank"]] = read_shard(directory, shard, manifest["dtypes"])
            old = verified[shard["rank"]][name]
            piece[first - start:last - start] = old[first - low:last - low]
        mine[name] = piece
    return mine
