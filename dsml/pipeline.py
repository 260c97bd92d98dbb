"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 52
import numbers
from collections import deque
from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


class Op(NamedTuple):
    """One step of one stage: `kind` "F" (forward), "B" (backward) or "W" (weight gradient) of
    micro-batch `microbatch` through the stage's model chunk `chunk` (always 0 unless the
    schedule is interleaved). In a schedule without W ops, B is the whole backward pass; in a
    split schedule (zb-h1), B computes only the gradient of the chunk's input — what the stage
    before is waiting for — and W, later, the gradients of the weights."""
    kind: str
    microbatch: int
    chunk: int = 0

    def label(self) -> str:
        """Short text for a Gantt bar: "F3", or "F3c1" for chunk 1."""
        return f"{self.kind}{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "")


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
    return int(value)


def gpipe_ops(stage: int, stages: int, microbatches: int) -> list:
    """GPipe (Huang et al. 2019): every forward, then every backward. All m micro-batches'
    activations are held at the turn."""
    forwards = [Op("F", mb) for mb in range(microbatches)]
    backwards = [Op("B", mb) for mb in range(microbatches)]
    return forwards + backwards


def one_f_one_b_ops(stage: int, stages: int, microbatches: int) -> list:
    """1F1B, PipeDream-Flush (Narayanan et al. 2021): stage i runs min(p − i − 1, m) warm-up
    forwards, then alternates one forward with one backward, then drains the backwards. A
    backward frees its micro-batch, so stage i never holds more than min(p − i, m)."""
    warmup = min(stages - stage - 1, microbatches)
    ops = [Op("F", mb) for mb in range(warmup)]
    for k in range(microbatches - warmup):
        ops.append(Op("F", warmup + k))
        ops.append(Op("B", k))
    ops += [Op("B", mb) for mb in range(microbatches - warmup, microbatches)]
    return ops


