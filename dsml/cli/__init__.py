"""Plumbing (hand-written): the `dsml` command line.

    dsml pingpong [--engine processes|threads|sim|mpi] [-b 1] [-e 4M] [-f 4] [--round-trips N]
                  [--repeats N]
        ping-pong between two ranks over a range of sizes; prints one-way times, the
        effective bandwidth, and the α, β and n½ fitted by least squares.

    dsml bench <allreduce|broadcast|reduce|allgather|reduce_scatter|alltoall>
               [--algorithm NAME] [--engine sim|threads|processes|mpi] [--world-size P]
               [-b 8] [-e 64M] [-f 2 | -i BYTES] [-o sum|prod|max|min|mean]
               [-d float32|float64|int32|int64] [--root R] [--iters N] [--warmup N]
               [--alpha S --beta S/B --gamma S/B | --network FILE] [--check/--no-check]
        times a collective over a range of sizes and prints the nccl-tests table: size,
        count, type, redop, root, time, algbw, busbw (nccl-tests' correction factors) and
        #wrong, the elements that differ from a NumPy reference. nccl-tests' flags mean the
        same here (-o avg is mean, -d float and double are float32 and float64, -c 0/1 is
        --no-check/--check, -m 1); those with no equivalent are refused, naming dsml's.

    dsml calibrate [--engine processes|threads|mpi] [--output dsml-network.json] [-b 8]
                   [-e 4M] [-f 2] [--steps N] [--repeats N]
        times a collective's exchange step (sendrecv, then the block copied or added into a
        new buffer) per size; fits α, β to the copying step and γ to what adding costs more;
        warns of a suspect fit; writes α, β, γ and how they were measured to a JSON file that
        dsml.net.load_network(path) loads for the simulator.

    dsml validate [--engine processes|threads|mpi] [--network FILE] [-p 2 4]
                  [--algorithm NAME ...] [-b 1K] [-e 4M] [-f 16] [--repeats N]
        runs each all-reduce algorithm for real over the sizes and world sizes, predicts each
        run on the simulator with the calibrated network (calibrating first without
        --network), and prints size, algorithm, measured (median call, and its spread over
        the runs), predicted and the ratio measured / predicted.

    dsml memory --model NAME | --layers L --hidden H --heads A --vocab V --seq-len S
                [--kv-heads K] [--ffn-hidden F] [--style gpt|llama]
                [--dp 1] [--tp 1] [--pp 1] [--zero 0] [--micro-batch 1] [--microbatches 1]
                [--recompute none|selective|full] [--sequence-parallel]
                [--precision mixed|fp32] [--schedule 1f1b|gpipe] [--seq-len S]
                [--devices N] [--global-batch B] [--device-memory GB]
        the memory accountant (dsml.memory): bytes per rank of one layout — parameters,
        gradients, optimizer state, activations, buffers — on the most loaded pipeline stage
        and on every stage; with --device-memory, whether it fits.

    dsml memory --model NAME --search --devices N --global-batch B --device-memory GB
                [--top 10] [--zero Z] [--micro-batch b] [--recompute R] [--precision P]
                [--schedule S]
        every layout dp·tp·pp = N (dsml.layout_search.search_layouts): how many fit, and the
        fastest that fit, with their bytes per rank and the step model's seconds and MFU.

With --engine mpi, run the command under mpiexec (`mpiexec -n 4 python -m dsml bench
allreduce --engine mpi`): every process runs one rank, the world size is the job's, and only
rank 0 prints.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from dsml.cli import bench, calibration, memory, pingpong
# Names tests and benchmarks import from dsml.cli, where they lived before the split.
from dsml.cli.bench import (BENCH_COLLECTIVES, BENCH_DTYPES, DEFAULT_MAX_ITER_BYTES,
                            _count_wrong, bench_count, busbw_factor, default_algorithm,
                            exact_reduction)
from dsml.cli.checks import _flag, check_arguments
from dsml.cli.memory import MEMORY_PARTS
from dsml.cli.sizes import format_bytes, parse_size


# What `dsml --help` says first (the module's first line says what kind of module this is).
DESCRIPTION = ("The dsml command line: measure this machine (pingpong, calibrate) and hold the "
               "simulator against it (validate), time collectives as nccl-tests does (bench), "
               "and count the memory of a training layout (memory).")


class _Refused(argparse.Action):
    """An option dsml does not have under that letter, which a user may bring from nccl-tests
    or an older dsml: refused at once (exit status 2), naming dsml's equivalent."""

    def __init__(self, option_strings, dest, instead: str, **kwargs):
        self.instead = instead
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"argument {option_string}: {self.instead}")


