"""Plumbing (hand-written): `dsml memory`, the memory accountant's bytes per rank of one
training layout, or with --search the layouts of a cluster that fit, fastest first."""
from __future__ import annotations

from dsml.cli.checks import _flag

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "total")
# The explicit model: these sizes, plus --seq-len; --kv-heads and --ffn-hidden are optional.
MODEL_SIZES = ("layers", "hidden", "heads", "vocab", "seq_len")
MODEL_OPTIONAL = ("kv_heads", "ffn_hidden")
# What `dsml memory --search` chooses itself, so cannot be given with it.
SEARCH_CHOOSES = ("dp", "tp", "pp", "microbatches", "sequence_parallel")


def memory_model(args):
    """The TransformerConfig that `dsml memory` describes: a preset (--seq-len, if given,
    replaces its sequence length) or the explicit sizes, GPT's recipe or Llama's (--style)."""
    import dataclasses

    from dsml.model_config import PRESETS, TransformerConfig, preset

    explicit = [name for name in MODEL_SIZES[:-1] + MODEL_OPTIONAL
                if getattr(args, name) is not None]
    if args.model is not None:
        if explicit or args.style is not None:
            extra = [_flag(name) for name in explicit] + ["--style"] * (args.style is not None)
            raise ValueError(f"give either --model or explicit sizes, not both: --model "
                             f"{args.model} with {', '.join(extra)}")
        config = preset(args.model)
        if args.seq_len is not None and args.seq_len != config.seq_len:
            # With learned positions the position table changes with it (seq_len × hidden).
            config = dataclasses.replace(config, seq_len=args.seq_len)
        return config
    missing = [_flag(name) for name in MODEL_SIZES if getattr(args, name) is None]
    if len(missing) == len(MODEL_SIZES):
        raise ValueError(f"give --model NAME (one of {', '.join(PRESETS)}) or the sizes "
                         f"--layers, --hidden, --heads, --vocab and --seq-len")
    if missing:
        raise ValueError(f"explicit sizes need --layers, --hidden, --heads, --vocab and "
                         f"--seq-len; missing {', '.join(missing)}")
    sizes = tuple(getattr(args, name) for name in MODEL_SIZES)
    name = (f"{args.style or 'gpt'}-style l={args.layers} h={args.hidden} a={args.heads} "
            f"V={args.vocab}")
    if args.style == "llama":
        if args.ffn_hidden is None:
            raise ValueError("--style llama needs --ffn-hidden: a SwiGLU MLP's width is no "
                             "fixed multiple of hidden (llama2-7b: hidden 4096, ffn 11008)")
        return TransformerConfig.llama_style(*sizes, ffn_hidden=args.ffn_hidden,
                                             kv_heads=args.kv_heads, name=name)
    config = TransformerConfig.gpt_style(*sizes, name=name)
    overrides = {field: getattr(args, field) for field in MODEL_OPTIONAL
                 if getattr(args, field) is not None}
    # replace() runs the config's checks again on the new values
    return dataclasses.replace(config, **overrides) if overrides else config


def memory_layout(args):
    """The Layout of `dsml memory` without --search. With --global-batch the micro-batches per
    step follow from it: m = global batch / (dp × micro-batch)."""
    import dataclasses

    from dsml.memory import Layout

    def given(name, default):
        value = getattr(args, name)
        return default if value is None else value

    given_m = args.microbatches
    layout = Layout(dp=given("dp", 1), tp=given("tp", 1), pp=given("pp", 1),
                    zero=given("zero", 0), micro_batch=given("micro_batch", 1),
                    microbatches=given("microbatches", 1), recompute=given("recompute", "none"),
                    sequence_parallel=args.sequence_parallel, precision=args.precision,
                    schedule=args.schedule)
    if args.devices is not None and layout.devices != args.devices:
        raise ValueError(f"dp × tp × pp must equal --devices {args.devices}, got "
                         f"{layout.dp} × {layout.tp} × {layout.pp} = {layout.devices}")
    if args.global_batch is not None:
        per_microbatch = layout.dp * layout.micro_batch
        if args.global_batch < 1 or args.global_batch % per_microbatch:
            raise ValueError(f"--global-batch must be a positive multiple of dp × micro-batch "
                             f"= {layout.dp} × {layout.micro_batch} = {per_microbatch}, got "
                             f"{args.global_batch}")
        m = args.global_batch // per_microbatch
        if given_m is not None and given_m != m:
            raise ValueError(f"--microbatches {given_m} disagrees with --global-batch "
                             f"{args.global_batch} = dp × micro-batch × microbatches = "
                             f"{layout.dp} × {layout.micro_batch} × {m}")
        layout = dataclasses.replace(layout, microbatches=m)
    return layout


