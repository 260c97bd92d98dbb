"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 103
import numbers

import numpy as np

ZERO_STAGES = (0, 1, 2, 3)


def check_zero_stage(stage) -> int:
    """The ZeRO stage as an int, or a ValueError saying what is valid."""
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) \
            or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of 0, 1, 2, 3 (0 = plain data parallel), "
                         f"got {stage!r}")
    return int(stage)


def _check_zero_sizes(n_params, world_size, **byte_counts):
    if isinstance(n_params, bool) or not isinstance(n_params, numbers.Integral) or n_params < 0:
        raise ValueError(f"n_params must be an integer ≥ 0, got {n_params!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) \
            or world_size < 1:
        raise ValueError(f"world_size must be an integer ≥ 1, got {world_size!r}")
    for name, value in byte_counts.items():
        if not value >= 0:
            raise ValueError(f"{name} must be ≥ 0 bytes per parameter, got {value!r}")


def zero_memory_formula(stage: int, n_params: int, world_size: int, param_bytes: float = 2,
                        grad_bytes: float = 2, optimizer_bytes: float = 12) -> dict:
    """Model-state bytes per rank under ZeRO (Rajbhandari et al. 2020, Figure 1), by category.

    Ψ = n_params, N_d = world_size; per parameter `param_bytes` (2: fp16), `grad_bytes` (2) and
    `optimizer_bytes` K (12 for mixed-precision Adam: fp32 master copy, m and v). Stage 0 (plain
    data parallel) holds (2 + 2 + K)Ψ; stage 1 shards the optimizer state: 4Ψ + KΨ/N_d; stage 2
    the gradients too: 2Ψ + (2 + K)Ψ/N_d; stage 3 the parameters too: (2 + 2 + K)Ψ/N_d.
    Returns {"params", "grads", "optimizer"} in bytes (floats: Ψ/N_d need not be whole).
    Buffers (gathered layers, gradient buckets) and activations are not in the formula."""
    stage = check_zero_stage(stage)
    _check_zero_sizes(n_params, world_size, param_bytes=param_bytes, grad_bytes=grad_bytes,
                 optimizer_bytes=optimizer_bytes)
    shard = n_params / world_size
    return {"params": param_bytes * (shard if stage >= 3 else n_params),
            "grads": grad_bytes * (shard if stage >= 2 else n_params),
            "optimizer": optimizer_bytes * (shard if stage >= 1 else n_params)}


# -- cell 104
def zero_comm_formula(stage: int, n_params: int, world_size: int, param_bytes: float = 2,
                      grad_bytes: float = 2) -> float:
    """Bytes each rank sends per training step with ring collectives (week 2), Ψ = n_params.

    A ring reduce-scatter or all-gather of n bytes sends (N−1)/N·n from every rank. Stage 0
    all-reduces the gradients (= reduce-scatter + all-gather): 2(N−1)/N·Ψ·grad_bytes. Stages 1
    and 2 reduce-scatter the gradients and all-gather the updated parameters: (N−1)/N·Ψ·
    (grad_bytes + param_bytes) — ZeRO's "2Ψ, like plain data parallel". Stage 3 all-gathers
    the parameters twice (forward and backward): (N−1)/N·Ψ·(grad_bytes + 2·param_bytes), the
    "3Ψ, 1.5×". Exact when every layer's Ψ_l is divisible by N; otherwise ranks differ."""
    stage = check_zero_stage(stage)
    _check_zero_sizes(n_params, world_size, param_bytes=param_bytes, grad_bytes=grad_bytes)
    share = (world_size - 1) / world_size * n_params
    if stage == 0:
        return 2 * share * grad_bytes
    if stage in (1, 2):
        return share * (grad_bytes + param_bytes)
    return share * (grad_bytes + 2 * param_bytes)


# -- cell 109
from dataclasses import dataclass

from dsml.data_parallel import flatten
from dsml.train.models import activate, activation_derivative


@dataclass(frozen=True)
class StatePrecision:
    """How a rank stores model state. `param`: dtype of the weights forward and backward read
    (and all-gathers send); `grad`: dtype of gradients (and reduce-scatters send); `master`: the
    optimizer's own copy of the weights (mixed precision's fp32 master), or None when the
    optimizer updates the weights themselves; `loss_scale`: gradients are multiplied by it
    before they are rounded to `grad` and divided by it in the optimizer (a power of two, so
    both are exact unless a value over- or underflows)."""
    param: type
    grad: type
    master: type | None
    loss_scale: float


STATE_PRECISIONS = {
    # ZeRO's setting: fp16 weights and gradients, fp32 master weights and Adam moments (K = 12).
    "mixed": StatePrecision(np.float16, np.float16, np.float32, 1024.0),
    # Everything in float64, as week 3 trains: no master copy, Adam moments in fp64 (K = 16).
    "fp64": StatePrecision(np.float64, np.float64, None, 1.0),
}

# Arrays of optimizer state per parameter. Only elementwise optimizers shard: LARS and LAMB
# need each whole tensor's norm, which no rank holds once the tensor is cut into pieces.
SHARDABLE_OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}


