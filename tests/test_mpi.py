"""Plumbing (hand-written): tests for the `mpi` engine (`dsml.comm.mpi`).

The engine runs inside MPI jobs, so most tests launch one — `mpiexec -n 2` or `-n 4`, through
`dsml.comm.mpi.mpiexec_command`, the launcher the README and the benchmark use — on
`tests/mpi_programs.py`, whose checks compare every rank's values with the simulator's bit for
bit (and with NumPy, or one process training on whole batches). They are skipped, saying
why, only when mpi4py or mpiexec is missing (`pip install -e '.[mpi]'`; CI installs it).

Bad input is tested in this process: no mpi4py, no job, a world size the job does not have.
A failing rank and a timeout must end the whole job (non-zero exit status, the rank and what
it waited for in the output) without hanging, leaving no process of the job behind and no
MPICH shared memory in /dev/shm. No assertion on speed.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import dsml
from dsml.cli import main as cli_main
from dsml.net.saved import load_measurement, load_network
from dsml.comm import mpi
from leaks import nothing_left_behind  # noqa: F401

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "mpi_programs.py"
JOB_TIMEOUT = 120.0         # s: generous; a job that takes this long hangs
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
MPIEXEC = mpi.find_mpiexec()
needs_mpi4py = pytest.mark.skipif(not HAVE_MPI4PY,
                                  reason="mpi4py is not installed (pip install -e '.[mpi]')")
needs_mpiexec = pytest.mark.skipif(
    not HAVE_MPI4PY or MPIEXEC is None,
    reason="mpi4py or mpiexec is not installed (pip install -e '.[mpi]' installs both)")


# --- launching jobs ----------------------------------------------------------------------------

def job_processes(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (Linux /proc; [] elsewhere)."""
    pids = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def orphaned_mpich_segments() -> set[str]:
    """MPICH shared-memory files in /dev/shm that no live process has mapped: what an
    aborted job leaves behind if nobody unlinks them."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return set()
    names = {entry.name for entry in shm.iterdir() if entry.name.startswith("mpich_shm_")}
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        names = {name for name in names if name not in text}
    return names


def launch(n: int, *argv, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess:
    """Run `python tests/mpi_programs.py *argv` as an n-process job (`python -m dsml *argv`
    if argv starts with "-m"); wait at most `timeout`; then check that no process of the job
    is left. The marker (`-X`, which Python ignores) finds the job's processes."""
    marker = f"dsml_test_{uuid.uuid4().hex}"
    script = [] if argv[0] == "-m" else [PROGRAMS]
    command = mpi.mpiexec_command(n, [sys.executable, "-X", marker, *script, *argv])
    env = mpi.mpiexec_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent),
                                                      env.get("PYTHONPATH")]))
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"mpiexec -n {n} {' '.join(map(str, argv))} hung (killed after "
                    f"{timeout:g} s)\nstdout:\n{out}\nstderr:\n{err}")
    deadline = time.monotonic() + 10.0          # the launcher reaps its ranks as it exits
    while job_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = job_processes(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the job left behind: {left}"
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def assert_ok(job, check):
    assert job.returncode == 0, (f"{check} failed (exit status {job.returncode})\n"
                                 f"stdout:\n{job.stdout}\nstderr:\n{job.stderr}")
    assert job.stdout.count(f"OK {check}") == 1, job.stdout


# --- the same results as on the simulator ------------------------------------------------------

@needs_mpiexec
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("check", ["collectives", "training", "activities", "trace",
                                   "payloads"])
def test_results_equal_the_simulator_s(check, p):
    assert_ok(launch(p, check), check)


@needs_mpiexec
@pytest.mark.parametrize("p", [2, 3])
def test_gather_scatter_and_barrier_equal_numpy(p):
    assert_ok(launch(p, "rooted"), "rooted")


@needs_mpiexec
def test_a_message_nobody_receives_is_an_error_on_every_process():
    assert_ok(launch(2, "unreceived"), "unreceived")


# --- failures end the job ------------------------------------------------------------------------

@needs_mpiexec
def test_a_rank_that_raises_ends_the_job_naming_the_rank():
    before = orphaned_mpich_segments()
    job = launch(4, "raises", 2)
    assert job.returncode != 0
    output = job.stdout + job.stderr
    assert ("dsml: engine mpi: rank 2 failed: ZeroDivisionError: rank program failed on "
            "purpose in rank 2 (ending the MPI job)") in output, output
    assert "--- traceback of rank 2 ---" in output, output
    assert "OK raises" not in output and "the run returned" not in output
    assert orphaned_mpich_segments() <= before, "the aborted job left shared memory behind"


@needs_mpiexec
def test_a_timeout_ends_the_job_saying_what_each_rank_waits_for():
    before = orphaned_mpich_segments()
    job = launch(2, "hangs", 2)
    assert job.returncode != 0
    output = job.stdout + job.stderr
    assert ("dsml: engine mpi: the run did not finish within the timeout of 2 s: rank 0 waits "
            "for a message from rank 1 (tag 3)") in output, output
    assert ("the run did not finish within the timeout of 2 s: rank 1 is running its program "
            "(not waiting on a message)") in output, output
    assert orphaned_mpich_segments() <= before, "the aborted job left shared memory behind"


@needs_mpiexec
@pytest.mark.parametrize("p", [2, 3])
def test_a_deadlock_ends_the_job_at_once_with_every_rank_s_wait(p):
    """Before, the job waited out its whole timeout; now rank 0's waves find the deadlock (no
    rank running, nothing in flight, twice in a row) and it prints the report."""
    before = orphaned_mpich_segments()
    job = launch(p, "deadlocks", 60)
    assert job.returncode != 0
    output = job.stdout + job.stderr
    assert "did not finish within the timeout" not in output, output
    assert "deadlock at t=" in output and "(found by engine='mpi'" in output, output
    for rank in range(p):
        assert f"rank {rank} waits for a message from rank {(rank + 1) % p} (tag 4)" \
            in output, output
    assert "OK deadlocks" not in output
    assert orphaned_mpich_segments() <= before, "the aborted job left shared memory behind"


@needs_mpiexec
def test_a_sigkilled_rank_leaves_no_shared_memory_behind():
    """Nobody gets to clean up after SIGKILL (no MPI_Finalize, no abort_job): the run itself
    unlinked MPICH's files as soon as every process was through MPI_Init."""
    before = orphaned_mpich_segments()
    job = launch(4, "killed", 1)
    assert job.returncode != 0
    output = job.stdout + job.stderr
    assert "OK killed" not in output
    assert "Traceback" not in output, output          # killed, not failed (which aborts)
    assert orphaned_mpich_segments() <= before, "the killed job left shared memory behind"


# --- the command line under mpiexec ------------------------------------------------------------

def launch_cli(n, *argv):
    return launch(n, "-m", "dsml", *argv)


@needs_mpiexec
def test_bench_under_mpiexec_prints_one_table_with_nothing_wrong():
    job = launch_cli(2, "bench", "allreduce", "--engine", "mpi", "-b", "8", "-e", "64K",
                     "-f", "8", "--iters", "3")
    assert job.returncode == 0, job.stderr
    assert job.stdout.count("# dsml bench allreduce: engine mpi, 2 ranks") == 1, job.stdout
    rows = [line.split() for line in job.stdout.splitlines()
            if line.strip() and not line.startswith("#")]
    assert [int(row[0]) for row in rows] == [8, 64, 512, 4096, 32768]
    assert all(row[-1] == "0" for row in rows), job.stdout
    assert "# Wrong elements : 0 OK" in job.stdout


@needs_mpiexec
def test_bench_with_a_world_size_the_job_does_not_have_says_so_once():
    job = launch_cli(2, "bench", "allreduce", "--engine", "mpi", "--world-size", "3",
                     "-b", "8", "-e", "8")
    assert job.returncode == 2
    assert job.stderr.count("dsml: error: --world-size=3 does not match this MPI job's 2 "
                            "processes: launch it with `mpiexec -n 3") == 1, job.stderr
    assert job.stdout == ""


@needs_mpiexec
def test_calibrate_then_validate_under_mpiexec(tmp_path):
    """Calibrate MPI's transport in a 2-process job (rank 0 alone writes the file), then
    validate two algorithms with it in a 4-process job: one table, every row a prediction."""
    path = tmp_path / "mpi-network.json"
    job = launch_cli(2, "calibrate", "--engine", "mpi", "--output", str(path), "-e", "64K",
                     "--repeats", "1", "--steps", "2")
    assert job.returncode == 0, job.stderr
    assert job.stdout.count("# wrote ") == 1, job.stdout
    assert load_measurement(path)["engine"] == "mpi"
    network = load_network(path)
    assert network.alpha > 0 and network.beta > 0 and network.gamma >= 0
    job = launch_cli(4, "validate", "--engine", "mpi", "--network", str(path), "--algorithm",
                     "ring", "tree", "-b", "1K", "-e", "16K", "--repeats", "1")
    assert job.returncode == 0, job.stderr
    rows = [line.split() for line in job.stdout.splitlines()
            if line.strip() and not line.startswith("#")]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("4", "ring", "1024"), ("4", "ring", "16384"), ("4", "tree", "1024"),
        ("4", "tree", "16384")], job.stdout
    assert all(float(row[3]) > 0 and float(row[5]) > 0 for row in rows)


