"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dataclasses import dataclass

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.memory import DDP_BUCKET_BYTES, Layout, MemoryBreakdown, PRECISIONS, RECOMPUTE, SCHEDULES, memory_per_rank
from dsml.model_config import TransformerConfig, _check_choice, _check_count
from dsml.step_model import StepEstimate, estimate_step


# -- cell 195
@dataclass(frozen=True)
class LayoutResult:
    """One layout of the search: its memory (the binding rank), its step estimate, and whether
    it fits the device."""
    layout: Layout
    memory: MemoryBreakdown
    step: StepEstimate
    fits: bool


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# -- cell 196
def search_layouts(config: TransformerConfig, devices: int, global_batch: int,
                   device_bytes: float, micro_batches=(1, 2, 4, 8), zero_stages=(0, 1, 2, 3),
                   recompute=RECOMPUTE, precision: str = "mixed", schedule: str = "1f1b",
                   only_fitting: bool = True, bucket_bytes: float = DDP_BUCKET_BYTES,
                   **hardware) -> list[LayoutResult]:
    """Every layout dp·tp·pp = devices (tp dividing heads, kv_heads and ffn_hidden; pp dividing
    layers; dp·micro_batch dividing global_batch), for each micro-batch size, ZeRO stage (stages
    above 0 only with dp > 1, above 1 only with pp = 1), recomputation and, with tp > 1, with
    and without sequence parallelism; scored by `memory_per_rank` and `estimate_step`
    (`hardware`: its keyword arguments). Returns those whose bytes fit in device_bytes (all if only_fitting is False),
    fastest first."""
    _check_count("devices", devices)
    _check_count("global_batch", global_batch)
    if not device_bytes > 0:
        raise ValueError(f"device_bytes must be > 0, got {device_bytes!r}")
    for stage in zero_stages:
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stages must hold stages 0–3, got {stage!r}")
    for micro_batch in micro_batches:
        _check_count("micro_batches", micro_batch)
    for choice in recompute:
        _check_choice("recompute", choice, RECOMPUTE)
    _check_choice("precision", precision, tuple(PRECISIONS))
    _check_choice("schedule", schedule, SCHEDULES)
    results = []
    for tp in _divisors(devices):
        if config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp:
            continue
        for pp in _divisors(devices // tp):
            if config.layers % pp:
                continue
            dp = devices // (tp * pp)
            for micro_batch in micro_batches:
                if global_batch % (dp * micro_batch):
                    continue
                microbatches = global_batch // (dp * micro_batch)
                for zero in zero_stages:
                    if zero > 0 and dp == 1:
                        continue        # ZeRO shards over data-parallel ranks: nothing to shard
                    if zero >= 2 and pp > 1:
                        continue        # refused by Layout: see its docstring
                    for choice in recompute:
                        for sequence_parallel in ((False, True) if tp > 1 else (False,)):
                            layout = Layout(dp, tp, pp, zero, micro_batch, microbatches, choice,
                                            sequence_parallel, precision, schedule)
                            memory = memory_per_rank(config, layout, bucket_bytes)
                            fits = memory.total <= device_bytes
                            if fits or not only_fitting:
                                step = estimate_step(config, layout, **hardware)
                                results.append(LayoutResult(layout, memory, step, fits))
    results.sort(key=lambda result: (result.step.seconds, result.memory.total))
    return results


# -- cell 197
def pareto_frontier(results: list[LayoutResult]) -> list[LayoutResult]:
    """The layouts no other beats on both memory and MFU: sorted by bytes per rank, each with a
    higher MFU than every layout that needs less memory."""
    frontier, best_mfu = [], -1.0
    for result in sorted(results, key=lambda r: (r.memory.total, -r.step.mfu)):
        if result.step.mfu > best_mfu:
            frontier.append(result)
            best_mfu = result.step.mfu
    return frontier