def check_state_precision(precision: str) -> StatePrecision:
    if precision not in STATE_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of "
                         f"{', '.join(STATE_PRECISIONS)}")
    return STATE_PRECISIONS[precision]


def check_elementwise_optimizer(optimizer: str) -> str:
    if optimizer not in SHARDABLE_OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r} cannot be sharded elementwise here; choose "
                         f"one of {', '.join(SHARDABLE_OPTIMIZERS)} (LARS and LAMB need "
                         f"whole-tensor norms)")
    return optimizer


def state_bytes_per_parameter(precision: str = "mixed", optimizer: str = "adam") -> tuple:
    """(param bytes, gradient bytes, optimizer bytes K) per parameter: (2, 2, 12) for mixed
    precision with Adam (fp32 master + m + v), (8, 8, 16) for fp64 with Adam."""
    spec = check_state_precision(precision)
    states = SHARDABLE_OPTIMIZERS[check_elementwise_optimizer(optimizer)]
    kept = spec.param if spec.master is None else spec.master
    master = 0 if spec.master is None else np.dtype(spec.master).itemsize
    return (np.dtype(spec.param).itemsize, np.dtype(spec.grad).itemsize,
            master + states * np.dtype(kept).itemsize)


# -- cell 110
def fsdp_units(model) -> list:
    """The sharding units, one per layer as FSDP wraps them: [(unit name, layout), …] in
    forward order, where layout [(parameter name, shape), …] is week 3's flatten layout of
    the layer's weight (in, out) then bias (out,)."""
    units = []
    for i in range(len(model.sizes) - 1):
        names = (f"layer{i}.weight", f"layer{i}.bias")
        units.append((f"layer{i}", [(name, model.params[name].shape) for name in names]))
    return units


def fsdp_unit_vector(model, layout):
    """A layer's weight and bias as one flat float64 vector (week 3's flatten)."""
    return flatten({name: model.params[name] for name, _ in layout})[0]


def mlp_layer_forward(h, weight, bias, activation, last: bool):
    """One layer of dsml.train.MLP.forward, from weights of any float dtype computed in float64:
    (pre-activation z = h W + b, output). Bit for bit what MLP.forward does in float64."""
    z = h @ np.asarray(weight, dtype=np.float64) + np.asarray(bias, dtype=np.float64)
    return z, (z if last else activate(z, activation))


def mlp_layer_backward(g, inputs, pre, weight, activation, last: bool, first: bool):
    """One layer of MLP.backward_layers: from dL/d(output) `g`, the layer's input and
    pre-activation, return (dL/dW, dL/db, dL/d(input) or None for the first layer)."""
    if not last:
        g = g * activation_derivative(pre, activation)
    grad_weight = inputs.T @ g
    grad_bias = g.sum(axis=0)
    grad_input = None if first else g @ np.asarray(weight, dtype=np.float64).T
    return grad_weight, grad_bias, grad_input


# -- cell 114
LEDGER_CATEGORIES = ("params", "grads", "optimizer", "buffers")


