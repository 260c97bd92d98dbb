"""Plumbing (hand-written): `dsml pingpong`, one-way message time between two ranks over a
range of sizes and the α, β fitted to it."""
from __future__ import annotations

from dsml.cli.sizes import size_range


def _one_way_table(args, network):
    """The ping-pong of `dsml pingpong`: print one row per size as it is measured; return
    (sizes, one-way times)."""
    from dsml.comm.calibrate import WARM_UP_ROUND_TRIPS, measure, ping_pong

    sizes = size_range(args.begin, args.end, args.factor)
    print(f"# ping-pong, 2 ranks, engine {args.engine}, {args.round_trips} round trips per run "
          f"after {WARM_UP_ROUND_TRIPS} untimed, median of {args.repeats} runs")
    # The units and the '#' of `dsml bench`'s table: µs and GB/s (1e9 B/s).
    print(f"#{'size (B)':>11} {'one-way (µs)':>14} {'bandwidth (GB/s)':>18}")

    def report(nbytes, seconds):
        print(f"{nbytes:>12d} {seconds * 1e6:>14.2f} {nbytes / seconds / 1e9:>18.4f}", flush=True)

    times = []
    for nbytes in sizes:
        times.append(measure(ping_pong, 2, (nbytes, args.round_trips), args.repeats,
                             args.engine, network=network))
        report(nbytes, times[-1])
    return sizes, times


def _print_fit(alpha: float, beta: float) -> None:
    from dsml.net.fit import half_performance_size

    if beta > 0:
        shape = (f"(peak {1 / beta / 1e9:.3f} GB/s), "
                 f"n_half = {half_performance_size(alpha, beta):.0f} B")
    else:   # the fit holds β at 0 when noise would make it negative: no finite peak
        shape = "(no size dependence resolved: widen the size range or add repeats)"
    print(f"# fit: alpha = {alpha * 1e6:.2f} µs, beta = {beta * 1e9:.4f} ns/B {shape}")


def pingpong(args) -> int:
    import dsml
    from dsml.net.fit import fit_alpha_beta

    network = dsml.net.AlphaBeta(args.alpha, args.beta) if args.engine == "sim" else None
    sizes, times = _one_way_table(args, network)
    _print_fit(*fit_alpha_beta(sizes, times))
    return 0
