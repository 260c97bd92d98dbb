"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 174
import math
import numbers
import time
from dataclasses import dataclass

import numpy as np

from dsml.collectives import allgather, allreduce
from dsml.collectives.cost import cost
from dsml.data_parallel import flatten, my_shard, shard_bounds, unflatten
from dsml.train.models import loss_and_grads
from dsml.utils import add_to_class
from dsml.validate_args import integer

WIRE_FLOAT = np.float32      # what goes on the wire for a value: fp32, as the dense baseline sends
WIRE_INDEX = np.int32        # an index into a vector of < 2³¹ elements


@dataclass
class Compressed:
    """One rank's compressed gradient: `arrays` is exactly what would go on the wire (values,
    indices, scales, packed bits — each a NumPy array), `n` the length of the vector it came
    from. `nbytes` is measured from the arrays, never computed from a formula."""
    arrays: dict
    n: int

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))


def _check_vector(x, name: str = "x"):
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"{name} must be a 1-D vector, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{name} must hold floats (float32 or float64), got dtype {x.dtype}")
    return x


def _check_count(name: str, value, low: int = 1):
    return integer(name, value, low)


def _buckets(n: int, bucket):
    """[start, stop) of consecutive buckets of `bucket` elements (the whole vector if None)."""
    size = n if bucket is None else bucket
    return [(start, min(start + size, n)) for start in range(0, n, max(size, 1))]