class MemoryLedger:
    """Bytes a rank holds, by category, summed from the `.nbytes` of the arrays it registers.

    `hold(key, category, arrays)` records (or replaces) an entry, `free(key)` drops it. The ledger
    never computes a size from a formula: it is told the arrays themselves. It keeps the running
    total, the peak and the breakdown at the peak (the first time the peak was reached), and a
    history of (event, total bytes) for plotting. Categories: params (what forward and backward
    read), grads, optimizer (master copy + optimizer state), buffers (gathered layers, gradient
    buckets). Activations and NumPy temporaries are not registered (see the notebook)."""

    def __init__(self):
        self.entries = {}                     # key -> (category, bytes)
        self.now = dict.fromkeys(LEDGER_CATEGORIES, 0)
        self.peak = 0
        self.at_peak = dict(self.now)
        self.history = []                     # (event, total bytes) after every change
        self.gathered_peak = 0                # most bytes held at once in "gathered …" entries

    @property
    def total(self) -> int:
        return sum(self.now.values())

    def hold(self, key: str, category: str, arrays) -> None:
        if category not in LEDGER_CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(LEDGER_CATEGORIES)}, "
                             f"got {category!r}")
        if key in self.entries:
            self.free(key, record=False)
        nbytes = sum(int(array.nbytes) for array in arrays)
        self.entries[key] = (category, nbytes)
        self.now[category] += nbytes
        self._record(f"hold {key}")

    def free(self, key: str, record: bool = True) -> None:
        if key not in self.entries:
            raise KeyError(f"free({key!r}): nothing is held under that key")
        category, nbytes = self.entries.pop(key)
        self.now[category] -= nbytes
        if record:
            self._record(f"free {key}")

    def _record(self, event: str) -> None:
        total = self.total
        self.history.append((event, total))
        gathered = sum(b for k, (_, b) in self.entries.items() if k.startswith("gathered "))
        self.gathered_peak = max(self.gathered_peak, gathered)
        if total > self.peak:
            self.peak, self.at_peak = total, dict(self.now)

    def report(self) -> dict:
        """{"peak": bytes, "at_peak": {category: bytes}, "now": {category: bytes},
        "gathered_peak": bytes of gathered layers held at once, at most}."""
        return {"peak": self.peak, "at_peak": dict(self.at_peak), "now": dict(self.now),
                "gathered_peak": self.gathered_peak}


# -- cell 116
from dsml.collectives import allreduce, reduce_scatter
from dsml.collectives.allgather import allgather_ring_blocks
from dsml.collectives.buffers import block_sizes, split
from dsml.data_parallel import my_shard, shard_bounds, unflatten
from dsml.train.models import LOSSES
from dsml.train.optim import make_optimizer


def allgather_pieces(comm, full):
    """Ring all-gather in place: `full` (1-D) holds this rank's piece — cut as np.array_split
    cuts it, so pieces may differ by one element — and afterwards holds every rank's."""
    sizes = block_sizes(len(full), comm.size)
    pieces = split(full, sizes)                 # views of full: received pieces land in place
    yield from allgather_ring_blocks(comm, pieces[comm.rank], comm.rank, sizes, into=pieces)
    return full


def fsdp_gather_unit(comm, ledger, name, piece, size):
    """Stage 3: a new buffer holding layer `name`'s whole flat weights, gathered from every
    rank's piece; registered in the ledger as a buffer until the caller frees it."""
    full = np.empty(size, dtype=piece.dtype)
    ledger.hold(f"gathered {name}", "buffers", [full])
    start, stop = shard_bounds(size, comm.size, comm.rank)
    full[start:stop] = piece
    return (yield from allgather_pieces(comm, full))


def fsdp_unit_forward(h, weights, layout, activation, last: bool):
    """mlp_layer_forward of one unit, given its flat weights (weight then bias)."""
    weight, bias = unflatten(weights, layout).values()
    return mlp_layer_forward(h, weight, bias, activation, last)


def optimizer_state_arrays(optimizer) -> list:
    """The arrays an optimizer keeps (Adam: m and v per name; momentum: the velocity)."""
    arrays = []
    for state in optimizer.state.values():
        for item in (state if isinstance(state, tuple) else (state,)):
            if isinstance(item, np.ndarray):
                arrays.append(item)
    return arrays


