"""Plumbing (hand-written): the checks every `dsml` command's arguments pass before the
command starts (counts ≥ 1, sizes that fit in this machine's memory, bounds on world size and
devices), so that a typo refuses at once instead of running for hours."""
from __future__ import annotations

import os


def _flag(name: str) -> str:
    """'micro_batch' -> '--micro-batch': an argument as the user typed it."""
    return "--" + name.replace("_", "-")


# Bounds a command checks before it starts anything, so that a typo refuses at once instead
# of running for hours or exhausting memory.
MAX_BENCH_WORLD_SIZE = 1024        # dsml bench --world-size (an all-to-all is p² messages)
MAX_SEARCH_DEVICES = 1 << 20       # dsml memory --search --devices (about a million)
ARRAY_COPIES = {"pingpong": 2, "calibrate": 4, "validate": 4, "bench": 4}   # see _check_sizes


def _physical_memory() -> int | None:
    """Bytes of RAM of this machine, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_sizes(args, ranks: int) -> None:
    """-e/--end must leave the arrays of a run (about ARRAY_COPIES per rank: inputs, results,
    what is in flight) in this machine's memory."""
    end = getattr(args, "end", None)
    memory = _physical_memory()
    if end is None or memory is None:
        return
    needed = ARRAY_COPIES[args.command] * ranks * end
    if needed > memory:
        raise ValueError(f"-e/--end {end:,} B needs about {needed / 1e9:,.3g} GB of arrays "
                         f"({ARRAY_COPIES[args.command]} copies on each of {ranks} ranks); this "
                         f"machine has {memory / 1e9:.3g} GB: give a smaller --end")


def check_arguments(args) -> None:
    """Checks every command shares (counts ≥ 1, sizes that fit in memory) and the bounds
    above; raise ValueError naming the flag, the value and the valid range."""
    for name in ("round_trips", "steps", "repeats", "iters", "top"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"{_flag(name)} must be ≥ 1, got {value}")
    if args.command == "bench":
        p = args.world_size
        if p is not None and not 1 <= p <= MAX_BENCH_WORLD_SIZE:
            raise ValueError(f"--world-size must be in 1..{MAX_BENCH_WORLD_SIZE}, got {p}")
        _check_sizes(args, 4 if p is None else p)
    elif args.command in ARRAY_COPIES:
        _check_sizes(args, 2)
    if args.command == "memory" and args.search and args.devices is not None \
            and args.devices > MAX_SEARCH_DEVICES:
        raise ValueError(f"--devices must be at most {MAX_SEARCH_DEVICES:,} for --search, got "
                         f"{args.devices:,}")