@needs_mpiexec
def test_validate_under_mpiexec_without_a_network_needs_a_two_rank_job():
    job = launch_cli(4, "validate", "--engine", "mpi", "-e", "1K")
    assert job.returncode == 2
    assert job.stderr.count("calibrating needs a 2-rank job") == 1, job.stderr


# --- bad input, in this process ------------------------------------------------------------------

def ring(comm):
    from dsml.collectives import allreduce
    return (yield from allreduce(comm, np.arange(4.0) + comm.rank))


def fails(comm):
    yield comm.compute(0.0)
    raise KeyError("on purpose")


def test_without_mpi4py_the_error_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)     # `import mpi4py` now fails
    with pytest.raises(RuntimeError, match=r"engine='mpi' needs mpi4py and an MPI library.*"
                                           r"pip install -e '\.\[mpi\]'"):
        dsml.run(ring, 2, engine="mpi")


@needs_mpi4py
def test_outside_a_job_the_error_says_how_to_launch():
    with pytest.raises(ValueError, match=r"this process is not in one \(MPI\.COMM_WORLD has 1 "
                                         r"process\) but world_size=3: launch it with "
                                         r"`mpiexec -n 3 python your_script\.py`"):
        dsml.run(ring, 3, engine="mpi")


@needs_mpi4py
def test_the_cli_outside_a_job_says_how_to_launch(capsys):
    assert cli_main(["bench", "allreduce", "--engine", "mpi", "-p", "2", "-e", "8"]) == 2
    err = capsys.readouterr().err
    assert "dsml: error: --engine mpi runs inside an MPI job" in err
    assert "`mpiexec -n 2 python your_script.py`" in err


