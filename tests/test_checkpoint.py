"""Tests of dsml.checkpoint: real checkpoints of model + optimizer + RNG + data position + step.

The reference for every resumed run is a plain training loop written here (week 3's pieces, no
checkpoints); a run crashed at any step and resumed in fresh objects must equal it bit for bit.
"""
import hashlib
import io
import json
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsml.checkpoint as checkpoint
from dsml.checkpoint import (DATA_FILE, MANIFEST_FILE, PARTS, CheckpointManager,
                             CheckpointWarning, CorruptCheckpoint, IncompatibleCheckpoint,
                             ShuffledBatches, SimulatedCrash, capture_state, encode, epoch_seed,
                             read_checkpoint, restore, train)
from dsml.train.data import batch_indices, gaussian_mixture
from dsml.train.models import MLP, loss_and_grads
from dsml.train.optim import make_optimizer

SEED = 3
X, Y = gaussian_mixture(50, classes=3, dim=4, seed=SEED)
SIZES = [4, 8, 3]
BATCH = 8                  # 50 examples: 7 batches an epoch, the last of 2
STEPS = 20                 # crosses two epoch boundaries
EVERY = 3                  # does not divide STEPS, nor the batches per epoch
NOISE = 0.1
HYPER = {"sgd": {"lr": 0.1}, "momentum": {"lr": 0.05}, "adam": {"lr": 1e-2},
         "lars": {"lr": 0.5, "weight_decay": 1e-4}, "lamb": {"lr": 1e-2, "weight_decay": 1e-3}}


def fresh(name="adam", sizes=SIZES, batch=BATCH, X=X, Y=Y, activation="relu"):
    """A run's objects built from seeds only, as a restarted process builds them."""
    model = MLP(sizes, activation=activation, seed=SEED)
    optimizer = make_optimizer(name, **HYPER[name])
    return model, optimizer, np.random.default_rng(SEED), ShuffledBatches(X, Y, batch, SEED)


def plain_loop(name, steps=STEPS, noise=NOISE):
    """The reference: week 3's pieces in a loop, per-epoch shuffles, no checkpoint code."""
    model, optimizer, rng, _ = fresh(name)
    losses, epoch = [], 0
    while len(losses) < steps:
        for batch in batch_indices(len(X), BATCH, epoch_seed(SEED, epoch)):
            if len(losses) == steps:
                break
            inputs = X[batch] + noise * rng.standard_normal(X[batch].shape)
            value, grads = loss_and_grads(model, inputs, Y[batch])
            optimizer.step(model.params, grads)
            losses.append(value)
        epoch += 1
    return model, optimizer, rng, losses


def run(name, directory, crashes=(), steps=STEPS, every=EVERY, keep_last=3, **options):
    """Train to `steps`, crashing before each step of `crashes` and resuming in fresh objects."""
    manager = CheckpointManager(directory, keep_last=keep_last)
    reports = []
    for crash in [*crashes, None]:
        objects = fresh(name)
        model, optimizer, rng, data = objects
        try:
            result = train(model, optimizer, data, steps, rng=rng, manager=manager,
                           checkpoint_every=every, input_noise=NOISE, crash_at=crash, **options)
        except SimulatedCrash as report:
            reports.append(report)
    return objects, result, reports


def bits(value):
    """A value as bytes, so that comparisons are bit for bit (-0.0 ≠ 0.0, NaN = NaN)."""
    if isinstance(value, np.ndarray):
        return value.dtype.str.encode() + str(value.shape).encode() + value.tobytes()
    return repr(value).encode()


def fingerprint(model, optimizer, rng, losses):
    flat = {f"param {name}": bits(value) for name, value in model.params.items()}
    for name, value in optimizer.state.items():
        for i, part in enumerate(value if isinstance(value, tuple) else (value,)):
            flat[f"optimizer {name} {i}"] = bits(np.asarray(part))
    flat["optimizer steps"] = bits(optimizer.steps)
    flat["rng"] = bits(rng.bit_generator.state)
    flat["losses"] = bits(np.array(losses))
    return flat


REFERENCE = {name: fingerprint(*plain_loop(name)) for name in ("adam", "momentum")}


def assert_same_as_reference(name, objects, result):
    model, optimizer, rng, data = objects
    got = fingerprint(model, optimizer, rng, result.losses)
    expected = REFERENCE[name] if name in REFERENCE else fingerprint(*plain_loop(name))
    different = sorted(key for key in expected if got.get(key) != expected[key])
    assert got.keys() == expected.keys() and not different, \
        f"differ from the reference: {different}"
    assert data.position()["epoch"] * data.batches_per_epoch + data.position()["index"] == STEPS


# ---------------------------------------------------------------- the data loader