# -- cell 117
def check_zero_arguments(stage, model, X, y, optimizer, precision, loss,
                         prefetch=False) -> int:
    """Every argument of zero_data_parallel that can be checked before training: the stage as
    an int, or a ValueError naming the argument, its value and what is valid."""
    stage = check_zero_stage(stage)
    if prefetch not in (True, False):
        raise ValueError(f"prefetch must be True or False, got {prefetch!r}")
    if prefetch and stage != 3:
        raise ValueError(f"prefetch=True needs stage 3 (only stage 3 gathers weights), "
                         f"got stage {stage}")
    check_state_precision(precision)
    check_elementwise_optimizer(optimizer)
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    if getattr(model, "frozen", None):
        raise ValueError(f"ZeRO here shards and updates every parameter; unfreeze "
                         f"{sorted(model.frozen)} (frozen parameters are not supported)")
    shape = np.shape(X)
    if len(shape) != 2 or shape[1] != model.sizes[0]:
        raise ValueError(f"X must have shape (examples, {model.sizes[0]}) for this model, "
                         f"got {shape}")
    if len(y) != shape[0]:
        raise ValueError(f"y must have one label per row of X: {shape[0]} rows, "
                         f"{len(y)} labels")
    return stage


# -- cell 118
from types import SimpleNamespace


def _zero_state(comm, stage, model, spec, ledger) -> SimpleNamespace:
    """What a rank keeps between steps under ZeRO `stage`: for every unit (layer) its size, this
    rank's piece, the weights (whole, or the piece in stage 3), the optimizer's master copy
    (whole in stage 0, else the piece), the gradient buffer (whole in stages 0–1, else the
    piece), and `updated` — what the optimizer updates in place. Registered with `ledger`."""
    units = fsdp_units(model)
    size, piece, params, master, grads = {}, {}, {}, {}, {}
    for name, layout in units:
        initial = fsdp_unit_vector(model, layout)
        size[name] = len(initial)
        piece[name] = shard_bounds(len(initial), comm.size, comm.rank)
        start, stop = piece[name]
        params[name] = (initial[start:stop] if stage == 3 else initial).astype(spec.param)
        if spec.master is not None:
            master[name] = (initial if stage == 0 else initial[start:stop]).astype(spec.master)
        grads[name] = np.zeros(size[name] if stage <= 1 else stop - start, dtype=spec.grad)
    ledger.hold("params", "params", params.values())
    ledger.hold("grads", "grads", grads.values())
    ledger.hold("optimizer", "optimizer", master.values())
    # What the optimizer updates in place: the master copy, or this rank's part of the weights.
    updated = {}
    for name, _ in units:
        start, stop = piece[name]
        if master:
            updated[name] = master[name]
        else:
            updated[name] = params[name][start:stop] if stage in (1, 2) else params[name]
    return SimpleNamespace(units=units, size=size, piece=piece, params=params, master=master,
                           grads=grads, updated=updated, ledger=ledger, stage=stage)


# -- cell 119
def _unit_weights(comm, state, name):
    """Generator: a unit's whole weights — gathered into a buffer in stage 3, else held."""
    if state.stage == 3:
        return (yield from fsdp_gather_unit(comm, state.ledger, name, state.params[name],
                                            state.size[name]))
    return state.params[name]


def _release(state, name) -> None:
    """Stage 3 frees a unit's gathered buffer as soon as the pass is done with it."""
    if state.stage == 3:
        state.ledger.free(f"gathered {name}")


def _prefetch(comm, state, i, prefetch):
    """Generator: with `prefetch`, start all-gathering unit i on a second activity of this rank
    and answer its handle at once; None when not prefetching or past either end."""
    if prefetch and 0 <= i < len(state.units):
        return (yield comm.spawn(_unit_weights(comm, state, state.units[i][0])))
    return None


def _wait(comm, ahead):
    """Generator: the weights the activity `ahead` gathered (None for no activity)."""
    return None if ahead is None else (yield comm.join(ahead))


