"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 11
import numpy as np

from dsml.collectives import allreduce
from dsml.train.models import loss_and_grads


def shard_bounds(n: int, p: int, rank: int):
    """[start, stop) of rank's share of n examples, cut as np.array_split cuts them: the first
    n mod p shards get one example more; with n < p the last shards are empty."""
    base, extra = divmod(n, p)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def my_shard(comm, step: int, batch):
    """(the global batch as an array, this rank's share of it); an empty batch is an error."""
    batch = np.asarray(batch)
    if len(batch) == 0:
        raise ValueError(f"step {step}: the batch is empty")
    start, stop = shard_bounds(len(batch), comm.size, comm.rank)
    return batch, batch[start:stop]


def flatten(grads, extra: int = 0):
    """Named arrays → one float64 vector (with `extra` zeros at the end, for values that ride
    along in the same all-reduce) and its layout [(name, shape), …]."""
    layout = [(name, g.shape) for name, g in grads.items()]
    vector = np.zeros(sum(g.size for g in grads.values()) + extra)
    at = 0
    for g in grads.values():
        vector[at:at + g.size] = np.ravel(g)
        at += g.size
    return vector, layout


def unflatten(vector, layout):
    """The inverse of flatten: a dict of arrays (views into `vector`)."""
    grads, at = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape))
        grads[name] = vector[at:at + size].reshape(shape)
        at += size
    return grads


# -- cell 12
def _check_finite(step, loss, grads):
    # Gradients first, in forward order: they name the layer to look at. The loss only when it
    # alone is bad (every parameter frozen, or a loss that overflowed while its gradients did not).
    for name, g in grads.items():
        if not np.all(np.isfinite(g)):
            raise FloatingPointError(f"step {step}: non-finite gradient in {name} "
                                     f"(loss {loss})")
    if not np.isfinite(loss):
        raise FloatingPointError(f"step {step}: the loss is {loss}; stopping rather than "
                                 f"training on it")


def data_parallel_sgd(comm, model, optimizer, X, y, batches, loss="cross_entropy",
                      algorithm="ring"):
    """Rank program body (`yield from` it): synchronous data-parallel SGD over the global
    `batches` (index arrays, the same on every rank). Each rank computes its shard's gradient
    sums; one all-reduce of a flat vector (gradients + loss) gives every rank the batch's mean
    gradient; every rank takes the same step. Returns the batch losses."""
    losses = []
    for step, batch in enumerate(batches):
        batch, mine = my_shard(comm, step, batch)
        if len(mine):
            local_loss, grads = loss_and_grads(model, X[mine], y[mine], loss)
        else:                                  # an empty shard adds nothing to the sums
            local_loss, grads = 0.0, {name: np.zeros_like(w) for name, w in model.params.items()
                                      if name not in model.frozen}
        vector, layout = flatten(grads, extra=1)     # the loss rides in the last slot
        vector[-1] = local_loss
        vector *= len(mine)                          # shard means → shard sums
        total = yield from allreduce(comm, vector, op="sum", algorithm=algorithm)
        grads = unflatten(total[:-1] / len(batch), layout)
        batch_loss = float(total[-1] / len(batch))
        _check_finite(step, batch_loss, grads)
        optimizer.step(model.params, grads)
        losses.append(batch_loss)
    return losses


def train_single(model, optimizer, X, y, batches, loss="cross_entropy"):
    """The one-process reference: each whole batch, one step. Returns the batch losses."""
    losses = []
    for step, batch in enumerate(batches):
        value, grads = loss_and_grads(model, X[batch], y[batch], loss)
        _check_finite(step, value, grads)
        optimizer.step(model.params, grads)
        losses.append(value)
    return losses


# -- cell 17
from dsml.collectives import broadcast


def broadcast_parameters(comm, model, root: int = 0):
    """Rank program body: every rank's parameters become `root`'s, copied in place, as DDP does
    when it wraps a model — replicas initialised with different seeds start equal."""
    for name, w in model.params.items():
        w[...] = yield from broadcast(comm, w, root=root)