@pytest.mark.parametrize("n, batch", [(50, 8), (1, 1), (5, 7), (12, 4)])
def test_loader_gives_every_example_once_an_epoch(n, batch):
    data = ShuffledBatches(np.arange(n)[:, None], np.arange(n), batch, seed=1)
    epochs = []
    for _ in range(2):
        seen = [data.next_batch()[1] for _ in range(data.batches_per_epoch)]
        assert [len(s) for s in seen[:-1]] == [batch] * (len(seen) - 1)
        epochs.append(np.concatenate(seen))
        assert sorted(epochs[-1]) == list(range(n))
    assert data.position()["epoch"] == 2 and data.position()["index"] == 0
    if n > 3:
        assert not np.array_equal(epochs[0], epochs[1])      # a fresh order each epoch


def test_loader_seek_replays_the_same_batches():
    data = ShuffledBatches(X, Y, BATCH, seed=4)
    for _ in range(9):
        data.next_batch()
    where = data.position()
    ahead = [data.next_batch()[1] for _ in range(10)]
    other = ShuffledBatches(X, Y, BATCH, seed=0)             # the seed comes from the position
    other.seek(where)
    assert all(np.array_equal(a, b) for a, b in zip(ahead, [other.next_batch()[1]
                                                             for _ in range(10)]))


def test_epoch_seeds_of_neighbouring_runs_differ():
    assert epoch_seed(0, 1) != epoch_seed(1, 0)              # seed + epoch would be equal
    assert epoch_seed(5, 2) == epoch_seed(5, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be an integer ≥ 1, got 0"),
    ({"batch_size": 2.5}, "batch_size must be an integer ≥ 1"),
    ({"seed": -1}, "seed must be an integer ≥ 0, got -1"),
    ({"y": np.zeros(3)}, "need as many labels as examples"),
])
def test_loader_bad_input(kwargs, message):
    arguments = {"X": X, "y": Y, "batch_size": 4, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ShuffledBatches(**arguments)


# ---------------------------------------------------------------- bit-identical resume

@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_uninterrupted_run_equals_the_plain_loop(name, tmp_path):
    objects, result, reports = run(name, tmp_path)
    assert reports == [] and result.resumed_from is None
    assert result.saved == list(range(EVERY, STEPS + 1, EVERY))
    assert_same_as_reference(name, objects, result)


@pytest.mark.parametrize("name", ["adam", "momentum"])
@pytest.mark.parametrize("crash", range(STEPS))
def test_resume_after_a_crash_at_any_step_is_bit_identical(name, crash, tmp_path):
    objects, result, reports = run(name, tmp_path, [crash])
    assert [report.step for report in reports] == [crash]
    last_checkpoint = EVERY * (crash // EVERY)
    assert result.resumed_from == (last_checkpoint or None)     # 0: nothing saved yet
    assert reports[0].losses == result.losses[:crash]            # the lost work, redone alike
    assert_same_as_reference(name, objects, result)


@pytest.mark.parametrize("name", ["sgd", "lars", "lamb"])
def test_resume_is_bit_identical_for_the_other_optimizers(name, tmp_path):
    objects, result, _ = run(name, tmp_path, [4, 11, 16])
    assert_same_as_reference(name, objects, result)


@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_resume_with_asynchronous_checkpoints_is_bit_identical(name, tmp_path):
    objects, result, _ = run(name, tmp_path, [2, 7, 9, 17], asynchronous=True)
    assert result.resumed_from == 15
    assert_same_as_reference(name, objects, result)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(crashes=st.lists(st.integers(0, STEPS - 1), max_size=4, unique=True),
       every=st.integers(1, 7), keep_last=st.integers(1, 4), asynchronous=st.booleans())
def test_any_sequence_of_crashes_gives_the_same_run(tmp_path_factory, crashes, every, keep_last,
                                                   asynchronous):
    # each crash must come after the previous attempt's restart point to fire at all: sorted
    directory = tmp_path_factory.mktemp("run")
    objects, result, reports = run("adam", directory, sorted(crashes), every=every,
                                   keep_last=keep_last, asynchronous=asynchronous)
    assert [report.step for report in reports] == sorted(crashes)
    assert_same_as_reference("adam", objects, result)


def test_resumed_checkpoints_have_the_same_bytes(tmp_path):
    (tmp_path / "straight").mkdir()
    (tmp_path / "crashed").mkdir()
    run("adam", tmp_path / "straight", keep_last=100)
    run("adam", tmp_path / "crashed", [5, 13], keep_last=100)

    def sums(directory):
        return {path.name: hashlib.sha256((path / DATA_FILE).read_bytes()).hexdigest()
                for path in directory.iterdir()}
    assert sums(tmp_path / "straight") == sums(tmp_path / "crashed")
    assert len(sums(tmp_path / "straight")) == STEPS // EVERY


@pytest.mark.parametrize("left_out", PARTS)
def test_every_part_of_the_state_is_needed(left_out, tmp_path):
    model, optimizer, rng, data = fresh("adam")
    with pytest.raises(SimulatedCrash):                 # leaves checkpoints of steps 3, 6, 9
        train(model, optimizer, data, STEPS, rng=rng, manager=CheckpointManager(tmp_path),
              checkpoint_every=EVERY, input_noise=NOISE, crash_at=10)
    model, optimizer, rng, data = fresh("adam")
    kept = [part for part in PARTS if part != left_out]
    result = train(model, optimizer, data, STEPS, rng=rng, manager=CheckpointManager(tmp_path),
                   checkpoint_every=EVERY, input_noise=NOISE, resume_parts=kept)
    assert result.resumed_from == 9
    got = fingerprint(model, optimizer, rng, result.losses)
    assert got["losses"] != REFERENCE["adam"]["losses"]          # the run is another run


def test_unknown_part_is_refused(tmp_path):
    run("adam", tmp_path)
    with pytest.raises(ValueError, match="parts must be among model, optimizer, rng, data"):
        CheckpointManager(tmp_path).restore_latest(*fresh(), parts=["weights"])


# ---------------------------------------------------------------- the format

@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "lars", "lamb"])
def test_round_trip_restores_everything(name, tmp_path):
    model, optimizer, rng, data = fresh(name)
    model.frozen = {"layer0.bias"}                      # Adam then counts steps per parameter
    train(model, optimizer, data, 11, rng=rng, input_noise=NOISE)
    manager = CheckpointManager(tmp_path)
    manager.save(11, model, optimizer, rng, data, losses=[1.0, 2.5])
    saved = capture_state(11, model, optimizer, rng, data, [1.0, 2.5])
    other = fresh(name)
    other[0].frozen = {"layer0.bias"}
    other[1].lr, other[1].weight_decay = 123.0, 0.5       # the checkpoint's values win
    state = read_checkpoint(manager.path_of(11))
    restore(state, *other)
    again = capture_state(11, *other, state.arrays["losses"])
    assert again.meta == saved.meta                      # scalars, hyper-parameters, RNG, position
    assert again.arrays.keys() == saved.arrays.keys()
    assert all(bits(again.arrays[k]) == bits(saved.arrays[k]) for k in saved.arrays)
    assert type(getattr(other[1], "betas", ())) is tuple  # restored as the optimizer keeps it


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox,
                                           np.random.SFC64])