def _zero_forward(comm, state, model, X, y, shard, loss, seconds_per_flop, prefetch=False):
    """Generator: the forward pass of this rank's shard, layer by layer (stage 3 gathers each
    layer just before it is used — or, with `prefetch`, during the layer before's compute).
    Returns (inputs, pre-activations, dL/d output, loss sum)."""
    examples, last_layer = len(shard), len(state.units) - 1
    h = np.asarray(X[shard], dtype=np.float64)
    inputs, pre, fetched = [], [], None
    for i, (name, layout) in enumerate(state.units):
        weights = fetched if fetched is not None else (yield from _unit_weights(comm, state,
                                                                                name))
        ahead = yield from _prefetch(comm, state, i + 1, prefetch)
        if examples:
            inputs.append(h)
            z, h = fsdp_unit_forward(h, weights, layout, model.activation, i == last_layer)
            pre.append(z)
            if seconds_per_flop:
                yield comm.compute(2 * examples * inputs[i].shape[1] * z.shape[1]
                                   * seconds_per_flop)
        _release(state, name)
        del weights                               # stage 3: the gathered buffer is gone
        fetched = yield from _wait(comm, ahead)   # the next layer's weights, if prefetched
    if not examples:
        return inputs, pre, None, 0.0
    value, g = LOSSES[loss](h, np.asarray(y)[shard])
    return inputs, pre, g, value * examples


# -- cell 120
def _zero_backward(comm, state, model, spec, inputs, pre, g, examples, factor,
                   seconds_per_flop, prefetch=False):
    """Generator: the backward pass, last layer first; each layer's gradient, scaled by
    `factor`, is reduced the moment it exists — all-reduced (stage 0), reduce-scattered into the
    whole buffer (stage 1) or out of a bucket freed at once (stages 2–3). With `prefetch`, the
    layer below is gathered during this layer's compute, and waited for before the reduction."""
    stage, last_layer, fetched = state.stage, len(state.units) - 1, None
    for i in reversed(range(len(state.units))):
        name, layout = state.units[i]
        weights = fetched if fetched is not None else (yield from _unit_weights(comm, state,
                                                                                name))
        ahead = yield from _prefetch(comm, state, i - 1, prefetch)
        if stage <= 1:
            bucket = state.grads[name]            # the full-size gradient buffer
        else:
            bucket = np.empty(state.size[name], dtype=spec.grad)
            state.ledger.hold(f"bucket {name}", "buffers", [bucket])
        if examples:
            grad_weight, grad_bias, g = mlp_layer_backward(
                g, inputs[i], pre[i], unflatten(weights, layout)[f"{name}.weight"],
                model.activation, i == last_layer, i == 0)
            bucket[:grad_weight.size] = grad_weight.ravel() * factor
            bucket[grad_weight.size:] = grad_bias * factor
            if seconds_per_flop:
                yield comm.compute(4 * examples * grad_weight.size * seconds_per_flop)
        else:
            bucket[...] = 0                       # an empty shard adds nothing to the sums
        _release(state, name)
        del weights
        fetched = yield from _wait(comm, ahead)   # one collective at a time on this rank
        if stage == 0:
            state.grads[name][...] = yield from allreduce(comm, bucket, algorithm="ring")
        else:
            mine = yield from reduce_scatter(comm, bucket, algorithm="ring")
            if stage == 1:
                start, stop = state.piece[name]
                state.grads[name][start:stop] = mine
            else:
                state.grads[name][...] = mine
                state.ledger.free(f"bucket {name}")
                del bucket


# -- cell 121
def _zero_update(comm, state, opt, spec, step):
    """Generator: the optimizer step on what this rank owns, unscaled in the optimizer's
    precision; then the new weights in the forward precision, all-gathered in stages 1–2."""
    stage, owned = state.stage, {}
    for name, _ in state.units:
        start, stop = state.piece[name]
        gradient = state.grads[name][start:stop] if stage == 1 else state.grads[name]
        owned[name] = gradient.astype(state.updated[name].dtype) / spec.loss_scale
        if not np.all(np.isfinite(owned[name])):
            raise FloatingPointError(f"rank {comm.rank}, step {step}: non-finite gradient "
                                     f"in {name} (an fp16 overflow? lower the loss scale)")
    opt.step(state.updated, owned)
    state.ledger.hold("optimizer", "optimizer", list(state.master.values())
                      + optimizer_state_arrays(opt))
    for name, _ in state.units:
        start, stop = state.piece[name]
        if state.master:
            if stage in (1, 2):
                state.params[name][start:stop] = state.master[name]
            else:
                state.params[name][...] = state.master[name]
        if stage in (1, 2):
            yield from allgather_pieces(comm, state.params[name])