def _command(commands, name: str, help: str):
    """A subcommand whose `dsml NAME --help` opens with the line `dsml --help` lists for it."""
    return commands.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")


def _ping_pong_arguments(parser, round_trips: int) -> None:
    """What `dsml pingpong` takes: the engine and the sizes, round trips and repeats of the
    ping-pong (`_one_way_table`)."""
    import dsml

    parser.add_argument("--engine", choices=dsml.ENGINES, default="processes",
                        help="default processes")
    parser.add_argument("-b", "--begin", type=parse_size, default=1,
                        help="smallest size (default 1)")
    parser.add_argument("-e", "--end", type=parse_size, default=4 * 1024**2,
                        help="largest size (default 4M)")
    parser.add_argument("-f", "--factor", type=int, default=4, help="size multiplier (default 4)")
    parser.add_argument("--round-trips", type=int, default=round_trips,
                        help=f"timed round trips per run, at every size (default {round_trips})")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (median; default 3)")




def main(argv=None) -> int:
    import dsml

    parser = argparse.ArgumentParser(prog="dsml", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dsml {dsml.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    pp = _command(commands, "pingpong", help="measure one-way message time and fit α, β")
    _ping_pong_arguments(pp, round_trips=20)
    pp.add_argument("--alpha", type=float, default=5e-6, help="engine sim: latency (s)")
    pp.add_argument("--beta", type=float, default=1e-10, help="engine sim: time per byte (s/B)")
    cal = _command(commands, "calibrate", help="measure α, β, γ of this machine and write "
                                               "them as a network file for the simulator")
    cal.add_argument("--engine", choices=dsml.ENGINES, default="processes",
                     help="default processes")
    cal.add_argument("-b", "--begin", type=parse_size, default=8, help="smallest size (default 8)")
    cal.add_argument("-e", "--end", type=parse_size, default=4 * 1024**2,
                     help="largest size (default 4M)")
    cal.add_argument("-f", "--factor", type=int, default=2, help="size multiplier (default 2)")
    cal.add_argument("--steps", type=int, default=10,
                     help="timed exchange steps of each kind per size and run (default 10)")
    cal.add_argument("--repeats", type=int, default=3, help="runs (median; default 3)")
    cal.add_argument("--output", default="dsml-network.json",
                     help="where to write the network file (default dsml-network.json)")
    cal.add_argument("-o", action=_Refused, instead=(
        "-o is the reduction op of dsml bench (as in nccl-tests); calibrate writes its network "
        "file with --output FILE"))
    val = _command(commands, "validate", help="run every all-reduce algorithm for real and "
                                              "hold it against the simulator's prediction")
    val.add_argument("--engine", choices=dsml.ENGINES,
                     default="processes", help="default processes")
    val.add_argument("--network", default=None,
                     help="a network file from dsml calibrate (default: calibrate first)")
    val.add_argument("-p", "--world-sizes", type=int, nargs="+", default=None,
                     help="world sizes (default 2 4; engine mpi: the job's size)")
    val.add_argument("--algorithm", nargs="+", default=None,
                     help="all-reduce algorithms (default: all of them)")
    val.add_argument("-b", "--begin", type=parse_size, default=1024,
                     help="smallest size (default 1K)")
    val.add_argument("-e", "--end", type=parse_size, default=4 * 1024**2,
                     help="largest size (default 4M)")
    val.add_argument("-f", "--factor", type=int, default=16, help="size multiplier (default 16)")
    val.add_argument("--repeats", type=int, default=3, help="runs per point (median; default 3)")
    bench_parser = _command(
        commands, "bench", help="time a collective over a range of sizes (the nccl-tests table)")
    bench_parser.add_argument("collective", choices=BENCH_COLLECTIVES)
    bench_parser.add_argument("--algorithm", default=None,
                              help="one of dsml.collectives.COLLECTIVE_ALGORITHMS[collective] "
                                   "(default: the library's default)")
    bench_parser.add_argument("--engine", choices=dsml.ENGINES, default="processes",
                              help="default processes")
    bench_parser.add_argument("-p", "--world-size", type=int, default=None,
                              help="number of ranks (default 4; engine mpi: the job's size)")
    bench_parser.add_argument("-b", "--begin", type=parse_size, default=8,
                              help="smallest size (default 8)")
    bench_parser.add_argument("-e", "--end", type=parse_size, default=64 * 1024**2,
                              help="largest size (default 64M)")
    bench_parser.add_argument("-f", "--factor", type=int, default=None,
                              help="size multiplier (default 2, unless -i is given)")
    bench_parser.add_argument("-i", "--step-bytes", type=parse_size, default=None,
                              help="instead of -f: each size this many bytes more than the one "
                                   "before (nccl-tests' -i)")
    bench_parser.add_argument("-o", "--op", type=bench.parse_op, default="sum",
                              metavar="{" + ",".join(bench.BENCH_OPS) + "}",
                              help="reduction (reducing collectives only; default sum); mean: "
                                   "the sum divided by p, float types only (avg, nccl-tests' "
                                   "name, is accepted for it)")
    bench_parser.add_argument("-d", "--dtype", type=bench.parse_dtype, default="float32",
                              metavar="{" + ",".join(BENCH_DTYPES) + "}",
                              help="element type (default float32; nccl-tests' float and "
                                   "double are accepted; no bfloat16: NumPy has no such dtype)")
    bench_parser.add_argument("-r", "--root", type=int, default=0,
                              help="root rank of broadcast and reduce (default 0)")
    bench_parser.add_argument("-n", "--iters", type=int, default=20,
                              help="timed iterations per size on real engines (default 20)")
    bench_parser.add_argument("-w", "--warmup", type=int, default=5,
                              help="untimed iterations first (default 5, as nccl-tests)")
    bench_parser.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=1,
                              help="time over ranks: 0 rank 0's, 1 the mean (default, as "
                                   "nccl-tests), 2 the minimum, 3 the maximum")
    bench_parser.add_argument("--repeats", type=int, default=3,
                              help="real engines: timed blocks of --iters per size; the table "
                                   "shows their median and min-max (default 3)")
    bench_parser.add_argument("-F", "--output-file", default=None,
                              help="also write the table to this CSV file")
    bench_parser.add_argument("--max-iter-bytes", type=parse_size,
                              default=DEFAULT_MAX_ITER_BYTES,
                              help="real engines: fewer iterations for large sizes, so that "
                                   "iterations × size ≤ this (default 256M; 0: always --iters)")
    bench_parser.add_argument("--alpha", type=float, default=None,
                              help="engine sim: latency (s, default 5e-6)")
    bench_parser.add_argument("--beta", type=float, default=None,
                              help="engine sim: time per byte (s/B, default 1e-10)")
    bench_parser.add_argument("--gamma", type=float, default=None,
                              help="engine sim: reduction time per byte (s/B, default 0)")
    bench_parser.add_argument("--network", default=None,
                              help="engine sim: a network file from dsml calibrate (instead of "
                                   "--alpha, --beta, --gamma)")
    bench_parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                              help="count wrong elements against NumPy (default on)")
    bench_parser.add_argument("-c", dest="check_iters", type=int, default=None, metavar="{0,1}",
                              help="nccl-tests' -c: 1 as --check, 0 as --no-check")
    bench_parser.add_argument("-m", "--agg-iters", type=int, default=1,
                              help="nccl-tests' collectives grouped per iteration: 1 only (dsml "
                                   "runs them one at a time)")
    for flag, meaning in (("-t", "threads per process"), ("-g", "GPUs per thread")):
        bench_parser.add_argument(flag, action=_Refused, instead=(
            f"nccl-tests' {meaning}; dsml bench runs -p/--world-size ranks (threads, processes "
            f"or MPI processes: --engine)"))
    bench_parser.add_argument("--timeout", type=float, default=600.0,
                              help="real engines: seconds allowed per size (default 600)")
    mem = _command(
        commands, "memory", help="bytes per rank of a training layout (the memory accountant), "
                                 "or --search: the layouts of a cluster that fit, fastest first")
    model = mem.add_argument_group("model: a preset, or explicit sizes")
    model.add_argument("--model", default=None,
                       help="a preset of dsml.model_config.PRESETS (gpt2, …, llama2-70b)")
    for name, meaning in (("layers", "transformer blocks"), ("hidden", "model width"),
                          ("heads", "query heads"), ("vocab", "vocabulary size")):
        model.add_argument(_flag(name), type=int, default=None, help=meaning)
    model.add_argument("--seq-len", type=int, default=None,
                       help="sequence length (with --model: replaces the preset's; with "
                            "learned positions the position table follows it)")
    model.add_argument("--kv-heads", type=int, default=None,
                       help="key/value heads (default: heads)")
    model.add_argument("--ffn-hidden", type=int, default=None,
                       help="MLP width (gpt default 4 × hidden; llama: required)")
    model.add_argument("--style", choices=("gpt", "llama"), default=None,
                       help="gpt (default): learned positions, LayerNorm, GELU, biases, tied "
                            "head; llama: rotary, RMSNorm, SwiGLU, no biases, untied head")
    lay = mem.add_argument_group("layout")
    for name, kind in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline")):
        lay.add_argument(_flag(name), type=int, default=None,
                         help=f"{kind}-parallel size (default 1)")
    lay.add_argument("--zero", type=int, default=None, help="ZeRO stage 0-3 (default 0)")
    lay.add_argument("--micro-batch", type=int, default=None,
                     help="sequences per micro-batch (default 1)")
    lay.add_argument("--microbatches", type=int, default=None,
                     help="micro-batches per step, m (default 1, or from --global-batch)")
    lay.add_argument("--recompute", default=None,
                     help="activation recomputation: none (default), selective or full")
    lay.add_argument("--sequence-parallel", action="store_true",
                     help="Megatron's sequence parallelism (with tp > 1)")
    lay.add_argument("--precision", default="mixed",
                     help="mixed (fp16, default), bf16 (the same bytes) or fp32")
    lay.add_argument("--schedule", default="1f1b", help="pipeline schedule: 1f1b (default) "
                                                        "or gpipe")
    lay.add_argument("--devices", type=int, default=None,
                     help="devices in the cluster: dp × tp × pp must equal it")
    lay.add_argument("--global-batch", type=int, default=None,
                     help="sequences per step: sets m = global batch / (dp × micro-batch)")
    lay.add_argument("--device-memory", type=float, default=None,
                     help="GB (1e9 B) per device: say whether the layout fits")
    find = mem.add_argument_group("search")
    find.add_argument("--search", action="store_true",
                      help="search every layout of --devices for --global-batch and "
                           "--device-memory (--zero, --micro-batch, --recompute restrict it)")
    find.add_argument("--top", type=int, default=None,
                      help="with --search: fitting layouts to print (default 10)")
    args = parser.parse_args(argv)
    command = {"pingpong": pingpong.pingpong, "calibrate": calibration.calibrate,
               "validate": calibration.validate, "bench": bench.bench,
               "memory": memory.memory}[args.command]
    rank = None
    try:
        if getattr(args, "engine", None) == "mpi":
            from dsml.comm.mpi import job_rank
            rank = job_rank()
        check_arguments(args)
        if rank:            # under mpiexec every process runs the command; rank 0 prints
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                return command(args)
        return command(args)
    except (ValueError, RuntimeError) as error:
        if not rank:        # every rank meets the same error: say it once
            print(f"dsml: error: {error}", file=sys.stderr)
        return 2