# -- cell 175
def _bucket_sums(values, bucket):
    """The sum (float64) of `values` over each bucket, without a Python loop over buckets."""
    n = len(values)
    if n == 0:
        return np.zeros(0)
    if bucket is None or bucket >= n:
        return np.array([np.sum(values, dtype=np.float64)])
    padded = np.zeros(-(-n // bucket) * bucket, dtype=values.dtype)   # the last bucket may be short
    padded[:n] = values
    return padded.reshape(-1, bucket).sum(axis=1, dtype=np.float64)


def _per_element(per_bucket, n: int, bucket):
    """Each bucket's value repeated over its elements: shape (n,), or (1,) for one bucket
    (it broadcasts: no copy of a scalar n times)."""
    if bucket is None or bucket >= n:
        return per_bucket[:1]
    return np.repeat(per_bucket, bucket)[:n]


class Compressor:
    """A gradient compressor: `compress(x, rng)` → Compressed, `decompress(c)` → float64 vector.

    `allreduce_as_is`: True when the ranks' compressed arrays can be summed element by element
    by an all-reduce and still mean the sum of the decompressed vectors (every rank's arrays
    have the same meaning at each position); False when they must be all-gathered and each rank
    decompresses all p of them (their indices or scales differ)."""
    name = "compressor"
    allreduce_as_is = False

    def compress(self, x, rng=None) -> Compressed:        # pragma: no cover - each has one
        raise NotImplementedError

    def decompress(self, c: Compressed):                    # pragma: no cover - each has one
        raise NotImplementedError

    def __repr__(self):
        return self.name


class Dense(Compressor):
    """No compression: the vector in fp32 (the baseline every ratio is measured against)."""
    name = "dense"
    allreduce_as_is = True

    def compress(self, x, rng=None):
        x = _check_vector(x)
        return Compressed({"values": x.astype(WIRE_FLOAT)}, len(x))

    def decompress(self, c):
        return c.arrays["values"].astype(np.float64)


# -- cell 176
class Sign(Compressor):
    """1-bit quantization with scale (Seide et al. 2014; signSGD's sign with a scale): each
    element becomes its sign, one bit on the wire (zero counts as +), and each bucket of `bucket`
    elements (the whole vector if None) is scaled by its mean absolute value, one fp32:
    x̂_i = mean_{j∈B}|x_j|·sign(x_i). Biased: it keeps ‖x‖₁ of each bucket, not x.
    Wire: ⌈n/8⌉ bytes of bits + 4 bytes per bucket."""
    allreduce_as_is = False      # scales differ between ranks: all-gather, or vote (below)

    def __init__(self, bucket: int | None = None):
        self.bucket = None if bucket is None else _check_count("bucket", bucket)
        self.name = "sign" if bucket is None else f"sign/{bucket}"

    def compress(self, x, rng=None):
        x = _check_vector(x)
        sizes = np.array([b - a for a, b in _buckets(len(x), self.bucket)])
        scales = _bucket_sums(np.abs(x), self.bucket) / np.maximum(sizes, 1)
        return Compressed({"bits": np.packbits(x >= 0), "scales": scales.astype(WIRE_FLOAT)},
                          len(x))

    def decompress(self, c):
        signs = np.unpackbits(c.arrays["bits"], count=c.n).astype(np.float64) * 2.0 - 1.0
        return signs * _per_element(c.arrays["scales"].astype(np.float64), c.n, self.bucket)


# -- cell 178
def qsgd(x, levels: int, rng, bucket: int | None = None):
    """QSGD (Alistarh et al. 2017) with s = `levels` levels, returned dequantized (float64, the
    shape of x). In each bucket v (of `bucket` elements; the whole vector if None) element i
    becomes ‖v‖₂·sign(v_i)·ξ_i/s, where ξ_i is ⌊s|v_i|/‖v‖₂⌋ or that plus one, rounded up with
    probability equal to the fractional part: E[Q(v)] = v (unbiased) and
    E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖² for a bucket of d elements (Lemma 3.1)."""
    levels_int, norms = _qsgd_levels(_check_vector(x), levels, rng, bucket)
    return _qsgd_dequantize(levels_int, norms, levels, bucket)


def _qsgd_levels(x, levels, rng, bucket):
    levels = _check_count("levels", levels)
    bucket = None if bucket is None else _check_count("bucket", bucket)
    if rng is None or not hasattr(rng, "random"):
        raise ValueError(f"rng must be a numpy Generator (QSGD rounds at random), got {rng!r}")
    norms = np.sqrt(_bucket_sums(np.square(x), bucket))
    element_norms = _per_element(norms, len(x), bucket)
    safe = np.where(element_norms > 0, element_norms, 1.0)     # a zero bucket stays zero
    scaled = levels * np.abs(x) / safe                          # in [0, s]
    floor = np.floor(scaled)
    rounded_up = rng.random(len(x)) < (scaled - floor)         # probability = fractional part
    signed = np.sign(x) * (floor + rounded_up)
    return signed, norms


def _qsgd_dequantize(signed_levels, norms, levels, bucket):
    out = np.asarray(signed_levels, dtype=np.float64)
    return out * _per_element(np.asarray(norms, dtype=np.float64), len(out), bucket) / levels


def qsgd_variance(x, levels: int, bucket: int | None = None) -> float:
    """The exact E‖Q(x) − x‖² of QSGD: Σ_i (‖v‖/s)²·f_i(1 − f_i), f_i the fractional part of
    s|x_i|/‖v‖ (each element is a two-point variable, one level apart)."""
    x = _check_vector(x)
    levels = _check_count("levels", levels)
    total = 0.0
    for a, b in _buckets(len(x), bucket):
        norm = float(np.linalg.norm(x[a:b]))
        if norm > 0:
            scaled = levels * np.abs(x[a:b]) / norm
            frac = scaled - np.floor(scaled)
            total += (norm / levels) ** 2 * float(np.sum(frac * (1 - frac)))
    return total


def qsgd_variance_bound(x, levels: int, bucket: int | None = None) -> float:
    """Alistarh et al.'s bound Σ_buckets min(d/s², √d/s)·‖v‖² on E‖Q(x) − x‖²."""
    x = _check_vector(x)
    levels = _check_count("levels", levels)
    total = 0.0
    for a, b in _buckets(len(x), bucket):
        d = b - a
        total += min(d / levels ** 2, math.sqrt(d) / levels) * float(np.sum(x[a:b] ** 2))
    return total


# -- cell 179
class QSGD(Compressor):
    """QSGD as a compressor: per element a signed level in −s..s (int8 for s ≤ 127, else int16;
    packing to 1 + ⌈log₂(s+1)⌉ bits, or the paper's Elias coding, would shrink it further) and
    one fp32 norm per bucket. Unbiased. Needs a `rng` at every compress."""
    allreduce_as_is = False      # the norms differ between ranks

    def __init__(self, levels: int, bucket: int | None = None):
        self.levels = _check_count("levels", levels)
        self.bucket = None if bucket is None else _check_count("bucket", bucket)
        self.name = f"qsgd s={levels}" + ("" if bucket is None else f"/{bucket}")

    def compress(self, x, rng=None):
        signed, norms = _qsgd_levels(_check_vector(x), self.levels, rng, self.bucket)
        dtype = np.int8 if self.levels <= 127 else np.int16
        return Compressed({"levels": signed.astype(dtype), "norms": norms.astype(WIRE_FLOAT)},
                          len(signed))

    def decompress(self, c):
        return _qsgd_dequantize(c.arrays["levels"], c.arrays["norms"], self.levels, self.bucket)


# -- cell 181
def _k_of(n: int, k, fraction) -> int:
    if fraction is not None:
        return max(1, math.ceil(fraction * n)) if n else 0
    if k > n:
        raise ValueError(f"k must be ≤ n = {n} (the vector's length), got k={k}")
    return k


def _check_k(k, fraction):
    if (k is None) == (fraction is None):
        raise ValueError(f"give exactly one of k (a count) and fraction, got k={k!r}, "
                         f"fraction={fraction!r}")
    if k is not None:
        return _check_count("k", k), None
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) \
            or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    return None, float(fraction)


class TopK(Compressor):
    """Keep the k largest |x_i| (k given, or ⌈fraction·n⌉): fp32 values + int32 indices.
    Biased (it drops the rest); with error feedback the dropped mass is sent later (Deep
    Gradient Compression, Lin et al. 2018). Each rank's indices differ: all-gather."""
    allreduce_as_is = False

    def __init__(self, k: int | None = None, fraction: float | None = None):
        self.k, self.fraction = _check_k(k, fraction)
        self.name = f"top-k {k}" if k is not None else f"top-k {100 * fraction:g}%"

    def compress(self, x, rng=None):
        x = _check_vector(x)
        k = _k_of(len(x), self.k, self.fraction)
        chosen = np.argpartition(np.abs(x), len(x) - k)[len(x) - k:] if k else np.zeros(0, int)
        chosen = np.sort(chosen)                 # canonical order: ties and order do not matter
        return Compressed({"values": x[chosen].astype(WIRE_FLOAT),
                           "indices": chosen.astype(WIRE_INDEX)}, len(x))

    def decompress(self, c):
        out = np.zeros(c.n)
        out[c.arrays["indices"]] = c.arrays["values"]
        return out


# -- cell 182
class RandomK(Compressor):
    """Keep k elements chosen uniformly at random without replacement (k given, or
    ⌈fraction·n⌉). `unbiased=False` (the default, as in sparsified SGD with memory, Stich et al.
    2018) sends them as they are — E[x̂] = (k/n)·x, a shrunken step; `unbiased=True` multiplies
    them by n/k so that E[x̂] = x, at the price of variance (n/k − 1)·‖x‖². With a `shared_seed`
    every rank draws the same indices (the seed of the step, known to all), so only the values go
    on the wire and they all-reduce as they are; without it, fp32 values + int32 indices,
    all-gathered."""

    def __init__(self, k: int | None = None, fraction: float | None = None,
                 unbiased: bool = False, shared_seed: int | None = None):
        self.k, self.fraction = _check_k(k, fraction)
        self.unbiased = bool(unbiased)
        self.shared_seed = shared_seed
        self.allreduce_as_is = shared_seed is not None
        self._draws = 0                          # with a shared seed: the step's index stream
        self.name = ("rand-k " + (f"{k}" if k is not None else f"{100 * fraction:g}%")
                     + (" ×n/k" if unbiased else "")
                     + (" shared" if shared_seed is not None else ""))

    def _indices(self, n, k, rng):
        if self.shared_seed is not None:
            rng = np.random.default_rng((self.shared_seed, self._draws))
            self._draws += 1
        elif rng is None or not hasattr(rng, "choice"):
            raise ValueError(f"rng must be a numpy Generator (random-k draws indices), got {rng!r}")
        return np.sort(rng.choice(n, size=k, replace=False))

    def compress(self, x, rng=None):
        x = _check_vector(x)
        k = _k_of(len(x), self.k, self.fraction)
        chosen = self._indices(len(x), k, rng)
        values = x[chosen] * (len(x) / k if self.unbiased and k else 1.0)
        arrays = {"values": values.astype(WIRE_FLOAT)}
        if self.shared_seed is None:
            arrays["indices"] = chosen.astype(WIRE_INDEX)
        else:
            self._last = chosen                 # the receiver regenerates them from the seed
        return Compressed(arrays, len(x))

    def decompress(self, c):
        indices = c.arrays["indices"] if "indices" in c.arrays else self._last
        out = np.zeros(c.n)
        out[indices] = c.arrays["values"]
        return out


# -- cell 184
class ErrorFeedback(Compressor):
    """Error feedback (1-bit SGD, Seide et al. 2014; EF-SGD, Karimireddy et al. 2019) around ANY
    compressor: compress x + e instead of x and keep the new residual e ← (x + e) − x̂, so that
    what compression dropped this step is sent in a later one. Holds one residual (float64, the
    vector's length) per wrapper: give each rank its own."""

    def __init__(self, inner: Compressor):
        if not isinstance(inner, Compressor) or isinstance(inner, ErrorFeedback):
            raise ValueError(f"inner must be a compressor (not already error-feedback), "
                             f"got {inner!r}")
        self.inner = inner
        self.allreduce_as_is = inner.allreduce_as_is
        self.name = inner.name + " + EF"
        self.residual = None

    def _corrected(self, x):
        x = _check_vector(x)
        if self.residual is None:
            self.residual = np.zeros(len(x))
        if len(self.residual) != len(x):
            raise ValueError(f"x has {len(x)} elements but the residual has "
                             f"{len(self.residual)}: one ErrorFeedback per gradient")
        return x + self.residual

    def compress(self, x, rng=None):
        corrected = self._corrected(x)
        c = self.inner.compress(corrected, rng)
        self.residual = corrected - self.inner.decompress(c)
        return c

    def decompress(self, c):
        return self.inner.decompress(c)

    def exchange(self, comm, x, rng=None):
        corrected = self._corrected(x)
        total, mine = yield from self.inner.exchange(comm, corrected, rng)
        self.residual = corrected - mine
        return total, mine


# -- cell 186
class MajorityVote(Compressor):
    """signSGD with majority vote (Bernstein et al. 2018), with a scale: each rank sends its signs
    as int8 ±1 and its mean |x| as one fp32. All-reduced as they are, the int8 signs sum to the
    vote count (|count| ≤ p, so int8 holds it for p ≤ 127: 1 byte per element, not 1 bit, because
    the sum needs room) and the scales to Σ s_r; the aggregate is sign(votes)·Σ s_r — a vote, not
    the sum of the ranks' scaled signs (that would need the all-gather that `Sign` does)."""
    name = "sign vote"
    allreduce_as_is = True

    def compress(self, x, rng=None):
        x = _check_vector(x)
        signs = np.where(x >= 0, 1, -1).astype(np.int8)
        scale = np.array([np.mean(np.abs(x)) if len(x) else 0.0], dtype=WIRE_FLOAT)
        return Compressed({"votes": signs, "scale": scale}, len(x))

    def decompress(self, c):
        return np.sign(c.arrays["votes"].astype(np.float64)) * float(c.arrays["scale"][0])


def pack(c: Compressed):
    """A compressed gradient as one uint8 wire buffer: its arrays' bytes, one after another."""
    return np.concatenate([np.ascontiguousarray(a).view(np.uint8).ravel()
                           for a in c.arrays.values()]) if c.arrays else np.zeros(0, np.uint8)


def unpack(buffer, like: Compressed) -> Compressed:
    """The inverse of pack, reading arrays of `like`'s names, dtypes and shapes (every rank's
    compressed gradient has the same layout, only the contents differ)."""
    arrays, at = {}, 0
    for name, a in like.arrays.items():
        arrays[name] = buffer[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
        at += a.nbytes
    return Compressed(arrays, like.n)


@add_to_class(Compressor)
def exchange(self, comm, x, rng=None):
    """Rank program body (`yield from` it): combine every rank's compressed x. Returns
    (aggregate, this rank's own decompressed x̂). If `allreduce_as_is`, each wire array is
    all-reduced (sum) as it is and the sum decompressed; otherwise the packed wire buffers are
    all-gathered and every rank decompresses all p of them and adds them up, in rank order (so
    every rank gets bit-identical sums)."""
    c = self.compress(x, rng)
    mine = self.decompress(c)
    if self.allreduce_as_is:
        summed = {}
        for name, a in c.arrays.items():
            if np.issubdtype(a.dtype, np.integer) and comm.size > np.iinfo(a.dtype).max:
                raise ValueError(f"{self.name}: a sum of {comm.size} {a.dtype} values can "
                                 f"overflow; at most {np.iinfo(a.dtype).max} ranks")
            summed[name] = yield from allreduce(comm, a, op="sum", algorithm="ring")
        return self.decompress(Compressed(summed, c.n)), mine
    mine_wire = pack(c)
    gathered = yield from allgather(comm, mine_wire)
    total = np.zeros(c.n)
    for r in range(comm.size):
        part = gathered[r * len(mine_wire):(r + 1) * len(mine_wire)]
        total += self.decompress(unpack(part, c))
    return total, mine


# -- cell 188
class PowerSGD(Compressor):
    """PowerSGD (Vogels, Karimireddy & Jaggi 2019): each matrix M (rows × cols) of the gradient
    is sent as rank-r factors from one step of power iteration, P = M Q, P̂ = orthonormalize(P),
    Q ← Mᵀ P̂, and rebuilt as P̂ Qᵀ: (rows + cols)·r numbers instead of rows·cols. `shapes` lists
    the pieces of the flat gradient in order (week 3's layout); 2-D pieces are compressed, 1-D
    ones (biases) are sent dense, as the paper does. Q is warm-started: each step starts from
    the last step's Q (seeded by `seed`, the same on every rank). Across ranks (`exchange`) P
    and Q are each all-reduced once — both are linear in M, so they sum as they are. Biased:
    use it with ErrorFeedback, as the paper does."""
    allreduce_as_is = True

    def __init__(self, shapes, rank: int, seed: int = 0):
        self.rank = _check_count("rank", rank)
        self.shapes = [tuple(int(d) for d in np.atleast_1d(s)) for s in shapes]
        for shape in self.shapes:
            if len(shape) not in (1, 2) or min(shape) < 1:
                raise ValueError(f"shapes must be 1-D or 2-D with positive sizes, got {shape}")
            if len(shape) == 2 and self.rank > min(shape):
                raise ValueError(f"rank must be ≤ min(rows, cols) = {min(shape)} for a matrix "
                                 f"of shape {shape}, got rank={rank}")
        rng = np.random.default_rng(seed)
        self.Q = [rng.standard_normal((s[1], self.rank)) for s in self.shapes if len(s) == 2]
        self.n = sum(int(np.prod(s)) for s in self.shapes)
        self.name = f"powersgd r={rank}"

    def _split(self, x):
        x = _check_vector(x)
        if len(x) != self.n:
            raise ValueError(f"x has {len(x)} elements, the shapes add up to {self.n}")
        matrices, vectors, at = [], [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            piece = np.asarray(x[at:at + size], dtype=np.float64)
            (matrices if len(shape) == 2 else vectors).append(piece.reshape(shape))
            at += size
        return matrices, (np.concatenate(vectors) if vectors else np.zeros(0))

    def _assemble(self, P_hats, Qs, dense):
        out, m, v = np.zeros(self.n), 0, 0
        at = 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            if len(shape) == 2:
                out[at:at + size] = (P_hats[m] @ Qs[m].T).ravel()
                m += 1
            else:
                out[at:at + size] = dense[v:v + size]
                v += size
            at += size
        return out

    def _cut(self, flat, widths):
        """Flat fp32 wire buffer → float64 (rows, r) or (cols, r) factors."""
        out, at = [], 0
        for rows in widths:
            out.append(flat[at:at + rows * self.rank].astype(np.float64).reshape(rows, self.rank))
            at += rows * self.rank
        return out, flat[at:].astype(np.float64)


# -- cell 189
@add_to_class(PowerSGD)
def _rows_cols(self):
    rows = [s[0] for s in self.shapes if len(s) == 2]
    cols = [s[1] for s in self.shapes if len(s) == 2]
    return rows, cols


@add_to_class(PowerSGD)
def compress(self, x, rng=None):
    matrices, dense = self._split(x)
    P_hats = [np.linalg.qr(M @ Q)[0] for M, Q in zip(matrices, self.Q)]
    self.Q = [M.T @ P for M, P in zip(matrices, P_hats)]          # the warm start
    return Compressed({"P": _concat_f32(P_hats), "Q": _concat_f32(self.Q),
                       "dense": dense.astype(WIRE_FLOAT)}, self.n)


@add_to_class(PowerSGD)
def decompress(self, c):
    rows, cols = self._rows_cols()
    P_hats, _ = self._cut(c.arrays["P"], rows)
    Qs, _ = self._cut(c.arrays["Q"], cols)
    return self._assemble(P_hats, Qs, c.arrays["dense"].astype(np.float64))


@add_to_class(PowerSGD)
def exchange(self, comm, x, rng=None):
    """Rank program body (`yield from` it): two all-reduces, of [P, dense pieces] and of Q.
    Returns (Σ_ranks P̂ Q_rᵀ with the dense pieces summed, this rank's own P̂ Q_rᵀ)."""
    matrices, dense = self._split(x)
    rows, cols = self._rows_cols()
    first = np.concatenate([_concat_f32([M @ Q for M, Q in zip(matrices, self.Q)]),
                            dense.astype(WIRE_FLOAT)])
    summed = yield from allreduce(comm, first, op="sum", algorithm="ring")
    P_sums, dense_sum = self._cut(summed, rows)
    # Every rank holds the same P sum, so every rank computes the same P̂.
    P_hats = [np.linalg.qr(P)[0] for P in P_sums]
    Q_mine = [M.T @ P for M, P in zip(matrices, P_hats)]
    Q_wire = _concat_f32(Q_mine)
    Q_summed = yield from allreduce(comm, Q_wire, op="sum", algorithm="ring")
    Q_sums, _ = self._cut(Q_summed, cols)
    Q_mine, _ = self._cut(Q_wire, cols)                 # as rounded on the wire
    self.Q = [Q / comm.size for Q in Q_sums]              # warm start: the mean Q
    total = self._assemble(P_hats, Q_sums, dense_sum)
    mine = self._assemble(P_hats, Q_mine, dense.astype(WIRE_FLOAT).astype(np.float64))
    return total, mine


# -- cell 190
def _concat_f32(arrays):
    if not arrays:
        return np.zeros(0, dtype=WIRE_FLOAT)
    return np.concatenate([np.ravel(a) for a in arrays]).astype(WIRE_FLOAT)


# -- cell 192
def dgc_density(step: int, warmup_steps: int = 0, density: float = 0.001, stages: int = 4):
    """The fraction of a gradient DGC sends at `step` (0-based): during the warm-up of
    `warmup_steps` steps, split into `stages` equal stages, 25 %, 6.25 %, 1.5625 %, … (a quarter
    of the stage before: sparsity 75 %, 93.75 %, 98.4375 %, 99.6 % as in Lin et al. 2018),
    never below `density`; from then on `density`."""
    if warmup_steps and step < warmup_steps:
        stage = step * stages // warmup_steps
        return max(density, 0.25 ** (stage + 1))
    return density


def _largest(magnitudes, k: int):
    """Sorted indices of the k largest entries — exactly argpartition's set up to ties, faster
    for small k/n: a threshold from a strided sample keeps a few candidates, which are then
    partitioned (DGC samples for the same reason); a full argpartition if too few pass."""
    n = len(magnitudes)
    if 64 * k < n:
        sample = magnitudes[::16]
        keep = min(len(sample) - 1, 2 * math.ceil(k * len(sample) / n))
        threshold = np.partition(sample, len(sample) - 1 - keep)[len(sample) - 1 - keep]
        candidates = np.flatnonzero(magnitudes > threshold)
        if len(candidates) >= k:
            top = np.argpartition(magnitudes[candidates], len(candidates) - k)[len(candidates) - k:]
            return np.sort(candidates[top])
    return np.sort(np.argpartition(magnitudes, n - k)[n - k:])


# -- cell 193
class DGC(TopK):
    """Deep Gradient Compression (Lin et al. 2018) for ONE rank: top-k of an accumulated vector
    (k = ⌈density·n⌉, the density ramping down over `warmup_steps`, see dgc_density), fp32
    values + int32 indices, all-gathered like TopK. Before accumulating, the gradient g is
    clipped to norm ≤ `clip_norm` (local gradient clipping: give each rank the global threshold
    ÷ √p). With `momentum_correction` the momentum lives here: u ← m·u + g, v ← v + u, and the
    optimizer must be plain SGD; without it v ← v + g (error feedback of the gradient) and the
    optimizer applies momentum to the sparse sum — the variant DGC corrects. What is sent is
    removed from v, and with `factor_masking` also from u (momentum factor masking)."""

    def __init__(self, density: float = 0.001, momentum: float = 0.9, warmup_steps: int = 0,
                 clip_norm: float | None = None, momentum_correction: bool = True,
                 factor_masking: bool = True):
        super().__init__(fraction=density)
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) \
                or not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm!r}")
        self.density, self.momentum = self.fraction, float(momentum)
        self.warmup_steps = _check_count("warmup_steps", warmup_steps, low=0)
        self.clip_norm, self.clipped = clip_norm, 0
        self.momentum_correction, self.factor_masking = momentum_correction, factor_masking
        self.u = self.v = None
        self.step = 0
        self.name = f"DGC {100 * density:g}%" + ("" if momentum_correction else " without MC")

    def compress(self, x, rng=None):
        x = np.asarray(_check_vector(x), dtype=np.float64)      # never written to
        if self.v is None:
            self.u, self.v = np.zeros(len(x)), np.zeros(len(x))
        norm = float(np.linalg.norm(x))
        if self.clip_norm is not None and norm > self.clip_norm:
            x, self.clipped = x * (self.clip_norm / norm), self.clipped + 1
        if self.momentum_correction:
            self.u *= self.momentum
            self.u += x
            self.v += self.u
        else:
            self.v += x
        k = _k_of(len(x), None, dgc_density(self.step, self.warmup_steps, self.density))
        sent = _largest(np.abs(self.v), k)
        c = Compressed({"values": self.v[sent].astype(WIRE_FLOAT),
                        "indices": sent.astype(WIRE_INDEX)}, len(x))
        self.v[sent] -= c.arrays["values"]           # what is left: fp32's rounding of it
        if self.momentum_correction and self.factor_masking:
            self.u[sent] = 0.0
        self.step += 1
        return c


# -- cell 195
def compressed_data_parallel_sgd(comm, model, optimizer, X, y, batches, compressor: Compressor,
                                 seed: int = 0, loss: str = "cross_entropy"):
    """Rank program body (`yield from` it): week 3's synchronous data-parallel SGD with the
    gradient sent through `compressor` (this rank's own instance: error feedback and PowerSGD
    keep state per rank). Each rank scales its shard's mean gradient by |shard|/|batch| so that
    the ranks' vectors sum to the batch's mean gradient, exchanges it (`compressor.exchange`),
    and every rank steps with the same aggregate. QSGD and random-k draw from a generator
    seeded by (seed, rank). Returns this rank's shard losses, one per step."""
    rng = np.random.default_rng((seed, comm.rank))
    losses = []
    for step, batch in enumerate(batches):
        batch, mine = my_shard(comm, step, batch)
        if len(mine):
            local_loss, grads = loss_and_grads(model, X[mine], y[mine], loss)
        else:
            local_loss, grads = 0.0, {name: np.zeros_like(w) for name, w in model.params.items()
                                      if name not in model.frozen}
        vector, layout = flatten(grads)
        vector *= len(mine) / len(batch)
        total, _ = yield from compressor.exchange(comm, vector, rng)
        optimizer.step(model.params, unflatten(total, layout))
        losses.append(float(local_loss))
    return losses


def gradient_shapes(model):
    """Shapes of the model's gradient pieces in flatten order (what PowerSGD needs)."""
    return [w.shape for name, w in model.params.items() if name not in model.frozen]


def trace_bytes_sent(trace) -> int:
    """Bytes all ranks put on the wire over a run, read from its trace (sends and exchanges)."""
    return int(sum(r.nbytes for r in trace if r.op in ("send", "sendrecv")))


# -- cell 197
def looped_data_parallel_sgd(model, optimizer, X, y, batches, compressors, seed: int = 0,
                             loss: str = "cross_entropy"):
    """The same arithmetic as compressed_data_parallel_sgd with an all-gathered compressor, with
    the p = len(compressors) ranks run as a loop in one process over ONE model (every replica
    would hold the same bits): for experiments too large to simulate every replica. Each rank's
    shard gradient, scaled by |shard|/|batch|, goes through its own compressor; the aggregate is
    the sum of the decompressed vectors in rank order, and `optimizer` steps with it. Nothing is
    sent: returns the wire bytes each rank's compressor produced, one list per step."""
    p = len(compressors)
    if p < 1:
        raise ValueError("compressors must hold one compressor per rank, got none")
    rngs = [np.random.default_rng((seed, rank)) for rank in range(p)]
    wire_bytes = []
    for step, batch in enumerate(batches):
        batch = np.asarray(batch)
        if len(batch) == 0:
            raise ValueError(f"step {step}: the batch is empty")
        total, sizes, layout = None, [], None
        for rank, compressor in enumerate(compressors):
            start, stop = shard_bounds(len(batch), p, rank)
            mine = batch[start:stop]
            _, grads = loss_and_grads(model, X[mine], y[mine], loss)
            vector, layout = flatten(grads)
            vector *= len(mine) / len(batch)
            c = compressor.compress(vector, rngs[rank])
            sizes.append(c.nbytes)
            part = compressor.decompress(c)              # a new array: safe to add into
            if total is None:
                total = part
            else:
                total += part
        optimizer.step(model.params, unflatten(total, layout))
        wire_bytes.append(sizes)
    return wire_bytes


# -- cell 199
COLLECTIVES = ("allreduce", "allgather")


def exchange_time(world_size: int, wire_bytes, alpha: float, beta: float,
                  collective: str = "allreduce", compute_seconds: float = 0.0) -> float:
    """α–β time (s) of one compressed exchange with ring collectives: `compute_seconds` of
    compression and decompression, then one ring collective per entry of `wire_bytes` (bytes
    each rank contributes: e.g. [P bytes, Q bytes] for PowerSGD's two all-reduces; one packed
    buffer for an all-gather). Ring all-reduce of m bytes: 2(p−1)α + 2(p−1)/p·mβ; ring
    all-gather of m bytes from each rank: (p−1)(α + mβ). The dense baseline is
    exchange_time(p, [4n], α, β). No γ: the sums of the all-reduce are not charged here."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}")
    if not compute_seconds >= 0:
        raise ValueError(f"compute_seconds must be ≥ 0, got {compute_seconds}")
    sizes = [float(b) for b in np.atleast_1d(wire_bytes)]
    gathered = world_size if collective == "allgather" else 1     # cost() wants the total
    return compute_seconds + sum(cost(collective, "ring", world_size, gathered * size,
                                      alpha, beta) for size in sizes)


def breakeven_bandwidth(world_size: int, dense_bytes: float, wire_bytes, alpha: float,
                        collective: str = "allreduce", compute_seconds: float = 0.0) -> float:
    """The link bandwidth B* (bytes/s) below which the compressed exchange beats a dense ring
    all-reduce of `dense_bytes`: both times are affine in β = 1/B, T = a + bβ, so they cross at
    β* = (a_c − a_d)/(b_d − b_c). Returns math.inf when compression wins on every link (it is
    cheaper even at β = 0) and 0.0 when it wins on none (it moves no fewer β-weighted bytes)."""
    dense = [exchange_time(world_size, [dense_bytes], alpha, beta) for beta in (0.0, 1.0)]
    comp = [exchange_time(world_size, wire_bytes, alpha, beta, collective, compute_seconds)
            for beta in (0.0, 1.0)]
    a_d, b_d = dense[0], dense[1] - dense[0]
    a_c, b_c = comp[0], comp[1] - comp[0]
    if b_c >= b_d:
        return 0.0
    beta_star = (a_c - a_d) / (b_d - b_c)
    return math.inf if beta_star <= 0 else 1.0 / beta_star


def time_compressor(compressor: Compressor, x, rng=None, repeats: int = 3):
    """Wall-clock seconds (best of `repeats`, since noise only adds time) of compress and of
    decompress of the vector x on this machine: (compress_s, decompress_s)."""
    repeats = _check_count("repeats", repeats)
    best_c = best_d = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        c = compressor.compress(x, rng)
        middle = time.perf_counter()
        compressor.decompress(c)
        end = time.perf_counter()
        best_c, best_d = min(best_c, middle - start), min(best_d, end - middle)
    return best_c, best_d


# -- cell 200
def overlapped_step_time(backward_seconds: float, bucket_comm_seconds, codec_seconds: float = 0.0):
    """Seconds from the start of backward to the last bucket's exchange finished, with the
    exchange overlapped with backward as DDP does (week 3): backward fills the buckets in order
    in equal slices of time; compressing and decompressing (`codec_seconds` in all) runs on the
    same device, so it lengthens each slice; bucket i's exchange (bucket_comm_seconds[i]) starts
    when the bucket is full and the exchange before it is done (one link, in order). Only what
    does not hide behind backward is exposed: the result is ≥ backward + codec and ≥ the sum of
    the exchanges, and with equal buckets it is the larger of backward + codec + the last
    exchange, and the first slice + every exchange."""
    if not backward_seconds >= 0:
        raise ValueError(f"backward_seconds must be ≥ 0, got {backward_seconds}")
    if not codec_seconds >= 0:
        raise ValueError(f"codec_seconds must be ≥ 0, got {codec_seconds}")
    comms = [float(c) for c in np.atleast_1d(bucket_comm_seconds)]
    if not comms or min(comms) < 0:
        raise ValueError(f"bucket_comm_seconds must be ≥ 1 value, each ≥ 0, got {comms}")
    slice_seconds = (backward_seconds + codec_seconds) / len(comms)
    done = 0.0
    for i, comm in enumerate(comms):
        done = max(done, (i + 1) * slice_seconds) + comm
    return done