# -- cell 122
def zero_data_parallel(comm, stage, model, X, y, batches, optimizer="adam", lr=1e-3,
                       precision="mixed", loss="cross_entropy", seconds_per_flop: float = 0.0,
                       prefetch: bool = False, **hyper):
    """Rank program (run it with dsml.run): data-parallel training of `model` (a dsml.train.MLP,
    only read: it supplies the architecture and initial weights) under ZeRO `stage`.

    Each rank takes its np.array_split share of every global batch (index arrays, the same on
    every rank). Every layer is a unit whose flat weights are cut into N_d pieces as
    np.array_split cuts them; rank r owns piece r of every unit.
    - stage 0: plain data parallel: full weights, gradients and optimizer state everywhere;
      each layer's gradient is all-reduced (ring) as backward produces it.
    - stage 1: the optimizer state (with the master weights) is sharded: each layer's gradient is
      reduce-scattered into the full-size gradient buffer, each rank updates its pieces, and
      the new weights are all-gathered.
    - stage 2: gradients sharded too: a layer's gradient lives in a bucket only until its
      reduce-scatter, then only this rank's piece is kept.
    - stage 3 (FSDP): weights sharded too: each layer is all-gathered into a buffer just
      before forward uses it, freed after, gathered again for backward.
    Every stage reduces each element in the same ring order, so the updates are bit-identical.
    `seconds_per_flop` charges simulated compute (2·B·in·out forward, 4·B·in·out backward).
    `prefetch` (stage 3): gather the next layer on a second activity while this one computes.
    Returns {"params": {unit: weights held (full, or the piece in stage 3)}, "master": {unit:
    the optimizer's copy} or None, "loss_sums": [this rank's loss × its examples, per step],
    "memory": MemoryLedger.report()}."""
    stage = check_zero_arguments(stage, model, X, y, optimizer, precision, loss, prefetch)
    spec = check_state_precision(precision)
    state = _zero_state(comm, stage, model, spec, MemoryLedger())
    opt = make_optimizer(optimizer, lr, **hyper)
    loss_sums = []
    for step, batch in enumerate(batches):
        batch, shard = my_shard(comm, step, batch)
        # This shard's share of the batch mean, and the loss scale, applied before rounding.
        factor = len(shard) / len(batch) * spec.loss_scale
        inputs, pre, g, loss_sum = yield from _zero_forward(comm, state, model, X, y, shard,
                                                             loss, seconds_per_flop,
                                                             prefetch)
        loss_sums.append(loss_sum)
        yield from _zero_backward(comm, state, model, spec, inputs, pre, g, len(shard), factor,
                                  seconds_per_flop, prefetch)
        yield from _zero_update(comm, state, opt, spec, step)
    return {"params": state.params, "master": state.master or None, "loss_sums": loss_sums,
            "memory": state.ledger.report()}


# -- cell 124
from dsml.comm.run import run


def trace_bytes_sent(trace, world_size: int) -> np.ndarray:
    """Bytes each rank sent over a run, read from its trace (sends and exchanges): int64 (N,)."""
    sent = np.zeros(world_size, dtype=np.int64)
    for record in trace:
        if record.op in ("send", "sendrecv"):
            sent[record.rank] += record.nbytes
    return sent


@dataclass
class ZeroRun:
    """A ZeRO training run, put back together. `params`: the final weights by parameter name
    (full shapes, in the forward precision); `master`: the optimizer's copy (the weights
    themselves when there is none); `losses`: the mean loss of each global batch; `memory`:
    each rank's MemoryLedger report; `bytes_sent`: bytes each rank sent over the run (from the
    trace) and `bytes_per_step` the same per step; `replicas_agree`: stages 0–2 — every rank
    ends with the same bits (stage 3 keeps no replicas: True)."""
    stage: int
    world_size: int
    params: dict
    master: dict
    losses: list
    memory: list
    bytes_sent: np.ndarray
    bytes_per_step: np.ndarray
    replicas_agree: bool
    time: float
    trace: object