def distributed_indices(n: int, world_size: int, rank: int, epoch: int, seed: int = 0,
                        shuffle: bool = True, drop_last: bool = False):
    """This rank's example indices for one epoch, picked as PyTorch's DistributedSampler picks
    them: one permutation of range(n), the same on every rank (seeded by seed + epoch: pass the
    epoch, or every epoch repeats the first), padded to a multiple of world_size by repeating
    its first indices (or cut to one, with drop_last), then every world_size-th index from rank."""
    if not 0 <= rank < world_size or n < 1:
        raise ValueError(f"need n ≥ 1 and 0 ≤ rank < world_size, got n={n}, rank={rank}, "
                         f"world_size={world_size}")
    order = np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n)
    if drop_last:
        total = (n // world_size) * world_size
    else:
        total = -(-n // world_size) * world_size
        order = np.resize(order, total)          # repeats the start: the padding
    return order[rank:total:world_size]


def join_sgd(comm, model, optimizer, X, y, my_batches, loss="cross_entropy"):
    """Rank program body: data-parallel SGD when ranks hold different numbers of batches (uneven
    inputs). Every step all-reduces [gradient sums, loss sum, example count, still-active flag];
    a rank out of batches takes part with zeros — as ranks inside PyTorch's `Join` context
    shadow the others' all-reduces — so no rank waits on one that has stopped. The step divides
    by the all-reduced count (the mean over the examples present), and the loop ends when no rank
    is active. Returns the losses of the steps this rank took part in with data."""
    losses, step = [], 0
    while True:
        if step < len(my_batches):
            mine = np.asarray(my_batches[step])
            value, grads = loss_and_grads(model, X[mine], y[mine], loss)
            vector, layout = flatten(grads, extra=3)
            vector *= len(mine)
            vector[-3:] = value * len(mine), len(mine), 1.0
        else:                                          # joined: shadow the all-reduce
            zeros = {n: np.zeros_like(w) for n, w in model.params.items() if n not in model.frozen}
            vector, layout = flatten(zeros, extra=3)
        total = yield from allreduce(comm, vector, op="sum", algorithm="ring")
        if total[-1] == 0:                             # nobody had data: every rank stops
            return losses
        count = total[-2]
        optimizer.step(model.params, unflatten(total[:-3] / count, layout))
        if step < len(my_batches):
            losses.append(float(total[-3] / count))
        step += 1


# -- cell 21
def accumulated_grads(model, X, y, batch, micro_batch: int, loss="cross_entropy"):
    """(loss, gradients) of the whole `batch`, computed in micro-batches of `micro_batch`
    examples and accumulated as a size-weighted mean — equal to one pass over the batch."""
    batch = np.asarray(batch)
    if micro_batch < 1 or len(batch) == 0:
        raise ValueError(f"need micro_batch ≥ 1 and a non-empty batch, got micro_batch="
                         f"{micro_batch}, batch of {len(batch)}")
    total_loss, total = 0.0, None
    for start in range(0, len(batch), micro_batch):
        part = batch[start:start + micro_batch]
        value, grads = loss_and_grads(model, X[part], y[part], loss)
        total_loss += value * len(part)
        if total is None:
            total = {name: g * len(part) for name, g in grads.items()}
        else:
            for name, g in grads.items():
                total[name] += g * len(part)
    return total_loss / len(batch), {name: g / len(batch) for name, g in total.items()}


def activation_bytes(model) -> int:
    """Bytes the model keeps from its last forward pass for backward (inputs and
    pre-activations of every layer): the memory that micro-batching shrinks."""
    if model._cache is None:
        return 0
    inputs, pre = model._cache
    return sum(a.nbytes for a in inputs) + sum(z.nbytes for z in pre)


# -- cell 37
def gradient_noise_scale(model, X, y, rng, small: int = 32, big: int = 2048, repeats: int = 20,
                         loss="cross_entropy"):
    """McCandlish et al.'s *simplified* noise scale B_simple = tr(Σ)/|G|² at the model's current
    weights (their eq. 2.9, exact for the Hessian-weighted B_noise only when H ∝ I), from the
    mean squared gradient norm at two batch sizes: E|G_B|² = |G|² + tr(Σ)/B. Returns
    (B_simple, |G|², tr Σ). Batches are drawn by `rng` without replacement."""
    if not 1 <= small < big <= len(X):
        raise ValueError(f"need 1 ≤ small < big ≤ {len(X)} examples, got small={small}, big={big}")

    def mean_square(batch_size):
        total = 0.0
        for _ in range(repeats):
            chosen = rng.choice(len(X), batch_size, replace=False)
            grads = loss_and_grads(model, X[chosen], y[chosen], loss)[1]
            total += sum(float(np.sum(g * g)) for g in grads.values())
        return total / repeats

    g_small, g_big = mean_square(small), mean_square(big)
    true_square = (big * g_big - small * g_small) / (big - small)
    trace = (g_small - g_big) / (1 / small - 1 / big)
    return trace / true_square, true_square, trace


def hessian_noise_scale(model, X, y, rng, small: int = 32, repeats: int = 16,
                        hessian_examples: int = 2048, loss="cross_entropy"):
    """McCandlish et al.'s B_noise = tr(HΣ)/(GᵀHG) (their eq. 2.7), with G the gradient over all
    of X, H the Hessian of the loss over `hessian_examples` of them (Hessian-vector products by
    central differences of gradients) and tr(HΣ) = b·E[(G_b − G)ᵀH(G_b − G)] over `repeats`
    batches of b = `small`. Returns (B_noise, GᵀHG, tr(HΣ))."""
    if not 1 <= small <= len(X) or repeats < 1 or hessian_examples < 1:
        raise ValueError(f"need 1 ≤ small ≤ {len(X)}, repeats ≥ 1 and hessian_examples ≥ 1; got "
                         f"{small}, {repeats}, {hessian_examples}")
    subset = rng.choice(len(X), min(hessian_examples, len(X)), replace=False)
    G = loss_and_grads(model, X, y, loss)[1]

    def hessian_times(v):
        norm = np.sqrt(sum(float(np.sum(a * a)) for a in v.values()))
        eps = 1e-4 / norm
        moved = {}
        for sign in (1.0, -1.0):
            for name in v:
                model.params[name] += sign * eps * v[name]
            moved[sign] = loss_and_grads(model, X[subset], y[subset], loss)[1]
            for name in v:
                model.params[name] -= sign * eps * v[name]
        return {name: (moved[1.0][name] - moved[-1.0][name]) / (2 * eps) for name in v}

    def dot(a, b):
        return sum(float(np.sum(a[name] * b[name])) for name in a)

    curvature = dot(G, hessian_times(G))
    total = 0.0
    for _ in range(repeats):
        chosen = rng.choice(len(X), small, replace=False)
        grads = loss_and_grads(model, X[chosen], y[chosen], loss)[1]
        deviation = {name: grads[name] - G[name] for name in G}
        total += dot(deviation, hessian_times(deviation))
    trace = small * total / repeats
    return trace / curvature, curvature, trace


# -- cell 57
from dsml.comm.api import SizeOnly


def assign_buckets(sizes, cap: float):
    """DDP's buckets: `sizes` is [(name, nbytes), …] in forward order; walking it backwards (the
    order backward produces gradients), a bucket takes gradients until it holds at least `cap`
    bytes, then closes. cap = 0 gives one bucket per gradient, cap = inf a single bucket.
    Returns the buckets as lists of names, in the order they fill."""
    if not cap >= 0:
        raise ValueError(f"bucket cap must be ≥ 0 bytes, got {cap}")
    buckets, current, held = [], [], 0
    for name, nbytes in reversed(list(sizes)):
        current.append(name)
        held += nbytes
        if held >= cap:
            buckets.append(current)
            current, held = [], 0
    if current:
        buckets.append(current)
    return buckets


def _reduce_bucket(comm, earlier, grads, algorithm):
    """One bucket's all-reduce, after the bucket before it (on a second activity, buckets go
    one at a time and in order, as on NCCL's one stream). Returns every result so far."""
    done = [] if earlier is None else (yield comm.join(earlier))
    if any(type(g) is SizeOnly for g in grads):
        vector = SizeOnly(sum(g.nbytes for g in grads))
    else:
        vector = flatten(dict(enumerate(grads)))[0]
    total = yield from allreduce(comm, vector, op="sum", algorithm=algorithm)
    return done + [total]


# -- cell 58
def ddp_allreduce(comm, produced, buckets, overlap: bool = True, algorithm: str = "ring",
                  contention: float = 0.0):
    """Rank program body: sum gradients over the ranks bucket by bucket, as backward produces them.

    `produced` yields (name, gradient, seconds): each gradient (an array, or a SizeOnly for
    simulations without data) as backward makes it, and the compute time that took
    (simulated; 0 on real engines, where the computing is the code that made it). `buckets`
    come from assign_buckets and must fill in order. A bucket is all-reduced the moment its
    last gradient is in: with `overlap`, on a second activity while backward goes on;
    without, before backward goes on. `contention` (section 10, "Overlap is not free") slows
    the compute while an all-reduce is in flight (see compute_sharing). Returns
    {name: summed gradient}."""
    if not 0 <= contention < 1:
        raise ValueError(f"contention must be in [0, 1), got {contention}")
    bucket_of = {name: k for k, names in enumerate(buckets) for name in names}
    missing = [len(names) for names in buckets]
    held, pending, results, next_bucket = {}, None, [], 0
    for name, gradient, seconds in produced:
        if seconds and contention:
            yield from compute_sharing(comm, seconds, pending, contention)
        elif seconds:
            yield comm.compute(seconds)
        if name not in bucket_of or name in held:
            raise ValueError(f"rank {comm.rank}: gradient {name!r} is "
                             f"{'produced twice' if name in held else 'in no bucket'}")
        held[name] = gradient
        k = bucket_of[name]
        missing[k] -= 1
        while next_bucket < len(buckets) and missing[next_bucket] == 0:
            job = _reduce_bucket(comm, pending, [held[n] for n in buckets[next_bucket]],
                                 algorithm)
            if overlap:
                pending = yield comm.spawn(job)
            else:
                results += yield from job      # job's list holds just this bucket
            next_bucket += 1
    if next_bucket < len(buckets):
        absent = [n for names in buckets[next_bucket:] for n in names if n not in held]
        raise ValueError(f"rank {comm.rank}: backward never produced {absent[:3]} "
                         f"(bucket {next_bucket} cannot be reduced)")
    if pending is not None:
        results = yield comm.join(pending)
    summed = {}
    for names, total in zip(buckets, results):
        if type(total) is SizeOnly:
            summed.update((n, SizeOnly(held[n].nbytes)) for n in names)
        else:
            summed.update(unflatten(total, [(n, np.shape(held[n])) for n in names]))
    return summed


# -- cell 60
from dsml.train.models import LOSSES

LOSS = "(loss)"          # the name the loss sum travels under, in the first bucket


def ddp_sgd(comm, model, optimizer, X, y, batches, bucket_cap: float = 25e6, overlap=True,
            loss="cross_entropy", algorithm="ring", seconds_per_flop: float = 0.0,
            rebuild: bool = True):
    """Rank program body: data-parallel SGD with DDP's bucketed all-reduce (ddp_allreduce).
    The same updates as data_parallel_sgd, to round-off (the sums group differently). Buckets
    are first assigned in reverse order of `model.params`; with `rebuild`, after the first step
    they are assigned again in the order backward actually produced the gradients (as DDP
    rebuilds its buckets after the first iteration). Returns the batch losses."""
    trainable = [name for name in model.params if name not in model.frozen]
    nbytes = {name: model.params[name].nbytes for name in trainable} | {LOSS: 8}
    buckets = assign_buckets([(name, nbytes[name]) for name in trainable + [LOSS]], bucket_cap)
    losses = []
    for step, batch in enumerate(batches):
        batch, mine = my_shard(comm, step, batch)
        produced, seen = _shard_gradient_sums(model, X[mine], y[mine], loss, seconds_per_flop), []
        summed = yield from ddp_allreduce(comm, _noting_order(produced, seen), buckets, overlap,
                                          algorithm)
        if step == 0 and rebuild:            # backward's real order, walked back to front
            buckets = assign_buckets([(name, nbytes[name]) for name in reversed(seen)], bucket_cap)
        batch_loss = float(summed.pop(LOSS)[0] / len(batch))
        grads = {name: summed[name] / len(batch) for name in trainable}
        _check_finite(step, batch_loss, grads)
        optimizer.step(model.params, grads)
        losses.append(batch_loss)
    return losses


def _noting_order(produced, seen):
    for item in produced:
        seen.append(item[0])
        yield item


def _shard_gradient_sums(model, X, y, loss, seconds_per_flop):
    """(name, gradient sum over the shard, seconds) as backward produces them; the loss sum
    first. An empty shard contributes zeros."""
    n = len(X)
    if n == 0:                   # zeros, in backward's own order (every rank rebuilds alike)
        yield LOSS, np.zeros(1), 0.0
        model.forward(np.zeros((0, model.sizes[0])))
        for name, gradient in model.backward_layers(np.zeros((0, model.sizes[-1]))):
            yield name, gradient, 0.0
        return
    value, dout = LOSSES[loss](model.forward(X), y)
    yield LOSS, np.array([value * n]), 0.0
    for name, gradient in model.backward_layers(dout):
        # A weight's gradient and the input gradient through it: 2 × 2·n·size FLOPs; a bias: n·size.
        flop = (4 if gradient.ndim == 2 else 1) * n * gradient.size
        yield name, gradient * n, flop * seconds_per_flop


# -- cell 74
import math

SLICE_SECONDS = 10e-6    # compute_sharing's slice: the resolution of the slow-down


def compute_sharing(comm, seconds, activity, contention, slice_seconds=SLICE_SECONDS):
    """Rank program body: `seconds` of compute (at full speed) issued in equal slices of at most
    `slice_seconds`; a slice that starts while `activity` (a handle from comm.spawn, or None)
    still runs takes 1/(1 − contention) as long, the share of the device that communication
    kernels take from compute. Read from the handle before each slice, so a slice that straddles
    the activity's end is charged whole."""
    if not 0 <= contention < 1 or not slice_seconds > 0:
        raise ValueError(f"need contention in [0, 1) and slice_seconds > 0, got contention="
                         f"{contention}, slice_seconds={slice_seconds}")
    slices = max(1, math.ceil(seconds / slice_seconds))
    for _ in range(slices):
        busy = activity is not None and not activity.done
        yield comm.compute(seconds / slices / (1 - contention) if busy else seconds / slices)