def test_every_numpy_bit_generator_round_trips(bit_generator, tmp_path):
    model, optimizer, _, data = fresh()
    rng = np.random.Generator(bit_generator(7))
    rng.standard_normal(5)
    CheckpointManager(tmp_path).save(1, model, optimizer, rng, data)
    expected = rng.standard_normal(20)
    other = np.random.Generator(bit_generator(99))
    restore(read_checkpoint(tmp_path / "step_00000001"), model, optimizer, other, data)
    assert bits(other.standard_normal(20)) == bits(expected)


def test_encoding_is_deterministic_and_the_manifest_describes_it():
    state = capture_state(4, *fresh())
    data, manifest = encode(state)
    assert encode(state)[0] == data                     # no timestamp in the archive
    assert manifest["data_bytes"] == len(data)
    assert manifest["data_sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["arrays"]["model/layer0.weight"] == {"shape": [4, 8], "dtype": "<f8"}
    assert manifest["model"]["sizes"] == SIZES and manifest["step"] == 4


def test_bytes_written_depart_from_the_raw_state_size_by_the_format_overhead(tmp_path):
    """Measurement (the file's size) against the closed form (the arrays' bytes): close for a big
    state, far off for a tiny one with many arrays, where headers dominate."""
    manager = CheckpointManager(tmp_path)
    big = fresh(sizes=[4, 300, 300, 3])
    tiny = fresh(sizes=[1, 1, 1, 1, 1, 1])
    ratios = []
    for step, objects in ((1, big), (2, tiny)):
        raw = capture_state(step, *objects).nbytes
        written = (manager.save(step, *objects) / DATA_FILE).stat().st_size
        ratios.append(written / raw)
    assert 1 < ratios[0] < 1.01
    assert ratios[1] > 5


# ---------------------------------------------------------------- damage and fallback

def flip_a_byte(path):
    data = bytearray((path / DATA_FILE).read_bytes())
    data[len(data) // 3] ^= 0x10
    (path / DATA_FILE).write_bytes(bytes(data))


def truncate(path):
    data = (path / DATA_FILE).read_bytes()
    (path / DATA_FILE).write_bytes(data[: len(data) - 100])


def drop_manifest(path):
    (path / MANIFEST_FILE).unlink()


def drop_data(path):
    (path / DATA_FILE).unlink()


def garbage_manifest(path):
    (path / MANIFEST_FILE).write_text('{"format": "dsml-checkpoint", "step": ')


def empty_manifest(path):
    (path / MANIFEST_FILE).write_bytes(b"")


def manifest_without_checksum(path):
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    del manifest["data_sha256"]
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


def manifest_with_wrong_shape(path):
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest["arrays"]["model/layer0.weight"]["shape"] = [4, 9]
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


def manifest_with_wrong_step(path):
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest["step"] += 1
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


DAMAGE = {flip_a_byte: "checksum mismatch", truncate: "truncated",
          drop_manifest: "no manifest.json", drop_data: "cannot read state.npz",
          garbage_manifest: "unreadable manifest.json", empty_manifest: "unreadable manifest.json",
          manifest_without_checksum: "lacks a valid 'data_sha256'",
          manifest_with_wrong_shape: "but the manifest says",
          manifest_with_wrong_step: "in the manifest"}


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda damage: damage.__name__)
def test_a_damaged_newest_checkpoint_falls_back_with_a_message(damage, tmp_path):
    run("adam", tmp_path)                                    # keeps steps 12, 15, 18
    manager = CheckpointManager(tmp_path, keep_last=3)
    assert manager.complete_steps() == [12, 15, 18]
    damage(manager.path_of(18))
    with pytest.raises(CorruptCheckpoint, match=DAMAGE[damage]):
        read_checkpoint(manager.path_of(18))
    objects = fresh()
    model, optimizer, rng, data = objects
    with pytest.warns(CheckpointWarning) as caught:
        result = train(model, optimizer, data, STEPS, rng=rng, manager=manager,
                       checkpoint_every=EVERY, input_noise=NOISE)
    assert result.resumed_from == 15
    assert len(result.notes) == 1
    assert result.notes[0].startswith("skipped step_00000018: ")
    assert DAMAGE[damage] in result.notes[0]
    assert result.notes[0].endswith("resuming from step_00000015 instead")
    assert [str(w.message) for w in caught] == result.notes
    assert_same_as_reference("adam", objects, result)
    assert read_checkpoint(manager.path_of(18)).step == 18   # written again, whole this time


def test_two_damaged_checkpoints_fall_back_two(tmp_path):
    run("adam", tmp_path)
    manager = CheckpointManager(tmp_path)
    flip_a_byte(manager.path_of(18))
    drop_manifest(manager.path_of(15))
    with pytest.warns(CheckpointWarning):
        state, notes = manager.latest()
    assert state.step == 12 and len(notes) == 2
    assert "step_00000018" in notes[0] and "step_00000015" in notes[1]


def test_no_checkpoint_that_verifies_is_an_error(tmp_path):
    run("adam", tmp_path)
    manager = CheckpointManager(tmp_path)
    for step in manager.complete_steps():
        flip_a_byte(manager.path_of(step))
    model, optimizer, rng, data = fresh()
    with pytest.raises(CorruptCheckpoint, match="no checkpoint in .* verifies: step_00000018"):
        train(model, optimizer, data, STEPS, rng=rng, manager=manager)


def test_an_empty_directory_and_an_unfinished_first_write_start_afresh(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.latest() == (None, [])
    manager.path_of(3).mkdir()                               # crashed before its manifest
    (manager.path_of(3) / DATA_FILE).write_bytes(b"half")
    with pytest.warns(CheckpointWarning, match="no earlier checkpoint, starting from step 0"):
        state, notes = manager.latest()
    assert state is None and len(notes) == 1


def test_a_pickled_object_is_refused_even_with_a_matching_checksum(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, *fresh())
    buffer = io.BytesIO()
    np.savez(buffer, **{"model/layer0.weight": np.array([{"run": "code"}], dtype=object)})
    data = buffer.getvalue()
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest.update(data_bytes=len(data), data_sha256=hashlib.sha256(data).hexdigest())
    (path / DATA_FILE).write_bytes(data)
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="unreadable state.npz.*allow_pickle"):
        read_checkpoint(path)


@pytest.mark.parametrize("field,value", [("format_version", 99), ("format", "other-format")])
def test_another_format_or_version_falls_back_with_a_message(field, value, tmp_path):
    """A newest checkpoint whose format fields are damaged (or of another version) is skipped
    like a corrupt one: the run resumes from the one before and says why."""
    run("adam", tmp_path)
    manager = CheckpointManager(tmp_path)
    manifest = json.loads((manager.path_of(18) / MANIFEST_FILE).read_text())
    manifest[field] = value
    (manager.path_of(18) / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(IncompatibleCheckpoint, match="; this code reads"):
        read_checkpoint(manager.path_of(18))
    with pytest.warns(CheckpointWarning, match=f"skipped step_00000018: .*{value}.*resuming "
                                               f"from step_00000015 instead"):
        state, notes = manager.latest()
    assert state.step == 15 and len(notes) == 1


MALFORMED = {
    "an array entry that is a number": lambda m: m["arrays"].update(losses=5),
    "an array shape that is a string": lambda m: m["arrays"].update(losses={"shape": "7",
                                                                            "dtype": "<f8"}),
    "an array entry without dtype": lambda m: m["arrays"].update(losses={"shape": [7]}),
    "a step that is a boolean": lambda m: m.update(step=True),
    "arrays that are a list": lambda m: m.update(arrays=[]),
}


@pytest.mark.parametrize("damage", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_manifest_is_skipped_with_a_message(damage, tmp_path):
    run("adam", tmp_path)
    manager = CheckpointManager(tmp_path)
    manifest = json.loads((manager.path_of(18) / MANIFEST_FILE).read_text())
    damage(manifest)
    (manager.path_of(18) / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="step_00000018: manifest.json"):
        read_checkpoint(manager.path_of(18))
    with pytest.warns(CheckpointWarning, match="skipped step_00000018"):
        state, notes = manager.latest()
    assert state.step == 15 and len(notes) == 1


# ---------------------------------------------------------------- re-saving a step

def test_a_failed_re_save_of_a_step_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    """Re-saving a step writes the new checkpoint aside and swaps it in: a write that fails
    half way leaves the old checkpoint of that step whole."""
    manager = CheckpointManager(tmp_path)
    path = manager.save(5, *fresh())
    before = {name: (path / name).read_bytes() for name in (DATA_FILE, MANIFEST_FILE)}

    def full_disk(source, target):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint.os, "replace", full_disk)
    model, optimizer, rng, data = fresh("momentum")
    with pytest.raises(OSError, match="step_00000005 .*No space left on device"):
        manager.save(5, model, optimizer, rng, data)
    monkeypatch.undo()
    assert {name: (path / name).read_bytes() for name in before} == before
    assert manager.latest()[0].step == 5 and no_temporary_files(tmp_path)


def test_a_re_save_replaces_the_step_with_the_new_state(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(5, *fresh("adam"))
    manager.save(5, *fresh("momentum"))
    assert manager.latest()[0].meta["optimizer"]["class"] == "SGD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005"]


KILLED_SAVE = """
import os, sys
sys.path.insert(0, {tests!r})
import dsml.checkpoint as checkpoint
from test_checkpoint import fresh
manager = checkpoint.CheckpointManager({directory!r})
real, calls = getattr(checkpoint.os, {call!r}), []
def die_on(*args):
    calls.append(args)
    if len(calls) == {when}:
        os._exit(9)                          # a kill: no clean-up, no finally
    return real(*args)
setattr(checkpoint.os, {call!r}, die_on)
manager.save(5, *fresh("momentum"))
"""


@pytest.mark.parametrize("call,when", [("replace", 1), ("replace", 2), ("rename", 1),
                                       ("rename", 2)],
                         ids=["in the data file", "at the manifest", "moving the old aside",
                              "between the two renames"])
def test_a_kill_during_a_re_save_never_loses_the_step(call, when, tmp_path):
    import subprocess
    import sys
    manager = CheckpointManager(tmp_path)
    manager.save(5, *fresh("adam"))
    script = KILLED_SAVE.format(tests=str(Path(__file__).parent), directory=str(tmp_path),
                                call=call, when=when)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert finished.returncode == 9, finished.stderr.decode()[-2000:]
    assert any(p.name.startswith(".") for p in tmp_path.iterdir())    # the kill left debris
    state, notes = manager.latest()
    assert state.step == 5 and notes == []
    assert state.meta["optimizer"]["class"] == "Adam"                 # the old one, whole
    manager.save(6, *fresh())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005", "step_00000006"]


KILLED_ASYNC = """
import os, sys, threading
sys.path.insert(0, {tests!r})
import dsml.checkpoint as checkpoint
from test_checkpoint import EVERY, NOISE, STEPS, fresh
manager = checkpoint.CheckpointManager({directory!r}, keep_last=3)
real = checkpoint.os.replace
def die_in_the_writer(*args):
    if threading.current_thread().name == "checkpoint step {step}":
        os._exit(9)                  # the process dies while its background write is under way
    return real(*args)
checkpoint.os.replace = die_in_the_writer
model, optimizer, rng, data = fresh("adam")
checkpoint.train(model, optimizer, data, STEPS, rng=rng, manager=manager, checkpoint_every=EVERY,
                 input_noise=NOISE, asynchronous=True)
"""


def test_a_kill_during_an_asynchronous_write_resumes_from_the_checkpoint_before(tmp_path):
    # train() waits for the writer before a SimulatedCrash; a real crash does not: here the
    # whole process dies inside the background write of step 9, while training runs on.
    import subprocess
    import sys
    script = KILLED_ASYNC.format(tests=str(Path(__file__).parent), directory=str(tmp_path),
                                 step=3 * EVERY)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert finished.returncode == 9, finished.stderr.decode()[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == \
        ["step_00000003", "step_00000006"]
    assert any(p.name.startswith(".") for p in tmp_path.iterdir())    # step 9's half write
    state, notes = CheckpointManager(tmp_path).latest()
    assert state.step == 2 * EVERY and notes == []
    objects, result, _ = run("adam", tmp_path)            # a restarted process resumes
    assert result.resumed_from == 2 * EVERY
    assert_same_as_reference("adam", objects, result)


def test_leftovers_of_killed_saves_are_removed_by_the_next_save(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, *fresh())
    staging = tmp_path / ".step_00000002.x1y2.tmp"
    staging.mkdir()
    (staging / ".state.npz.abc.tmp").write_bytes(b"\0" * 10_000)    # a full-size half write
    (tmp_path / ".step_00000001.123.old").mkdir()                    # an older copy of step 1
    manager.save(3, *fresh())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000003"]


# ---------------------------------------------------------------- rotation

@pytest.mark.parametrize("keep_last", [1, 2, 3, 5, 100])
def test_rotation_keeps_the_newest_k(keep_last, tmp_path):
    run("adam", tmp_path, keep_last=keep_last)
    every_step = list(range(EVERY, STEPS + 1, EVERY))
    manager = CheckpointManager(tmp_path, keep_last=keep_last)
    assert manager.complete_steps() == every_step[-keep_last:]
    assert [step for step, _ in manager.checkpoints()] == every_step[-keep_last:]
    assert sorted(p.name for p in manager.path_of(18).iterdir()) == [MANIFEST_FILE, DATA_FILE]


def test_rotation_removes_older_unfinished_writes_and_keeps_newer_ones(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.path_of(1).mkdir()                   # unfinished, older than what is kept
    manager.path_of(99).mkdir()                  # unfinished, newer: maybe being written
    for step in (2, 3, 4):
        manager.save(step, *fresh())
    assert [step for step, _ in manager.checkpoints()] == [3, 4, 99]


def test_keep_last_counts_only_checkpoints_that_verify(tmp_path):
    """With keep_last=2, a damaged step 6 does not count: saving step 5 keeps step 4."""
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (4, 6):
        manager.save(step, *fresh())
    flip_a_byte(manager.path_of(6))
    manager.save(5, *fresh())
    assert [step for step, _ in manager.checkpoints()] == [4, 5, 6]
    manager.save(7, *fresh())
    assert [step for step, _ in manager.checkpoints()] == [5, 6, 7]


@pytest.mark.parametrize("keep_last", [0, -1, 1.5, True, "3", None])
def test_keep_last_must_be_at_least_one(keep_last, tmp_path):
    with pytest.raises(ValueError, match=f"keep_last must be an integer ≥ 1, got {keep_last!r}"):
        CheckpointManager(tmp_path, keep_last=keep_last)


# ---------------------------------------------------------------- mismatches are refused

def checkpoint_of_a_run(tmp_path):
    run("adam", tmp_path)
    return CheckpointManager(tmp_path)


@pytest.mark.parametrize("objects, message", [
    (lambda: fresh(sizes=[4, 9, 3]),
     "layer0.weight has shape (4, 8) in the checkpoint but (4, 9) in the model"),
    (lambda: fresh(sizes=[4, 8, 8, 3]), "layer2.weight is in the model but not in the checkpoint"),
    (lambda: fresh(sizes=[4, 3]), "layer1.weight is in the checkpoint but not in the model"),
    (lambda: fresh(activation="tanh"),
     "the model's activation is 'relu' in the checkpoint but 'tanh' here"),
    (lambda: fresh("momentum"), "the optimizer is Adam in the checkpoint but SGD here"),
    (lambda: fresh(X=X[:40], Y=Y[:40]),
     "the data loader has examples = 50 in the checkpoint but 40 here"),
    (lambda: fresh(batch=5), "the data loader has batch_size = 8 in the checkpoint but 5 here"),
])
def test_a_checkpoint_of_something_else_is_refused_and_nothing_changes(objects, message,
                                                                      tmp_path):
    manager = checkpoint_of_a_run(tmp_path)
    model, optimizer, rng, data = objects()
    before = fingerprint(model, optimizer, rng, []), data.position()
    with pytest.raises(IncompatibleCheckpoint, match=re.escape(message)):
        train(model, optimizer, data, STEPS, rng=rng, manager=manager)
    assert (fingerprint(model, optimizer, rng, []), data.position()) == before


def test_frozen_and_bit_generator_mismatches_are_named(tmp_path):
    manager = checkpoint_of_a_run(tmp_path)
    model, optimizer, _, data = fresh()
    model.frozen = {"layer1.bias"}
    with pytest.raises(IncompatibleCheckpoint) as refused:
        manager.restore_latest(model, optimizer, np.random.Generator(np.random.MT19937(0)), data)
    message = str(refused.value)
    assert "the model's frozen is [] in the checkpoint but ['layer1.bias'] here" in message
    assert "the bit generator is PCG64 in the checkpoint but MT19937 here" in message


# ---------------------------------------------------------------- directories and failed writes

def no_temporary_files(directory):
    return [p for p in directory.rglob("*") if p.name.endswith(".tmp")] == []


def test_a_missing_directory_is_an_error_unless_asked_to_create(tmp_path):
    missing = tmp_path / "nope" / "deeper"
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*nope/deeper does not "
                                                "exist; create it, or pass create=True"):
        CheckpointManager(missing)
    assert not missing.exists()
    CheckpointManager(missing, create=True).save(1, *fresh())
    assert read_checkpoint(missing / "step_00000001").step == 1


def test_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        CheckpointManager(tmp_path / "file")


def make_read_only(directory):
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(directory, os.W_OK):
        directory.chmod(stat.S_IRWXU)
        pytest.skip("running as root (or with CAP_DAC_OVERRIDE): chmod does not stop writes, so a "
                    "read-only directory cannot be made; the failed-write tests below cover the "
                    "same code path by injecting the PermissionError")


def test_a_read_only_directory_is_refused(tmp_path):
    make_read_only(tmp_path)
    try:
        with pytest.raises(PermissionError, match="is not writable"):
            CheckpointManager(tmp_path)
    finally:
        tmp_path.chmod(stat.S_IRWXU)


def test_a_directory_the_process_may_not_write_is_refused(tmp_path, monkeypatch):
    """The same refusal as above, on any user: the permission check answers no."""
    monkeypatch.setattr(checkpoint.os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError, match=f"checkpoint directory {tmp_path} is not writable"):
        CheckpointManager(tmp_path)


def test_a_directory_made_read_only_later_fails_the_save_cleanly(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, *fresh())
    make_read_only(tmp_path)
    try:
        with pytest.raises(PermissionError, match="could not write checkpoint step_00000002"):
            manager.save(2, *fresh())
    finally:
        tmp_path.chmod(stat.S_IRWXU)
    assert [step for step, _ in manager.checkpoints()] == [1] and no_temporary_files(tmp_path)


def test_a_write_refused_by_the_file_system_leaves_nothing(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    manager.save(1, *fresh())

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", refuse)
    with pytest.raises(PermissionError, match="could not write checkpoint step_00000002 in .*"
                                              "Permission denied.*older checkpoints are untouched"):
        manager.save(2, *fresh())
    assert [step for step, _ in manager.checkpoints()] == [1] and no_temporary_files(tmp_path)


@pytest.mark.parametrize("failing_call", [1, 2])        # the data file's rename, the manifest's
def test_a_crash_inside_the_write_leaves_no_temporary_file(failing_call, tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    manager.save(1, *fresh())
    calls, real_replace = [], os.replace

    def replace(source, target):
        calls.append(target)
        if len(calls) == failing_call:
            raise OSError(28, "No space left on device")
        real_replace(source, target)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(OSError, match="step_00000002 .*No space left on device"):
        manager.save(2, *fresh())
    assert [step for step, _ in manager.checkpoints()] == [1] and no_temporary_files(tmp_path)
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    assert manager.latest()[0].step == 1


def test_an_interrupt_inside_the_write_is_re_raised_as_is(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)

    def interrupt(*args):
        raise KeyboardInterrupt                # after the temporary file was written
    monkeypatch.setattr(checkpoint.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        manager.save(1, *fresh())
    assert manager.checkpoints() == [] and no_temporary_files(tmp_path)


def test_an_error_in_a_background_write_reaches_the_training_loop(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", refuse)
    manager.save_async(1, *fresh())                     # returns at once …
    with pytest.raises(PermissionError, match="could not write checkpoint step_00000001"):
        manager.wait()                                   # … the error comes here
    manager.wait()                                       # and only once


# ---------------------------------------------------------------- train's own bad input

@pytest.mark.parametrize("kwargs, message", [
    ({"steps": -1}, "steps must be an integer ≥ 0, got -1"),
    ({"checkpoint_every": 2}, "checkpoint_every=2 needs a manager"),
    ({"checkpoint_every": -1}, "checkpoint_every must be an integer ≥ 0"),
    ({"input_noise": -0.1}, "input_noise must be ≥ 0, got -0.1"),
])
def test_train_bad_input(kwargs, message):
    model, optimizer, rng, data = fresh()
    arguments = {"steps": 5, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        train(model, optimizer, data, rng=rng, **arguments)


def test_a_checkpoint_beyond_the_requested_steps_is_an_error(tmp_path):
    run("adam", tmp_path)
    model, optimizer, rng, data = fresh()
    with pytest.raises(ValueError, match="the newest checkpoint is of step 18, beyond steps=10"):
        train(model, optimizer, data, 10, rng=rng, manager=CheckpointManager(tmp_path))


def test_save_refuses_a_negative_step(tmp_path):
    with pytest.raises(ValueError, match="step must be an integer ≥ 0, got -3"):
        CheckpointManager(tmp_path).save(-3, *fresh())



# ---------------------------------------------------------------- sharded checkpoints

from dsml.checkpoint import load_resharded, save_sharded          # noqa: E402
from dsml.checkpoint_format import shard_file                       # noqa: E402
from dsml.comm.run import run as run_ranks                          # noqa: E402
from dsml.data_parallel import shard_bounds                         # noqa: E402
from dsml.net import AlphaBeta                                      # noqa: E402


def flat_state(n, seed=SEED):
    rng = np.random.default_rng(seed)
    return {"params": rng.normal(size=n), "adam/m": rng.normal(size=n).astype(np.float32),
            "adam/v": rng.random(n), "steps": np.arange(n, dtype=np.int64)}


def save_flat(directory, whole, world_size, step=7):
    def program(comm):
        mine = {name: vector[slice(*shard_bounds(vector.size, comm.size, comm.rank))].copy()
                for name, vector in whole.items()}
        return (yield from save_sharded(comm, directory, step, mine))
    run_ranks(program, world_size, network=AlphaBeta(alpha=5e-6, beta=1e-9))


@pytest.mark.parametrize("n,saved,loaded", [(1000, 8, 6), (1000, 6, 8), (37, 8, 1), (5, 8, 11),
                                            (103, 3, 3), (1, 4, 2)])
def test_a_sharded_checkpoint_reloads_onto_another_world_size_bit_for_bit(n, saved, loaded,
                                                                         tmp_path):
    whole = flat_state(n)
    save_flat(tmp_path, whole, saved)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted([MANIFEST_FILE] + [shard_file(r, saved) for r in range(saved)])
    pieces = [load_resharded(tmp_path, rank, loaded) for rank in range(loaded)]
    for name, vector in whole.items():
        for rank, piece in enumerate(pieces):
            start, stop = shard_bounds(n, loaded, rank)
            assert piece[name].dtype == vector.dtype
            assert piece[name].tobytes() == vector[start:stop].tobytes()


def test_a_damaged_shard_fails_only_the_ranks_that_read_it(tmp_path):
    whole = flat_state(1000)
    save_flat(tmp_path, whole, 8)
    flip = tmp_path / shard_file(3, 8)
    data = bytearray(flip.read_bytes())
    data[len(data) // 2] ^= 1
    flip.write_bytes(bytes(data))
    failed = []
    for rank in range(6):
        try:
            load_resharded(tmp_path, rank, 6)
        except CorruptCheckpoint as problem:
            assert "shard_00003_of_00008.npz (rank 3's shard): checksum mismatch" in str(problem)
            failed.append(rank)
    # old shard 3 holds [375, 500); new shards of 6: [0,167) [167,334) [334,501) [501,...)
    assert failed == [2]


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / MANIFEST_FILE).unlink(), "no manifest.json, so the save never finished"),
    (lambda d: (d / shard_file(0, 4)).unlink(), "cannot read it"),
    (lambda d: (d / shard_file(1, 4)).write_bytes((d / shard_file(1, 4)).read_bytes()[:100]),
     "truncated"),
    (lambda d: (d / MANIFEST_FILE).write_text("{"), "unreadable manifest.json"),
])
def test_a_sharded_checkpoint_with_a_missing_or_damaged_part_is_refused(damage, message,
                                                                       tmp_path):
    save_flat(tmp_path, flat_state(100), 4)
    damage(tmp_path)
    with pytest.raises(CorruptCheckpoint, match=message):
        for rank in range(3):
            load_resharded(tmp_path, rank, 3)


def test_a_sharded_manifest_whose_shards_do_not_tile_is_refused(tmp_path):
    save_flat(tmp_path, flat_state(100), 4)
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    manifest["shards"][2]["offsets"]["params"][0] += 1
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="not starting where shard 1 ends"):
        load_resharded(tmp_path, 0, 2)


@pytest.mark.parametrize("rank,world_size", [(0, 0), (3, 3), (-1, 2), (0, 1.5)])
def test_load_resharded_bad_input(rank, world_size, tmp_path):
    with pytest.raises(ValueError, match="need 0 ≤ rank < world_size"):
        load_resharded(tmp_path, rank, world_size)