# -- cell 125
def zero_train(stage: int, model, X, y, batches, world_size: int, engine: str = "sim",
               network=None, optimizer: str = "adam", lr: float = 1e-3, precision="mixed",
               loss: str = "cross_entropy", seconds_per_flop: float = 0.0,
               prefetch: bool = False, timeout: float = 120.0, **hyper) -> ZeroRun:
    """Run zero_data_parallel on `world_size` ranks of `engine` (network: the simulator's model)
    and assemble the result (ZeroRun). `model` is only read."""
    stage = check_zero_arguments(stage, model, X, y, optimizer, precision, loss, prefetch)
    if prefetch and engine != "sim":
        raise ValueError(f"prefetch runs on engine 'sim' only (second activities are "
                         f"simulated), got engine {engine!r}")
    batches = list(batches)
    kwargs = dict(optimizer=optimizer, lr=lr, precision=precision, loss=loss,
                  seconds_per_flop=seconds_per_flop, prefetch=prefetch, **hyper)
    result = run(zero_data_parallel, world_size, engine=engine, network=network, trace=True,
                 timeout=timeout, args=(stage, model, X, y, batches), kwargs=kwargs)
    values = result.values
    params, master = {}, {}
    agree = True
    for name, layout in fsdp_units(model):
        if stage == 3:
            full = np.concatenate([v["params"][name] for v in values])
        else:
            full = values[0]["params"][name]
            agree = agree and all(np.array_equal(v["params"][name], full) for v in values)
        params.update(unflatten(full, layout))
        if values[0]["master"] is None:
            master.update(unflatten(full, layout))
        else:
            if stage == 0:
                kept = values[0]["master"][name]
                agree = agree and all(np.array_equal(v["master"][name], kept) for v in values)
            else:
                kept = np.concatenate([v["master"][name] for v in values])
            master.update(unflatten(kept, layout))
    losses = [sum(v["loss_sums"][step] for v in values) / len(batch)
              for step, batch in enumerate(batches)]
    sent = trace_bytes_sent(result.trace, world_size)
    return ZeroRun(stage=stage, world_size=world_size, params=params, master=master,
                   losses=losses, memory=[v["memory"] for v in values], bytes_sent=sent,
                   bytes_per_step=sent / max(len(batches), 1), replicas_agree=agree,
                   time=result.time, trace=result.trace)


# -- cell 148
def fsdp_layer_seconds(model, world_size: int, link, examples: int, seconds_per_flop: float,
                       param_bytes: float = 2, grad_bytes: float = 2) -> dict:
    """α–β seconds of each layer of `model` in a stage-3 step on `world_size` ranks with
    `examples` examples each: {"gather", "scatter", "forward", "backward"}: lists in forward
    order. A ring step costs α + β · (largest piece's bytes); a ring has N_d − 1 steps."""
    if world_size < 1 or examples < 0 or seconds_per_flop < 0:
        raise ValueError(f"need world_size ≥ 1, examples ≥ 0, seconds_per_flop ≥ 0; got "
                         f"{world_size}, {examples}, {seconds_per_flop}")
    seconds = {"gather": [], "scatter": [], "forward": [], "backward": []}
    for fan_in, fan_out in zip(model.sizes[:-1], model.sizes[1:]):
        piece = -(-(fan_in + 1) * fan_out // world_size)           # np.array_split's largest
        for key, nbytes in (("gather", param_bytes), ("scatter", grad_bytes)):
            step = link.alpha + link.beta * piece * nbytes
            seconds[key].append((world_size - 1) * step)
        seconds["forward"].append(2 * examples * fan_in * fan_out * seconds_per_flop)
        seconds["backward"].append(4 * examples * fan_in * fan_out * seconds_per_flop)
    return seconds


def fsdp_step_prediction(seconds: dict, prefetch: bool) -> float:
    """Seconds of one stage-3 step from fsdp_layer_seconds: nothing overlapped, or (prefetch)
    each gather but the first of a pass overlapped with the compute of the layer before it."""
    g, s, f, b = (seconds[key] for key in ("gather", "scatter", "forward", "backward"))
    last = len(g) - 1
    if not prefetch:
        return sum(g) + sum(f) + sum(g) + sum(b) + sum(s)
    forward = g[0] + sum(max(f[i], g[i + 1]) for i in range(last)) + f[last]
    backward = g[last] + sum(max(b[i], g[i - 1]) + s[i] for i in range(last, 0, -1))
    return forward + backward + b[0] + s[0]