@needs_mpi4py
def test_one_rank_runs_in_a_one_process_job_and_its_errors_are_raised():
    result = dsml.run(ring, None, engine="mpi")        # world_size=None: the job's (1)
    assert result.world_size == 1 and result.engine == "mpi"
    assert np.array_equal(result.values[0], np.arange(4.0))
    with pytest.raises(dsml.RankError, match=r"rank 0 failed: KeyError: 'on purpose'") as info:
        dsml.run(fails, 1, engine="mpi")
    assert info.value.rank == 0


@pytest.mark.parametrize("world_size, words", [(0, "world_size must be an integer ≥ 1"),
                                               (2.0, "world_size must be an integer ≥ 1")])
def test_a_world_size_that_is_no_size_is_refused(world_size, words):
    with pytest.raises(ValueError, match=words):
        dsml.run(ring, world_size, engine="mpi")


# --- the launcher ----------------------------------------------------------------------------------

def fake_mpiexec(tmp_path, version_text) -> str:
    path = tmp_path / "mpiexec"
    path.write_text(f"#!/bin/sh\necho '{version_text}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_launcher_forks_hydra_s_ranks_on_this_host(tmp_path):
    exe = fake_mpiexec(tmp_path, "HYDRA build details:\n    Version: 5.0.2")
    assert mpi.mpiexec_command(3, ["python", "x.py"], exe) == [
        exe, "-launcher", "fork", "-n", "3", "python", "x.py"]


def test_the_launcher_lets_open_mpi_run_as_root_and_oversubscribe(tmp_path):
    exe = fake_mpiexec(tmp_path, "mpiexec (Open MPI) 5.0.5")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert mpi.mpiexec_command(4, ["a"], exe) == [exe, *root, "--oversubscribe", "-n", "4", "a"]


def test_the_job_s_environment_asks_for_one_blas_thread_unless_told_otherwise():
    env = mpi.mpiexec_env({"OMP_NUM_THREADS": "3"})
    assert env["OMP_NUM_THREADS"] == "3" and env["OPENBLAS_NUM_THREADS"] == "1"
