"""Plumbing (hand-written): the checks every `dsml` command's arguments pass before the
command starts (counts ≥ 1, size ranges that hold a size, sizes that fit in this machine's
memory, bounds on world size and devices, an output file that can be written), so that a typo
refuses at once instead of running for hours."""
from __future__ import annotations

import os

from dsml.cli.sizes import format_bytes, size_range, typed

FLOAT64_COMMANDS = ("calibrate", "validate")   # their sizes are float64 vectors (8 B)
LINE_FITS = {"pingpong": "α and β", "calibrate": "α, β and γ"}   # need two sizes at least


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


def _check_writable(path, flag: str) -> None:
    """A file can be written at `path`, as save_network writes it (a file created in its
    directory, then renamed): checked by creating one and removing it, before any measuring."""
    import tempfile
    from pathlib import Path

    target = Path(path)
    if target.is_dir():
        raise ValueError(f"cannot write {flag} {path}: it is a directory")
    if not target.parent.is_dir():
        raise ValueError(f"cannot write {flag} {path}: directory {target.parent} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".check"):
            pass
    except OSError as error:
        raise ValueError(f"cannot write {flag} {path}: {error.strerror or error} (creating a "
                         f"file in {target.parent})") from None


def _check_range(args) -> None:
    """-b, -e, -f of pingpong, calibrate and validate: a range of at least one size (size_range
    refuses the rest, naming the flags); calibrate's and validate's sizes whole float64
    vectors; at least two sizes where a line is fitted."""
    sizes = size_range(args.begin, args.end, args.factor)
    given = f"-b {typed(args.begin)} -e {typed(args.end)} -f {args.factor}"
    if args.command in FLOAT64_COMMANDS:
        odd = [n for n in sizes if n % 8]
        if odd:
            raise ValueError(f"dsml {args.command} times float64 vectors: every size must be a "
                             f"multiple of 8 B; {given} gives "
                             f"{', '.join(map(format_bytes, odd[:3]))}"
                             + (" …" if len(odd) > 3 else ""))
    if args.command in LINE_FITS and len(sizes) < 2:
        raise ValueError(f"dsml {args.command} fits {LINE_FITS[args.command]} to a line through "
                         f"the sizes: {given} gives one size ({format_bytes(sizes[0])}); give a "
                         f"larger -e/--end or a smaller -f/--factor")


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
        _check_range(args)
        _check_sizes(args, 2)
    if args.command == "calibrate":
        _check_writable(args.output, "--output")
    if args.command == "memory" and args.search and args.devices is not None \
            and args.devices > MAX_SEARCH_DEVICES:
        raise ValueError(f"--devices must be at most {MAX_SEARCH_DEVICES:,} for --search, got "
                         f"{args.devices:,}")