def _describe_model(config) -> str:
    """'gpt2, 124,439,808 parameters (exact), seq_len 1024' (and the preset's own seq_len when
    --seq-len changed it)."""
    from dsml.model_config import PRESETS

    text = f"{config.name}, {config.num_params():,} parameters (exact), seq_len {config.seq_len}"
    original = PRESETS.get(config.name)
    if original is not None and original.seq_len != config.seq_len:
        text += f" (the preset's: {original.seq_len})"
    return text


def _device_bytes(args) -> float | None:
    """--device-memory (GB) in bytes; None when not given."""
    from dsml.memory import GB

    if args.device_memory is None:
        return None
    if not args.device_memory > 0:
        raise ValueError(f"--device-memory must be > 0 GB, got {args.device_memory}")
    return args.device_memory * GB


def _gb(nbytes: float) -> str:
    from dsml.memory import GB

    return f"{nbytes / GB:.3f}"


def _fits_line(total: float, device_bytes: float, device_memory: float) -> str:
    if total <= device_bytes:
        return (f"# fits in {device_memory:g} GB: yes, {_gb(total)} GB per rank "
                f"({_gb(device_bytes - total)} GB to spare)")
    return (f"# fits in {device_memory:g} GB: no, {_gb(total)} GB per rank "
            f"({_gb(total - device_bytes)} GB over)")


def _hardware_assumptions() -> str:
    """estimate_step's defaults, read from its signature, as one line."""
    import inspect

    from dsml.step_model import estimate_step

    defaults = {name: parameter.default
                for name, parameter in inspect.signature(estimate_step).parameters.items()}
    return (f"{defaults['device_flops'] / 1e12:g} TFLOP/s peak per device, large matrix "
            f"products at {defaults['gemm_efficiency']:g} of it (fitted), "
            f"{defaults['memory_bandwidth'] / 1e12:g} TB/s memory, "
            f"{defaults['intra_node_bandwidth'] / 1e9:g} GB/s within "
            f"{defaults['devices_per_node']}-device nodes, "
            f"{defaults['inter_node_bandwidth'] / 1e9:g} GB/s across")


def _memory_one_layout(args, config) -> int:
    from dsml.memory import memory_per_rank, params_per_rank, stage_memory
    from dsml.step_model import estimate_step

    layout = memory_layout(args)
    device_bytes = _device_bytes(args)
    binding = memory_per_rank(config, layout)      # checks the split (tp, pp) first
    stages = [stage_memory(config, layout, stage) for stage in range(layout.pp)]
    step = estimate_step(config, layout)
    print(f"# dsml memory: {_describe_model(config)}")
    print(f"# layout: {layout.label()} on {layout.devices} device{'s' * (layout.devices > 1)}; "
          f"{layout.microbatches} micro-batch{'es' * (layout.microbatches > 1)} per step "
          f"(global batch {layout.global_batch}), schedule {layout.schedule}, precision "
          f"{layout.precision}")
    print("# bytes per rank: ZeRO model states (Rajbhandari et al. 2020), activations "
          "(Korthikanti et al. 2022) × micro-batches in flight, buffers; GB = 1e9 B")
    where = f"stage {binding.stage} of {layout.pp}" if layout.pp > 1 else "every rank alike"
    print(f"# the most loaded rank: {where}, "
          f"{params_per_rank(config, layout.tp, layout.pp, binding.stage):,} parameters held")
    print(f"#{'part':>12} {'bytes':>20} {'GB':>10}")
    for part in MEMORY_PARTS:
        nbytes = getattr(binding, part)
        print(f"{part:>13} {nbytes:>20,.0f} {_gb(nbytes):>10}")
    if layout.pp > 1:
        print("# per pipeline stage (GB):")
        print(f"#{'stage':>5} {'parameters':>15} " + " ".join(
            f"{part:>11}" for part in MEMORY_PARTS))
        for memory in stages:
            held = params_per_rank(config, layout.tp, layout.pp, memory.stage)
            print(f"{memory.stage:>6} {held:>15,} " + " ".join(
                f"{_gb(getattr(memory, part)):>11}" for part in MEMORY_PARTS))
    print(f"# step model (estimate_step: {_hardware_assumptions()}; the data-parallel "
          f"gradient reduction overlaps the backward when pp = 1): "
          f"{step.seconds:.4g} s, MFU {step.mfu:.3f}")
    if device_bytes is not None:
        print(_fits_line(binding.total, device_bytes, args.device_memory))
    return 0