# -- cell 53
def interleaved_ops(stage: int, stages: int, microbatches: int, chunks: int) -> list:
    """Interleaved 1F1B (Narayanan et al. 2021, §2.2; Megatron-LM's order): the model is cut
    into p·v chunks and stage i holds chunks i, i + p, i + 2p, …, so a micro-batch visits every
    stage v times. Forwards go in groups of p micro-batches through chunk 0, then the same
    group through chunk 1, …; backwards the same with the chunks reversed. Warm-up is
    2(p − i − 1) + (v − 1)p forwards. Needs m a multiple of p (the groups), as Megatron-LM
    does."""
    per_round = stages * chunks
    total = microbatches * chunks

    def nth(k: int, kind: str) -> Op:
        group, within = divmod(k, per_round)
        chunk = within // stages
        if kind == "B":
            chunk = chunks - 1 - chunk
        return Op(kind, group * stages + within % stages, chunk)

    warmup = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)
    ops = [nth(k, "F") for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(nth(warmup + k, "F"))
        ops.append(nth(k, "B"))
    ops += [nth(k, "B") for k in range(total - warmup, total)]
    return ops


def zb_h1_ops(stage: int, stages: int, microbatches: int) -> list:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with the backward split
    into B (input gradient, on the critical path) and W (weight gradient, needed by nobody
    else). Stage i postpones its first i W's to the end, where they fill the idle slots that
    1F1B leaves while the last backwards travel up; afterwards each B is followed by the W of
    the oldest micro-batch still waiting. A micro-batch is held until its W, so no stage holds
    more than min(p, m) — 1F1B's peak."""
    warmup = min(stages - stage - 1, microbatches)
    ops = [Op("F", mb) for mb in range(warmup)]
    waiting_for_w = deque()
    for k in range(microbatches):
        if warmup + k < microbatches:
            ops.append(Op("F", warmup + k))
        ops.append(Op("B", k))
        waiting_for_w.append(k)
        if k >= stage:
            ops.append(Op("W", waiting_for_w.popleft()))
    ops += [Op("W", mb) for mb in waiting_for_w]
    return ops


# -- cell 54
def schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> list:
    """The ordered ops of every stage: a list of p lists of Op.

    name: "gpipe", "1f1b", "interleaved" (v = `chunks` model chunks per stage; m must be a
    multiple of p; with chunks = 1 it is 1F1B) or "zb-h1" (backward split into B and W).
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    stages = _count("stages", stages)
    microbatches = _count("microbatches", microbatches)
    chunks = _count("chunks", chunks)
    if chunks > 1 and name != "interleaved":
        raise ValueError(f"chunks = {chunks} needs the 'interleaved' schedule; {name!r} runs "
                         f"one chunk per stage (chunks = 1)")
    if name == "interleaved" and microbatches % stages:
        raise ValueError(f"the interleaved schedule needs microbatches to be a multiple of "
                         f"stages (Megatron-LM groups micro-batches by p); got microbatches = "
                         f"{microbatches}, stages = {stages}")
    ops = []
    for stage in range(stages):
        if name == "gpipe":
            ops.append(gpipe_ops(stage, stages, microbatches))
        elif name == "1f1b" or (name == "interleaved" and chunks == 1):
            ops.append(one_f_one_b_ops(stage, stages, microbatches))
        elif name == "interleaved":
            ops.append(interleaved_ops(stage, stages, microbatches, chunks))
        else:
            ops.append(zb_h1_ops(stage, stages, microbatches))
    return ops


# -- cell 57
def _needs(op: Op, stage: int, stages: int, chunks: int) -> list:
    """The ops (kind, micro-batch, virtual stage) that must finish before `op` can start.
    Virtual stage s = chunk·p + stage is the s-th piece of the model."""
    virtual = op.chunk * stages + stage
    last = stages * chunks - 1
    if op.kind == "F":
        return [("F", op.microbatch, virtual - 1)] if virtual > 0 else []
    if op.kind == "B":
        needs = [("F", op.microbatch, virtual)]
        if virtual < last:
            needs.append(("B", op.microbatch, virtual + 1))
        return needs
    return [("B", op.microbatch, virtual)]


# -- cell 58
def check_schedule(ops: list, microbatches: int, chunks: int = 1) -> None:
    """Raise ValueError unless `ops` (one list of Op per stage) is a pipeline schedule that runs.

    Every stage must run F and B of every (micro-batch, chunk) exactly once, and W of each
    exactly once either on every stage (a split backward) or on none. And the stages must be
    able to run their lists in order without waiting forever: F of a micro-batch on virtual
    stage s after its F on s − 1; B on s after its B on s + 1 and its own F; W after its B.
    The check plays the schedule out (each stage starts its next op as soon as what it needs
    is done) and names the ops that wait when nothing can move.
    """
    stages = len(ops)
    if stages < 1:
        raise ValueError("a schedule needs at least one stage, got an empty list")
    microbatches = _count("microbatches", microbatches)
    chunks = _count("chunks", chunks)
    expected = sorted((mb, chunk) for mb in range(microbatches) for chunk in range(chunks))
    split = any(op.kind == "W" for stage_ops in ops for op in stage_ops)
    kinds = ("F", "B", "W") if split else ("F", "B")
    for stage, stage_ops in enumerate(ops):
        seen = {kind: [] for kind in kinds}
        for op in stage_ops:
            if op.kind not in seen:
                raise ValueError(f"stage {stage}: op {op} has kind {op.kind!r}; valid kinds "
                                 f"are {', '.join(kinds)}")
            seen[op.kind].append((op.microbatch, op.chunk))
        for kind in kinds:
            if sorted(seen[kind]) != expected:
                missing = sorted(set(expected) - set(seen[kind]))
                extra = sorted(set(seen[kind]) - set(expected))
                repeated = sorted({pair for pair in seen[kind] if seen[kind].count(pair) > 1})
                raise ValueError(
                    f"stage {stage} must run {kind} exactly once for each (micro-batch, chunk) "
                    f"with micro-batch < {microbatches} and chunk < {chunks}; missing {missing}, "
                    f"repeated {repeated}, out of range {extra}")
    done = set()
    position = [0] * stages
    moved = True
    while moved:
        moved = False
        for stage in range(stages):
            while position[stage] < len(ops[stage]):
                op = ops[stage][position[stage]]
                if not all(need in done for need in _needs(op, stage, stages, chunks)):
                    break
                done.add((op.kind, op.microbatch, op.chunk * stages + stage))
                position[stage] += 1
                moved = True
    stuck = [stage for stage in range(stages) if position[stage] < len(ops[stage])]
    if stuck:
        waits = []
        for stage in stuck:
            op = ops[stage][position[stage]]
            missing = [need for need in _needs(op, stage, stages, chunks) if need not in done]
            waits.append(f"stage {stage} waits at {op.label()} for "
                         + ", ".join(f"{kind}{mb} of virtual stage {s}" for kind, mb, s in missing))
        raise ValueError("the schedule cannot run to the end (a dependency cycle): "
                         + "; ".join(waits))


# -- cell 59
def bubble_formula(name: str, stages: int, microbatches: int, chunks: int = 1) -> float:
    """The published bubble fraction (idle ÷ total stage time) — the model the simulation is
    checked against, never used by it. GPipe and 1F1B: (p − 1)/(m + p − 1) (Huang et al. 2019;
    equal stages, free communication). Interleaved: x = (p − 1)/(v·m) of the ideal time
    (Narayanan et al. 2021). ZB-H1 at T_F = T_B = T_W: x ≈ (p − 1)/(3m) of the ideal time
    (Qi et al. 2023). A fraction x of the ideal time is x/(1 + x) of the total."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    p, m = _count("stages", stages), _count("microbatches", microbatches)
    v = _count("chunks", chunks)
    if v > 1 and name != "interleaved":
        raise ValueError(f"chunks = {v} needs the 'interleaved' schedule; {name!r} runs one "
                         f"chunk per stage (chunks = 1)")
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    over_ideal = (p - 1) / (v * m) if name == "interleaved" else (p - 1) / (3 * m)
    return over_ideal / (1 + over_ideal)


# -- cell 62
import math
from dataclasses import dataclass, field

from dsml.comm.api import SizeOnly
from dsml.comm.run import run
from dsml.net.alphabeta import AlphaBeta


class OpSpan(NamedTuple):
    """An op as it ran on its stage: from `start` to `end`, in seconds (simulated on 'sim')."""
    op: Op
    start: float
    end: float


def _message_tag(kind: str, microbatch: int, virtual: int, microbatches: int) -> int:
    """The tag of one message, unique in the run: the activation ("F") or the gradient ("B")
    of `microbatch` on its way to virtual stage `virtual`."""
    return 2 * (virtual * microbatches + microbatch) + (0 if kind == "F" else 1)


def _send(comm, local: dict, dst: int, tag: int, payload):
    # With one stage (p = 1) consecutive chunks live on the same rank: keep the message here.
    if dst == comm.rank:
        local[tag] = payload
        return
    yield comm.send(dst, payload, tag)


def _receive(comm, local: dict, src: int, tag: int):
    if src == comm.rank:
        return local.pop(tag)
    return (yield comm.recv(src, tag))


# -- cell 63
def pipeline_stage(comm, ops: list, microbatches: int, chunks: int, op_seconds: list, works: list):
    """Rank program of one pipeline stage: run the ops of ops[comm.rank] in order.

    F receives its input from the stage holding the previous piece of the model (none for the
    first piece), computes, and sends its output to the stage holding the next piece. B
    receives the gradient of its output from the next piece (the last piece starts from the
    loss), computes, and sends the gradient of its input back. W only computes. Each op is
    charged op_seconds[stage][kind] with comm.compute; the real computation, if any, is done
    by works[stage] (forward(op, x), backward(op, grad), weight(op), done()). Piece s of the
    p·v pieces lives on stage s mod p, as chunk s // p. Returns (timeline, works[stage].done()):
    the timeline lists an OpSpan per op, read from the engine's clock (comm.now()).
    """
    stage, stages = comm.rank, comm.size
    last_piece = stages * chunks - 1
    work = works[stage]
    local = {}
    timeline = []
    for op in ops[stage]:
        piece = op.chunk * stages + stage
        received = None
        if op.kind == "F" and piece > 0:
            tag = _message_tag("F", op.microbatch, piece, microbatches)
            received = yield from _receive(comm, local, (piece - 1) % stages, tag)
        elif op.kind == "B" and piece < last_piece:
            tag = _message_tag("B", op.microbatch, piece, microbatches)
            received = yield from _receive(comm, local, (piece + 1) % stages, tag)
        start = yield comm.now()
        yield comm.compute(op_seconds[stage][op.kind])
        if op.kind == "F":
            result = work.forward(op, received)
        elif op.kind == "B":
            result = work.backward(op, received)
        else:
            result = work.weight(op)
        end = yield comm.now()
        timeline.append(OpSpan(op, start, end))
        if op.kind == "F" and piece < last_piece:
            tag = _message_tag("F", op.microbatch, piece + 1, microbatches)
            yield from _send(comm, local, (piece + 1) % stages, tag, result)
        elif op.kind == "B" and piece > 0:
            tag = _message_tag("B", op.microbatch, piece - 1, microbatches)
            yield from _send(comm, local, (piece - 1) % stages, tag, result)
    return timeline, work.done()


# -- cell 64
class PlaceholderWork:
    """A stage's work when only time matters: activations and gradients are SizeOnly
    placeholders of `message_nbytes` bytes, the size the network charges for."""

    def __init__(self, message_nbytes: int = 0):
        self.payload = SizeOnly(message_nbytes)

    def forward(self, op, x):
        return self.payload

    def backward(self, op, grad):
        return self.payload

    def weight(self, op):
        return None

    def done(self):
        return None


# -- cell 66
def inflight_peaks(timeline: list) -> list:
    """Per stage, the most (micro-batch, chunk) pairs whose activations the stage held at once,
    counted along the timeline (each stage's OpSpans in the order it ran them): held from the
    end of F until the end of B — or of W on a stage that runs W ops, since W still needs the
    stage's inputs."""
    peaks = []
    for spans in timeline:
        releases_at = "W" if any(span.op.kind == "W" for span in spans) else "B"
        held, peak = set(), 0
        for span in spans:
            key = (span.op.microbatch, span.op.chunk)
            if span.op.kind == "F":
                held.add(key)
                peak = max(peak, len(held))
            elif span.op.kind == releases_at:
                held.discard(key)
        peaks.append(peak)
    return peaks


@dataclass
class PipelineRun:
    """A schedule as it ran. Everything here is measured from `timeline` (per stage, its
    OpSpans in the order it ran them; seconds): `makespan` is the last op's end (all stages
    start at 0), `busy[i]` stage i's seconds of computing, `idle[i]` = makespan − busy[i],
    `bubble_fraction` = Σ idle / (p · makespan) (the GPipe definition: idle ÷ total stage
    time), `bubble_over_ideal` = Σ idle / Σ busy (Megatron's and zero-bubble's ratio), and
    `peak_inflight[i]` from inflight_peaks(timeline). `result` is the engine's RunResult (trace)."""
    name: str
    stages: int
    microbatches: int
    chunks: int
    timeline: list
    makespan: float
    busy: list
    idle: list
    bubble_fraction: float
    bubble_over_ideal: float
    peak_inflight: list
    result: object = field(repr=False, default=None)

    @classmethod
    def from_timeline(cls, name, stages, microbatches, chunks, timeline, result=None):
        makespan = max(span.end for spans in timeline for span in spans)
        busy = [sum(span.end - span.start for span in spans) for spans in timeline]
        idle = [makespan - seconds for seconds in busy]
        total = stages * makespan
        bubble_fraction = sum(idle) / total if total > 0 else 0.0
        bubble_over_ideal = sum(idle) / sum(busy) if sum(busy) > 0 else 0.0
        return cls(name, stages, microbatches, chunks, timeline, makespan, busy, idle,
                   bubble_fraction, bubble_over_ideal, inflight_peaks(timeline), result)


# -- cell 67
def _per_stage(name: str, value, stages: int) -> list:
    """A time per stage: one number for all, or a list of one per stage; finite and ≥ 0 s."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        values = [float(value)] * stages
    else:
        values = [float(v) for v in value]
        if len(values) != stages:
            raise ValueError(f"{name} must be one number or a list of {stages} (one per stage), "
                             f"got {len(values)} values")
    for v in values:
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be finite and ≥ 0 seconds, got {v}")
    return values


def _op_seconds(stages, chunks, t_forward, t_backward, t_weight, split: bool) -> list:
    """Seconds per op kind on each stage. A chunk does 1/v of its stage's work. With a split
    backward, t_backward = t_B + t_W (default t_W = t_backward / 2)."""
    forward = _per_stage("t_forward", t_forward, stages)
    backward = _per_stage("t_backward", t_backward, stages)
    if t_weight is not None and not split:
        raise ValueError("t_weight is the W part of a split backward; only a schedule with W "
                         "ops (zb-h1) takes it")
    weight = [b / 2 for b in backward] if t_weight is None else _per_stage("t_weight", t_weight,
                                                                            stages)
    table = []
    for stage in range(stages):
        if weight[stage] > backward[stage]:
            raise ValueError(f"t_weight ({weight[stage]} s on stage {stage}) is part of "
                             f"t_backward ({backward[stage]} s) and cannot exceed it")
        seconds = {"F": forward[stage] / chunks, "B": backward[stage] / chunks}
        if split:
            seconds["B"] = (backward[stage] - weight[stage]) / chunks
            seconds["W"] = weight[stage] / chunks
        table.append(seconds)
    return table


def _resolve(name, stages, microbatches, chunks):
    """(label, ops) for a schedule name, or for a custom schedule given as op lists."""
    if isinstance(name, str):
        return name, schedule(name, stages, microbatches, chunks)
    ops = [list(stage_ops) for stage_ops in name]
    if len(ops) != _count("stages", stages):
        raise ValueError(f"the custom schedule has {len(ops)} stage lists but stages = {stages}")
    check_schedule(ops, microbatches, chunks)
    return "custom", ops


# -- cell 68
def _run_pipeline(label, ops, microbatches, chunks, t_forward, t_backward, t_weight, works,
                  engine, network) -> PipelineRun:
    """Run the resolved schedule `ops` with one rank per stage and measure it."""
    stages = len(ops)
    split = any(op.kind == "W" for stage_ops in ops for op in stage_ops)
    op_seconds = _op_seconds(stages, chunks, t_forward, t_backward, t_weight, split)
    result = run(pipeline_stage, stages, engine=engine, network=network,
                 args=(ops, microbatches, chunks, op_seconds, works))
    timeline = [value[0] for value in result.values]
    return PipelineRun.from_timeline(label, stages, microbatches, chunks, timeline, result)


def simulate(name: str | list, stages: int, microbatches: int, t_forward: float | list,
             t_backward: float | list, chunks: int = 1, t_weight: float | list | None = None,
             t_comm: float = 0.0, network=None, message_nbytes: int = 0) -> PipelineRun:
    """Run a schedule on the simulator, one rank per stage, and measure it (PipelineRun).

    name: "gpipe", "1f1b", "interleaved", "zb-h1", or a custom schedule (one list of Op per
    stage, checked by check_schedule). t_forward, t_backward: seconds of one micro-batch's
    forward / whole backward on a stage — one number, or a list with one per stage; with v
    chunks each chunk takes 1/v. t_weight (zb-h1 only): the W part of t_backward (default
    half). Messages between stages are free unless t_comm (seconds per message, an α–β network
    with α = t_comm, β = 0) or a `network` model with `message_nbytes` per message is given.
    A send holds the sending stage until the message has left (the simulator's eager send),
    so communication time lands on the critical path.
    """
    stages = _count("stages", stages)
    t_comm = float(t_comm)
    if not (t_comm >= 0 and math.isfinite(t_comm)):
        raise ValueError(f"t_comm must be finite and ≥ 0 seconds, got {t_comm}")
    if network is not None and t_comm != 0:
        raise ValueError("give either t_comm or a network model, not both")
    if network is None:
        network = AlphaBeta(alpha=t_comm, beta=0.0)
    label, ops = _resolve(name, stages, microbatches, chunks)
    works = [PlaceholderWork(message_nbytes) for _ in range(stages)]
    return _run_pipeline(label, ops, microbatches, chunks, t_forward, t_backward, t_weight,
                         works, "sim", network)


# -- cell 73
import numpy as np

from dsml.train.models import LOSSES, activate, activation_derivative


def split_layers(layers: int, pieces: int) -> list:
    """Cut `layers` consecutive layers into `pieces` runs (as np.array_split cuts: the first
    layers mod pieces runs get one layer more): a list of range objects."""
    layers, pieces = _count("layers", layers), _count("pieces", pieces)
    if layers < pieces:
        raise ValueError(f"the model has {layers} layers, fewer than the {pieces} pipeline "
                         f"pieces (stages × chunks); every piece needs at least one layer")
    base, extra = divmod(layers, pieces)
    runs, first = [], 0
    for piece in range(pieces):
        size = base + (1 if piece < extra else 0)
        runs.append(range(first, first + size))
        first += size
    return runs


# -- cell 74
def piece_forward(model, layers, h):
    """A piece's layers of `model` (a dsml.train.MLP) on input h: (each layer's input, each
    layer's pre-activation, the output — the last layer of the model has no activation)."""
    kept_inputs, pre_activations = [], []
    for layer in layers:
        kept_inputs.append(h)
        z = h @ model.params[f"layer{layer}.weight"] + model.params[f"layer{layer}.bias"]
        pre_activations.append(z)
        h = z if layer == model.layers - 1 else activate(z, model.activation)
    return kept_inputs, pre_activations, h


def piece_backward(model, layers, pre_activations, g):
    """From the gradient g of a piece's output: (each layer's dz, the gradient of the piece's
    input, which the first piece does not need: its input is the data)."""
    dz = [None] * len(layers)
    for position in reversed(range(len(layers))):
        layer = layers[position]
        if layer < model.layers - 1:
            g = g * activation_derivative(pre_activations[position], model.activation)
        dz[position] = g
        if layer > 0:                                 # the model's input needs no gradient
            g = g @ model.params[f"layer{layer}.weight"].T
    return dz, g


def accumulate_weight_grads(grads, layers, kept_inputs, dz) -> None:
    """Add each layer's weight gradient X_lᵀ·dz_l and bias gradient Σ dz_l into `grads`
    (names absent from `grads` are frozen)."""
    for layer, x, g in zip(layers, kept_inputs, dz):
        weight, bias = f"layer{layer}.weight", f"layer{layer}.bias"
        if weight in grads:
            grads[weight] += x.T @ g
        if bias in grads:
            grads[bias] += g.sum(axis=0)


# -- cell 75
class MLPStageWork:
    """The real computation of one stage of a dsml.train.MLP cut into pipeline pieces.

    Piece s (layers pieces[s]) lives on stage s mod p. F runs the piece's layers on one
    micro-batch and keeps their inputs and pre-activations; on the last piece it also takes
    the loss, weighted by the micro-batch's share of the batch (n_k / N), so that the summed
    gradients are those of the full batch's mean loss. B turns the gradient of the piece's
    output into each layer's dz and the piece's input gradient; without a split it also adds
    the weight gradients and frees the micro-batch, with one (W ops in the schedule) W does
    that later. `held` maps (micro-batch, chunk) to what B or W still needs; `peak_held` counts
    the most held at once; `loss` is this stage's part of the batch loss (last piece only)."""

    def __init__(self, model, pieces, stage, stages, inputs, targets, shares, loss, split):
        self.model, self.pieces, self.stage, self.stages = model, pieces, stage, stages
        self.inputs, self.targets, self.shares = inputs, targets, shares
        self.loss_fn, self.split = LOSSES[loss], split
        self.held, self.peak_held, self.loss = {}, 0, 0.0
        self.grads = {name: np.zeros_like(model.params[name])
                      for piece in range(stage, len(pieces), stages)
                      for layer in pieces[piece]
                      for name in (f"layer{layer}.weight", f"layer{layer}.bias")
                      if name not in model.frozen}

    def _piece(self, op):           # (piece index, its layers): chunk c of stage i is c·p + i
        return op.chunk * self.stages + self.stage, self.pieces[op.chunk * self.stages + self.stage]

    def forward(self, op, x):
        piece, layers = self._piece(op)
        h = self.inputs[op.microbatch] if piece == 0 else x
        kept_inputs, pre_activations, h = piece_forward(self.model, layers, h)
        output_grad = None
        if piece == len(self.pieces) - 1:
            value, output_grad = self.loss_fn(h, self.targets[op.microbatch])
            share = self.shares[op.microbatch]
            self.loss, output_grad = self.loss + share * value, share * output_grad
            h = None                                  # nothing to send: the loss is here
        self.held[(op.microbatch, op.chunk)] = (kept_inputs, pre_activations, output_grad)
        self.peak_held = max(self.peak_held, len(self.held))
        return h

    def backward(self, op, grad):
        piece, layers = self._piece(op)
        kept_inputs, pre_activations, output_grad = self.held[(op.microbatch, op.chunk)]
        dz, g = piece_backward(self.model, layers, pre_activations,
                               output_grad if grad is None else grad)
        if self.split:
            self.held[(op.microbatch, op.chunk)] = (kept_inputs, dz)
        else:
            accumulate_weight_grads(self.grads, layers, kept_inputs, dz)
            del self.held[(op.microbatch, op.chunk)]
        return g if piece > 0 else None

    def weight(self, op):
        piece, layers = self._piece(op)
        kept_inputs, dz = self.held.pop((op.microbatch, op.chunk))
        accumulate_weight_grads(self.grads, layers, kept_inputs, dz)

    def done(self):
        return {"loss": self.loss, "grads": self.grads, "peak_held": self.peak_held}


# -- cell 76
class PipelineGradients(NamedTuple):
    """What pipeline_gradients returns: the batch's mean loss, the gradients (name → array,
    in the model's parameter order), the most (micro-batch, chunk) pairs each stage actually
    held, and the run (PipelineRun: timeline, bubble, trace)."""
    loss: float
    grads: dict
    peak_held: list
    run: PipelineRun


def pipeline_gradients(model, X, y, name: str | list, stages: int, microbatches: int,
                       chunks: int = 1, loss: str = "cross_entropy", engine: str = "sim",
                       t_forward: float | list = 1e-3, t_backward: float | list = 2e-3,
                       t_weight: float | list | None = None) -> PipelineGradients:
    """Train-step gradients of `model` (a dsml.train.MLP) on the batch (X, y), computed by
    running a pipeline schedule for real: the MLP is cut into stages × chunks pieces of
    consecutive layers (split_layers), each stage a rank of dsml.run (engine "sim" or
    "threads") that runs its ops in the schedule's order and sends real activations and
    gradients. The batch is cut into `microbatches` micro-batches as np.array_split cuts it,
    each loss weighted by its share, so the result equals the unpipelined
    loss_and_grads(model, X, y) up to the order of floating-point sums. t_forward etc. price
    the ops on the simulator as in simulate()."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    if engine not in ("sim", "threads"):
        raise ValueError(f"engine must be 'sim' or 'threads', got {engine!r}")
    stages, microbatches = _count("stages", stages), _count("microbatches", microbatches)
    chunks = _count("chunks", chunks)
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y)
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} rows but y has {len(y)}")
    if len(X) < microbatches:
        raise ValueError(f"a batch of {len(X)} examples cannot make {microbatches} non-empty "
                         f"micro-batches")
    pieces = split_layers(model.layers, stages * chunks)
    label, ops = _resolve(name, stages, microbatches, chunks)
    split = any(op.kind == "W" for stage_ops in ops for op in stage_ops)
    rows = np.array_split(np.arange(len(X)), microbatches)
    inputs, targets = [X[r] for r in rows], [y[r] for r in rows]
    shares = [len(r) / len(X) for r in rows]
    works = [MLPStageWork(model, pieces, stage, stages, inputs, targets, shares, loss, split)
             for stage in range(stages)]
    network = AlphaBeta(alpha=0.0, beta=0.0) if engine == "sim" else None
    pipeline_run = _run_pipeline(label, ops, microbatches, chunks, t_forward, t_backward,
                                 t_weight, works, engine, network)
    outcomes = [value[1] for value in pipeline_run.result.values]
    merged = {}
    for outcome in outcomes:
        merged.update(outcome["grads"])
    grads = {param: merged[param] for param in model.params if param in merged}
    total_loss = sum(outcome["loss"] for outcome in outcomes)
    return PipelineGradients(total_loss, grads, [o["peak_held"] for o in outcomes], pipeline_run)