def _memory_search(args, config) -> int:
    import inspect

    from dsml.memory import Layout
    from dsml.layout_search import search_layouts

    for name in SEARCH_CHOOSES:
        if getattr(args, name) not in (None, False):
            raise ValueError(f"--search chooses dp, tp, pp, the micro-batches per step and "
                             f"sequence parallelism itself; drop {_flag(name)}")
    for name in ("devices", "global_batch", "device_memory"):
        if getattr(args, name) is None:
            raise ValueError(f"--search needs --devices, --global-batch and --device-memory; "
                             f"missing {_flag(name)}")
    top = 10 if args.top is None else args.top
    if top < 1:
        raise ValueError(f"--top must be ≥ 1, got {top}")
    device_bytes = _device_bytes(args)
    defaults = inspect.signature(search_layouts).parameters
    micro_batches = (defaults["micro_batches"].default if args.micro_batch is None
                     else (args.micro_batch,))
    zero_stages = defaults["zero_stages"].default if args.zero is None else (args.zero,)
    recompute = defaults["recompute"].default if args.recompute is None else (args.recompute,)
    # search_layouts builds a Layout only where dp·tp·pp splits the model: check the restricting
    # choices here, so that a bad one is named even when no layout exists.
    for b in micro_batches:
        for zero in zero_stages:
            for choice in recompute:
                Layout(zero=zero, micro_batch=b, recompute=choice, precision=args.precision,
                       schedule=args.schedule)
    results = search_layouts(config, args.devices, args.global_batch, device_bytes,
                             micro_batches=micro_batches, zero_stages=zero_stages,
                             recompute=recompute, precision=args.precision,
                             schedule=args.schedule, only_fitting=False)
    if not results:
        raise ValueError(
            f"no layout of {args.devices} devices splits {config.name} with global batch "
            f"{args.global_batch}: tp must divide heads={config.heads}, "
            f"kv_heads={config.kv_heads} and ffn_hidden={config.ffn_hidden}, pp must divide "
            f"layers={config.layers}, and dp × micro-batch (micro-batch in "
            f"{', '.join(map(str, micro_batches))}) must divide the global batch")
    fitting = [result for result in results if result.fits]
    print(f"# dsml memory --search: {_describe_model(config)}; {args.devices} devices, "
          f"global batch {args.global_batch}, {args.device_memory:g} GB per device")
    print(f"# layouts: dp·tp·pp = {args.devices} (tp dividing heads, kv_heads and ffn_hidden, "
          f"pp dividing layers); micro-batch {', '.join(map(str, micro_batches))} (dp × "
          f"micro-batch dividing the global batch);")
    print(f"#   ZeRO {', '.join(map(str, zero_stages))} (above 0 only with dp > 1, above 1 only "
          f"with pp = 1); recompute "
          f"{', '.join(recompute)}; sequence parallelism on and off when tp > 1; precision "
          f"{args.precision}, schedule {args.schedule}")
    print("# GB/rank: the most loaded rank (its pipeline stage: stage), GB = 1e9 B; "
          "m: micro-batches per step")
    print(f"# step: estimate_step's model ({_hardware_assumptions()}); "
          f"MFU = model FLOPs / (devices × peak × step)")
    if not fitting:
        smallest = min(results, key=lambda result: result.memory.total)
        print(f"# 0 of {len(results)} layouts fit in {args.device_memory:g} GB; the smallest "
              f"needs {_gb(smallest.memory.total)} GB per rank: {smallest.layout.label()}, "
              f"m {smallest.layout.microbatches}")
        return 0
    shown = fitting[:top]
    print(f"# {len(fitting)} of {len(results)} layouts fit in {args.device_memory:g} GB; the "
          f"fastest {len(shown)} (equal steps: less memory first):")
    print(f"#{'rank':>4} {'step (s)':>10} {'MFU':>7} {'GB/rank':>9} {'stage':>6} {'m':>5}  layout")
    for position, result in enumerate(shown, start=1):
        print(f"{position:>5} {result.step.seconds:>10.4g} {result.step.mfu:>7.4f} "
              f"{_gb(result.memory.total):>9} {result.memory.stage:>6} "
              f"{result.layout.microbatches:>5}  {result.layout.label()}")
    return 0


def memory(args) -> int:
    """`dsml memory`: bytes per rank of one layout (dsml.memory.memory_per_rank), or with
    --search the layouts of a cluster that fit, fastest first
    (dsml.layout_search.search_layouts)."""
    config = memory_model(args)
    if args.search:
        return _memory_search(args, config)
    if args.top is not None:
        raise ValueError("--top applies to --search only")
    return _memory_one_layout(args, config)
