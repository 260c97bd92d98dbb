"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 17
import numbers

import numpy as np

from dsml.collectives import allreduce
from dsml.train.transformer import (block_param_shapes, causal_attention_backward,
                                    causal_attention_forward, check_block_shape, gelu, gelu_grad,
                                    layer_norm_backward, layer_norm_forward, linear_backward,
                                    linear_forward)


def check_tp(tp: int, rank: int) -> None:
    """tp must be an integer ≥ 1 and rank one of 0..tp − 1."""
    if isinstance(tp, bool) or not isinstance(tp, numbers.Integral) or tp < 1:
        raise ValueError(f"tensor-parallel size tp must be an integer ≥ 1, got {tp!r}")
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < tp:
        raise ValueError(f"rank must be in 0..{tp - 1} for tp = {tp}, got {rank!r}")


def shard_sizes(total: int, tp: int, what: str = "columns") -> list:
    """How many of `total` items (columns, rows, heads) each of tp ranks owns, cut as
    np.array_split cuts them: the first total mod tp ranks own one more. An uneven cut is
    allowed (it unbalances compute, not communication); a rank left with nothing is not."""
    if tp > total:
        raise ValueError(f"tensor-parallel size {tp} exceeds the {total} {what} to split: "
                         f"a rank would own none; use tp ≤ {total}")
    base, extra = divmod(total, tp)
    return [base + (1 if r < extra else 0) for r in range(tp)]


def shard_range(total: int, tp: int, rank: int, what: str = "columns"):
    """[start, stop) of rank's share of `total` items (see shard_sizes)."""
    check_tp(tp, rank)
    sizes = shard_sizes(total, tp, what)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def qkv_columns(hidden: int, heads: int, tp: int, rank: int):
    """Indices of the columns of the fused QKV weight (hidden, 3·hidden), laid out
    [Q | K | V], that belong to rank's heads: its slice of Q, then of K, then of V —
    so that the rank's shard is itself a [Q | K | V] layout of its own heads."""
    check_block_shape(hidden, heads)
    first, last = shard_range(heads, tp, rank, "attention heads")
    d = hidden // heads
    mine = np.arange(first * d, last * d)
    return np.concatenate([mine, hidden + mine, 2 * hidden + mine])


def check_comm(comm, tp: int, rank: int, what: str) -> None:
    """A shard cut for (tp, rank) must run as that rank of a world of tp ranks."""
    if comm.size != tp or comm.rank != rank:
        raise ValueError(f"{what} was cut for tensor-parallel size {tp} (rank {rank}) but runs "
                         f"as rank {comm.rank} of a world of size {comm.size}; cut the shards "
                         f"with tp = comm.size and rank = comm.rank")


# -- cell 18
def matmul_flops(a, b) -> int:
    """FLOPs of a @ b, counting a multiply-add as 2: 2·(rows of a)·k·(columns of b), read from
    the operands' shapes (batched matmuls included)."""
    return 2 * a.size * b.shape[-1]


def spend_flops(comm, flops: float, flop_rate):
    """Rank program piece: charge `flops` / `flop_rate` (FLOP/s) seconds of compute — simulated
    time on engine "sim", free on real engines (their compute is the NumPy code). Nothing at
    all when flop_rate is None."""
    if flop_rate is not None:
        yield comm.compute(flops / flop_rate)


# -- cell 20
def copy_to_tp(x):
    """Megatron's f, forward: the identity. Every rank already holds the whole input X of a
    column-parallel layer, so entering the tensor-parallel region costs nothing."""
    return x


def copy_to_tp_backward(comm, dx_partial, algorithm: str = "ring"):
    """Megatron's f, backward: all-reduce (sum). Each rank's dL/dX covers only its own columns'
    path (dY_r·A_rᵀ); the true gradient is their sum over ranks."""
    return (yield from allreduce(comm, dx_partial, op="sum", algorithm=algorithm))


def reduce_from_tp(comm, partial, algorithm: str = "ring"):
    """Megatron's g, forward: all-reduce (sum). A row-parallel layer's ranks each hold a partial
    product X_r·B_r; the output is their sum."""
    return (yield from allreduce(comm, partial, op="sum", algorithm=algorithm))


def reduce_from_tp_backward(dy):
    """Megatron's g, backward: the identity. dL/d(sum) is dL/d(each term): every rank already
    holds all of it."""
    return dy


# -- cell 22
def _check_same(got, expected, what: str):
    if got != expected:
        raise ValueError(f"{what} must have shape {expected}, got {got}")


class _ShardedLinear:
    """What the column- and row-parallel layers share: this rank's weight (in, out) and bias
    (out,), checked; `SHAPE` says which part of the full weight the rank holds."""
    SHAPE = "(in, out)"

    def __init__(self, weight, bias, tp: int, rank: int, flop_rate=None, algorithm="ring"):
        check_tp(tp, rank)
        weight, bias = np.asarray(weight), np.asarray(bias)
        if weight.ndim != 2:
            raise ValueError(f"weight must be 2-D {self.SHAPE}, got shape {weight.shape}")
        _check_same(bias.shape, (weight.shape[1],), "bias (one per output column)")
        self.weight, self.bias, self.tp, self.rank = weight, bias, int(tp), int(rank)
        self.flop_rate, self.algorithm = flop_rate, algorithm
        self._x = None


# -- cell 23
class ColumnParallelLinear(_ShardedLinear):
    """Rank r's share of Y = X·A + b with A (in, out) split by columns (Megatron-LM, Shoeybi
    et al. 2019): Y_r = X·A_r + b_r. Forward needs no communication (f = identity); backward
    all-reduces dL/dX (f's conjugate). The output stays split: Y_r is rank r's columns.

    weight: this rank's columns (in, out_r); bias (out_r,). `flop_rate` (FLOP/s): charge compute
    time on the simulator (None: don't). `algorithm`: the all-reduce's."""
    SHAPE = "(in, out columns of this rank)"

    @classmethod
    def from_full(cls, weight, bias, tp: int, rank: int, **options):
        """Cut rank's columns out of the full weight (in, out) and bias (out,)."""
        weight = np.asarray(weight)
        start, stop = shard_range(weight.shape[-1], tp, rank, "output columns")
        return cls(weight[:, start:stop], np.asarray(bias)[start:stop], tp, rank, **options)

    def forward(self, comm, x):
        """Rank program piece: Y_r (..., out_r) for the whole input x (..., in)."""
        check_comm(comm, self.tp, self.rank, "ColumnParallelLinear")
        x = np.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"x has {x.shape[-1] if x.ndim else 0} features (shape {x.shape}) "
                             f"but the weight expects {self.weight.shape[0]}")
        x = copy_to_tp(x)
        self._x = x
        y = linear_forward(x, self.weight, self.bias)
        yield from spend_flops(comm, matmul_flops(x, self.weight), self.flop_rate)
        return y

    def backward(self, comm, dy):
        """Rank program piece: (dL/dX, all-reduced, for the whole input; {"weight", "bias"}
        gradients of this rank's columns) given dL/dY_r."""
        check_comm(comm, self.tp, self.rank, "ColumnParallelLinear")
        if self._x is None:
            raise RuntimeError("call forward before backward")
        dy = np.asarray(dy)
        _check_same(dy.shape, self._x.shape[:-1] + (self.weight.shape[1],),
                    "dy (this rank's output columns)")
        dx_partial, dweight, dbias = linear_backward(dy, self._x, self.weight)
        yield from spend_flops(comm, 2 * matmul_flops(self._x, self.weight), self.flop_rate)
        dx = yield from copy_to_tp_backward(comm, dx_partial, self.algorithm)
        return dx, {"weight": dweight, "bias": dbias}


# -- cell 25
class RowParallelLinear(_ShardedLinear):
    """Rank r's share of Z = Y·B + c with B (in, out) split by rows: rank r holds the input
    columns Y_r (as a column-parallel layer leaves them) and rows B_r; Z = Σ_r Y_r·B_r + c.
    Forward all-reduces the partial products (g); backward needs no communication (g's
    conjugate is the identity). The bias c is whole on every rank and added once, after the sum.

    weight: this rank's rows (in_r, out); bias (out,). Options as ColumnParallelLinear."""
    SHAPE = "(in rows of this rank, out)"

    @classmethod
    def from_full(cls, weight, bias, tp: int, rank: int, **options):
        """Cut rank's rows out of the full weight (in, out); the bias (out,) stays whole."""
        weight = np.asarray(weight)
        start, stop = shard_range(weight.shape[0], tp, rank, "input rows")
        return cls(weight[start:stop], np.asarray(bias), tp, rank, **options)

    def forward(self, comm, x_shard):
        """Rank program piece: Z (..., out), the same on every rank, from this rank's input
        columns x_shard (..., in_r)."""
        check_comm(comm, self.tp, self.rank, "RowParallelLinear")
        x_shard = np.asarray(x_shard)
        if x_shard.ndim < 1 or x_shard.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"x_shard has {x_shard.shape[-1] if x_shard.ndim else 0} features "
                             f"(shape {x_shard.shape}) but this rank's rows of the weight expect "
                             f"{self.weight.shape[0]}")
        self._x = x_shard
        partial = linear_forward(x_shard, self.weight)
        yield from spend_flops(comm, matmul_flops(x_shard, self.weight), self.flop_rate)
        total = yield from reduce_from_tp(comm, partial, self.algorithm)
        return total + self.bias

    def backward(self, comm, dz):
        """Rank program piece: (dL/dY_r for this rank's input columns; {"weight": its rows'
        gradient, "bias": the whole bias's, the same on every rank}) given dL/dZ."""
        check_comm(comm, self.tp, self.rank, "RowParallelLinear")
        if self._x is None:
            raise RuntimeError("call forward before backward")
        dz = reduce_from_tp_backward(np.asarray(dz))
        _check_same(dz.shape, self._x.shape[:-1] + (self.weight.shape[1],), "dz (the output)")
        dx_shard, dweight, dbias = linear_backward(dz, self._x, self.weight)
        yield from spend_flops(comm, 2 * matmul_flops(self._x, self.weight), self.flop_rate)
        return dx_shard, {"weight": dweight, "bias": dbias}


# -- cell 27
class ParallelMLP:
    """The Megatron MLP: Z = GELU(X·A + a)·B + b with A column-parallel and B row-parallel.
    Rank r computes GELU(X·A_r + a_r) — its own columns of the hidden layer, since GELU acts
    elementwise — then its partial product with B_r; one all-reduce (g) forward, one (f)
    backward. Built from the full weights with from_full; the hidden columns of A and the rows
    of B are cut alike."""

    def __init__(self, fc: ColumnParallelLinear, proj: RowParallelLinear):
        if fc.weight.shape[1] != proj.weight.shape[0] or (fc.tp, fc.rank) != (proj.tp, proj.rank):
            raise ValueError(f"fc's columns {fc.weight.shape} and proj's rows {proj.weight.shape} "
                             f"must be the same slice of the same rank "
                             f"(tp {fc.tp}/{proj.tp}, rank {fc.rank}/{proj.rank})")
        self.fc, self.proj = fc, proj
        self._pre = None

    @classmethod
    def from_full(cls, fc_weight, fc_bias, proj_weight, proj_bias, tp: int, rank: int,
                  **options):
        """Rank's shard of the MLP with fc (h, f), (f,) and proj (f, h), (h,), f hidden units."""
        if np.shape(fc_weight)[1] != np.shape(proj_weight)[0]:
            raise ValueError(f"fc_weight {np.shape(fc_weight)} and proj_weight "
                             f"{np.shape(proj_weight)} do not chain: fc's outputs must be proj's "
                             f"inputs")
        return cls(ColumnParallelLinear.from_full(fc_weight, fc_bias, tp, rank, **options),
                   RowParallelLinear.from_full(proj_weight, proj_bias, tp, rank, **options))

    def forward(self, comm, x):
        """Rank program piece: Z (..., h), the same on every rank."""
        pre = yield from self.fc.forward(comm, x)
        self._pre = pre
        return (yield from self.proj.forward(comm, gelu(pre)))

    def backward(self, comm, dz):
        """Rank program piece: (dL/dX, all-reduced; this rank's gradients named "fc.weight",
        "fc.bias", "proj.weight", "proj.bias")."""
        if self._pre is None:
            raise RuntimeError("call forward before backward")
        dhidden, proj_grads = yield from self.proj.backward(comm, dz)
        dx, fc_grads = yield from self.fc.backward(comm, dhidden * gelu_grad(self._pre))
        return dx, {"fc.weight": fc_grads["weight"], "fc.bias": fc_grads["bias"],
                    "proj.weight": proj_grads["weight"], "proj.bias": proj_grads["bias"]}


# -- cell 29
class ParallelAttention:
    """Head-parallel causal self-attention (Megatron-LM): rank r owns `heads` of the layer's
    heads — its columns of the fused QKV projection (column-parallel, no communication) and
    the matching rows of the output projection (row-parallel, one all-reduce). Heads never
    look at each other, so the attention itself runs on each rank alone."""

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, heads: int):
        width = proj.weight.shape[0]
        if qkv.weight.shape[1] != 3 * width or heads < 1 or width % heads:
            raise ValueError(f"the QKV shard {qkv.weight.shape} must hold 3 × the output "
                             f"projection's rows ({width}), split into {heads} whole heads")
        self.qkv, self.proj, self.heads = qkv, proj, heads
        self._cache = None

    @classmethod
    def from_full(cls, qkv_weight, qkv_bias, proj_weight, proj_bias, heads: int, tp: int,
                  rank: int, **options):
        """Rank's heads of a layer with QKV (h, 3h), (3h,) and output projection (h, h), (h,)."""
        hidden = np.shape(proj_weight)[0]
        _check_same(np.shape(qkv_weight), (hidden, 3 * hidden), "qkv_weight")
        columns = qkv_columns(hidden, heads, tp, rank)
        first, last = shard_range(heads, tp, rank, "attention heads")
        d = hidden // heads
        qkv = ColumnParallelLinear(np.asarray(qkv_weight)[:, columns],
                                   np.asarray(qkv_bias)[columns], tp, rank, **options)
        proj = RowParallelLinear(np.asarray(proj_weight)[first * d:last * d],
                                 np.asarray(proj_bias), tp, rank, **options)
        return cls(qkv, proj, last - first)

    def forward(self, comm, x):
        """Rank program piece: the attention output (b, s, h), the same on every rank."""
        qkv = yield from self.qkv.forward(comm, x)
        if qkv.ndim != 3:
            raise ValueError(f"attention needs x of shape (batch, seq, hidden), got {np.shape(x)}")
        heads_out, self._cache = causal_attention_forward(qkv, self.heads)
        q = self._cache[0]
        # two batched matmuls, q·kᵀ and weights·v, each 2·(b·heads·s·d)·s FLOPs
        yield from spend_flops(comm, 4 * q.size * q.shape[2], self.qkv.flop_rate)
        return (yield from self.proj.forward(comm, heads_out))

    def backward(self, comm, dout):
        """Rank program piece: (dL/dX, all-reduced; this rank's gradients named "qkv.weight",
        "qkv.bias", "proj.weight", "proj.bias")."""
        if self._cache is None:
            raise RuntimeError("call forward before backward")
        dheads, proj_grads = yield from self.proj.backward(comm, dout)
        dqkv = causal_attention_backward(dheads, self._cache)
        q = self._cache[0]
        yield from spend_flops(comm, 8 * q.size * q.shape[2], self.qkv.flop_rate)
        dx, qkv_grads = yield from self.qkv.backward(comm, dqkv)
        return dx, {"qkv.weight": qkv_grads["weight"], "qkv.bias": qkv_grads["bias"],
                    "proj.weight": proj_grads["weight"], "proj.bias": proj_grads["bias"]}


# -- cell 31
# How each parameter of a TransformerBlock is cut across tensor-parallel ranks.
BLOCK_PARTITION = {
    "ln1.weight": "replicated", "ln1.bias": "replicated",
    "attn.qkv.weight": "head columns", "attn.qkv.bias": "head columns",
    "attn.proj.weight": "head rows", "attn.proj.bias": "replicated",
    "ln2.weight": "replicated", "ln2.bias": "replicated",
    "mlp.fc.weight": "columns", "mlp.fc.bias": "columns",
    "mlp.proj.weight": "rows", "mlp.proj.bias": "replicated",
}


def _block_index(name: str, hidden: int, heads: int, tp: int, rank: int):
    """The index that cuts rank's shard of parameter `name` (see BLOCK_PARTITION)."""
    how = BLOCK_PARTITION[name]
    if how == "replicated":
        return ...
    if how == "head columns":
        columns = qkv_columns(hidden, heads, tp, rank)
        return (slice(None), columns) if name.endswith("weight") else columns
    if how == "head rows":
        first, last = shard_range(heads, tp, rank, "attention heads")
        d = hidden // heads
        return slice(first * d, last * d)
    start, stop = shard_range(4 * hidden, tp, rank, "MLP hidden units")
    if how == "columns":
        return (slice(None), slice(start, stop)) if name.endswith("weight") else slice(start, stop)
    return slice(start, stop)                            # "rows"


def _block_hidden(params) -> int:
    if "ln1.weight" not in params:
        raise ValueError("params must hold every parameter of a TransformerBlock; "
                         "'ln1.weight' is missing")
    return int(np.shape(params["ln1.weight"])[0])


def shard_block_params(params: dict, heads: int, tp: int, rank: int) -> dict:
    """Rank's shard of a TransformerBlock's parameters (same names, cut by BLOCK_PARTITION):
    its heads' QKV columns and output-projection rows, its columns of the MLP's first weight and
    rows of the second, and a copy of everything replicated (LayerNorms, the two output biases).
    Heads and MLP units are cut as np.array_split cuts them."""
    hidden = _block_hidden(params)
    check_block_shape(hidden, heads)
    check_tp(tp, rank)
    expected = block_param_shapes(hidden)
    if set(params) != set(expected):
        raise ValueError(f"params must have exactly the names of a TransformerBlock; missing "
                         f"{sorted(set(expected) - set(params))}, unknown "
                         f"{sorted(set(params) - set(expected))}")
    shard = {}
    for name, shape in expected.items():
        value = np.asarray(params[name])
        _check_same(value.shape, shape, f"params[{name!r}] (hidden = {hidden})")
        shard[name] = value[_block_index(name, hidden, heads, tp, rank)].copy()
    return shard


# -- cell 32
def gather_block_grads(grads_per_rank: list, heads: int) -> dict:
    """The whole block's gradients from every rank's shard gradients (rank order), the inverse
    of shard_block_params. Replicated parameters must have the same gradient on every rank."""
    tp = len(grads_per_rank)
    if tp < 1:
        raise ValueError("grads_per_rank must hold the gradients of at least one rank")
    hidden = _block_hidden(grads_per_rank[0])
    full = {}
    for name, shape in block_param_shapes(hidden).items():
        if BLOCK_PARTITION[name] == "replicated":
            for rank in range(1, tp):
                if not np.array_equal(grads_per_rank[rank][name], grads_per_rank[0][name]):
                    raise ValueError(f"replicated gradient {name} differs between rank 0 and "
                                     f"rank {rank}")
            full[name] = grads_per_rank[0][name].copy()
            continue
        full[name] = np.zeros(shape, dtype=grads_per_rank[0][name].dtype)
        for rank, grads in enumerate(grads_per_rank):
            full[name][_block_index(name, hidden, heads, tp, rank)] = grads[name]
    return full


def parallel_sublayers(params: dict, heads: int, tp: int, rank: int,
                       layers=(ColumnParallelLinear, RowParallelLinear), **options):
    """Rank `rank`'s attention (head-parallel: column-parallel QKV, row-parallel projection)
    and MLP (column- then row-parallel) of a block, from its shard of the parameters;
    `options` (flop_rate, algorithm) go to every linear layer. `layers` are the
    column- and row-parallel classes to build them from."""
    column, row = layers
    first, last = shard_range(heads, tp, rank, "attention heads")
    attention = ParallelAttention(
        column(params["attn.qkv.weight"], params["attn.qkv.bias"], tp, rank,
                             **options),
        row(params["attn.proj.weight"], params["attn.proj.bias"], tp, rank,
                          **options),
        last - first)
    mlp = ParallelMLP(
        column(params["mlp.fc.weight"], params["mlp.fc.bias"], tp, rank,
                             **options),
        row(params["mlp.proj.weight"], params["mlp.proj.bias"], tp, rank,
                          **options))
    return attention, mlp


# -- cell 33
class TensorParallelBlock:
    """A TransformerBlock split over tp ranks, Megatron-style: LayerNorms and residuals on every
    rank (replicated), attention head-parallel, the MLP column- then row-parallel. Two
    all-reduces forward (after attention, after the MLP) and two backward.

    `params` is this rank's shard (shard_block_params); `heads` the block's total heads."""

    def __init__(self, params: dict, heads: int, tp: int, rank: int, flop_rate=None,
                 algorithm: str = "ring"):
        check_tp(tp, rank)
        self.hidden = _block_hidden(params)
        check_block_shape(self.hidden, heads)
        self.tp, self.rank, self.heads = int(tp), int(rank), int(heads)
        self.ln = {name: params[name] for name in ("ln1.weight", "ln1.bias", "ln2.weight",
                                                   "ln2.bias")}
        self.attention, self.mlp = parallel_sublayers(params, heads, tp, rank,
                                                      flop_rate=flop_rate, algorithm=algorithm)
        self._cache = None

    @classmethod
    def from_full(cls, params: dict, heads: int, tp: int, rank: int, **options):
        """Rank's shard of a whole block's parameters (e.g. TransformerBlock.params)."""
        return cls(shard_block_params(params, heads, tp, rank), heads, tp, rank, **options)

    def forward(self, comm, x):
        """Rank program piece: the block's output (b, s, h), the same on every rank."""
        check_comm(comm, self.tp, self.rank, "TensorParallelBlock")
        x = np.asarray(x)
        if x.ndim != 3 or x.shape[-1] != self.hidden:
            raise ValueError(f"expected x of shape (batch, seq, {self.hidden}), got {x.shape}")
        ln1, ln1_cache = layer_norm_forward(x, self.ln["ln1.weight"], self.ln["ln1.bias"])
        a = x + (yield from self.attention.forward(comm, ln1))
        ln2, ln2_cache = layer_norm_forward(a, self.ln["ln2.weight"], self.ln["ln2.bias"])
        y = a + (yield from self.mlp.forward(comm, ln2))
        self._cache = (ln1_cache, ln2_cache, x.shape)
        return y

    def backward(self, comm, dy):
        """Rank program piece: (dL/dx, the same on every rank; this rank's shard gradients,
        named as the parameters)."""
        check_comm(comm, self.tp, self.rank, "TensorParallelBlock")
        if self._cache is None:
            raise RuntimeError("call forward before backward")
        ln1_cache, ln2_cache, shape = self._cache
        dy = np.asarray(dy)
        _check_same(dy.shape, shape, "dy (the block's output)")
        grads = {}
        dln2, mlp_grads = yield from self.mlp.backward(comm, dy)
        dln2_in, grads["ln2.weight"], grads["ln2.bias"] = layer_norm_backward(dln2, ln2_cache)
        da = dy + dln2_in
        dln1, attention_grads = yield from self.attention.backward(comm, da)
        dln1_in, grads["ln1.weight"], grads["ln1.bias"] = layer_norm_backward(dln1, ln1_cache)
        grads.update({f"mlp.{k}": v for k, v in mlp_grads.items()})
        grads.update({f"attn.{k}": v for k, v in attention_grads.items()})
        return da + dln1_in, {name: grads[name] for name in BLOCK_PARTITION}


# -- cell 34
def tensor_parallel_block_step(comm, params: dict, heads: int, x, dout, flop_rate=None,
                               algorithm: str = "ring"):
    """Rank program: cut this rank's shard of a whole block's `params` (tp = comm.size), run
    forward on x (b, s, h) and backward on dout = dL/dy. Returns a dict: "output" y,
    "input_grad" dL/dx (both the same on every rank), "grads" this rank's shard gradients,
    "forward_end" the time (s) forward ended on this rank."""
    block = TensorParallelBlock.from_full(params, heads, comm.size, comm.rank,
                                          flop_rate=flop_rate, algorithm=algorithm)
    y = yield from block.forward(comm, x)
    forward_end = yield comm.now()
    dx, grads = yield from block.backward(comm, dout)
    return {"output": y, "input_grad": dx, "grads": grads, "forward_end": forward_end}


# -- cell 36
from dsml.collectives import cost

# The model: per block and pass, one all-reduce after attention and one after the MLP (g
# forward, f backward), each of the whole activation, b·s·h numbers.
ALLREDUCES_PER_BLOCK = {"forward": 2, "backward": 2}


def block_forward_flops(batch: int, seq: int, hidden: int) -> int:
    """Matmul FLOPs of one block's forward pass (multiply-add = 2): QKV 6bsh², attention
    4bs²h, output projection 2bsh², MLP 16bsh² — 24bsh² + 4bs²h; backward costs twice that
    (Narayanan et al. 2021, eq. 3's per-layer term). Elementwise work is left out."""
    b, s, h = batch, seq, hidden
    return 24 * b * s * h * h + 4 * b * s * s * h


def allreduce_nbytes(batch: int, seq: int, hidden: int, itemsize: int = 8) -> int:
    """Bytes of each tensor-parallel all-reduce: the whole activation, b·s·h numbers."""
    return batch * seq * hidden * itemsize


def tp_block_bytes_per_rank(batch: int, seq: int, hidden: int, tp: int,
                            itemsize: int = 8) -> float:
    """Bytes one rank sends for a block's forward and backward with ring all-reduces:
    4 all-reduces × 2(t − 1)/t × b·s·h·itemsize (a ring rank sends 2(t − 1) blocks of n/t)."""
    n = allreduce_nbytes(batch, seq, hidden, itemsize)
    per_pass = sum(ALLREDUCES_PER_BLOCK.values())
    return per_pass * 2 * (tp - 1) / tp * n


def tp_block_comm_seconds(batch: int, seq: int, hidden: int, tp: int, alpha: float,
                          beta: float, gamma: float = 0.0, itemsize: int = 8,
                          algorithm: str = "ring") -> float:
    """Closed-form communication time (s) of a block's forward and backward: 4 all-reduces of
    b·s·h·itemsize bytes, each priced by dsml.collectives.cost (α–β–γ, Thakur et al. 2005)."""
    n = allreduce_nbytes(batch, seq, hidden, itemsize)
    per_pass = sum(ALLREDUCES_PER_BLOCK.values())
    return per_pass * cost("allreduce", algorithm, tp, n, alpha, beta, gamma)


# The measurement: read from a run's trace, never from the formulas above.
SENDING_OPS = ("send", "sendrecv")                        # records that put bytes on the wire
COLLECTIVE_OPS = ("send", "recv", "sendrecv", "combine")  # what a collective is made of


def bytes_sent(trace, rank=None, start: float = 0.0, end: float = float("inf")) -> int:
    """Bytes that `rank` (every rank if None) sent in messages that started in [start, end) s,
    summed over the trace's send and sendrecv records."""
    return sum(r.nbytes for r in trace
               if r.op in SENDING_OPS and (rank is None or r.rank == rank) and start <= r.start < end)


# -- cell 37
def count_collectives(trace, rank: int, start: float = 0.0, end: float = float("inf")) -> int:
    """How many separate bursts of communication `rank` made in [start, end) s: maximal runs of
    message records with no compute record between them. Each collective is one burst when the
    program computes between its collectives (run the layers with a flop_rate)."""
    records = sorted((r for r in trace if r.rank == rank and start <= r.start < end),
                     key=lambda r: (r.start, r.end))
    bursts, inside = 0, False
    for record in records:
        if record.op in COLLECTIVE_OPS:
            if not inside:
                bursts += 1
            inside = True
        elif record.op == "compute":
            inside = False
    return bursts


# -- cell 210
from functools import partial

from dsml.collectives import allgather, reduce_scatter


def sequence_shard(x, tp: int, rank: int):
    """Rank's positions of x (b, s, ...) along the sequence axis: s/t consecutive positions.
    Sequence parallelism needs t to divide s (every rank's shard is one ring block)."""
    check_tp(tp, rank)
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[1] % tp:
        raise ValueError(f"sequence parallelism cuts the sequence into tp = {tp} equal shards, "
                         f"but x of shape {x.shape} has sequence length "
                         f"{x.shape[1] if x.ndim > 1 else 'none'}; pad it to a multiple of {tp}")
    size = x.shape[1] // tp
    return x[:, rank * size:(rank + 1) * size]


def gather_sequence(comm, shard, algorithm: str = "ring"):
    """g forward (and ḡ backward): all-gather the ranks' sequence shards (b, s/t, h) into the
    whole (b, s, h). The collective gathers along axis 0, so the sequence is moved there."""
    whole = yield from allgather(comm, np.ascontiguousarray(np.swapaxes(shard, 0, 1)), algorithm)
    return np.swapaxes(whole, 0, 1)


def scatter_sequence(comm, partial_sum, algorithm: str = "ring"):
    """ḡ forward (and g backward): reduce-scatter — sum the ranks' (b, s, h) and keep this
    rank's s/t positions of the sum."""
    seq_first = np.ascontiguousarray(np.swapaxes(partial_sum, 0, 1))
    mine = yield from reduce_scatter(comm, seq_first, "sum", algorithm)
    return np.swapaxes(mine, 0, 1)


# -- cell 211
class SequenceParallelColumn(ColumnParallelLinear):
    """A column-parallel layer whose input arrives as sequence shards: g (all-gather) replaces
    the identity f, and g's conjugate (reduce-scatter) replaces f's all-reduce in backward.
    regather=True keeps only the shard for backward and all-gathers it again there."""

    def __init__(self, *args, regather: bool = True, **options):
        super().__init__(*args, **options)
        self.regather = bool(regather)

    def forward(self, comm, x_shard):
        check_comm(comm, self.tp, self.rank, "SequenceParallelColumn")
        x = yield from gather_sequence(comm, np.asarray(x_shard), self.algorithm)
        y = yield from super().forward(comm, x)          # f is the identity: no message
        if self.regather:
            self._x = np.asarray(x_shard)
        return y

    def backward(self, comm, dy):
        check_comm(comm, self.tp, self.rank, "SequenceParallelColumn")
        if self._x is None:
            raise RuntimeError("call forward before backward")
        x = (yield from gather_sequence(comm, self._x, self.algorithm)) if self.regather \
            else self._x
        dx_partial, dweight, dbias = linear_backward(np.asarray(dy), x, self.weight)
        yield from spend_flops(comm, 2 * matmul_flops(x, self.weight), self.flop_rate)
        dx_shard = yield from scatter_sequence(comm, dx_partial, self.algorithm)
        return dx_shard, {"weight": dweight, "bias": dbias}


# -- cell 212
class SequenceParallelRow(RowParallelLinear):
    """A row-parallel layer whose output leaves as sequence shards: ḡ (reduce-scatter)
    replaces g's all-reduce; backward all-gathers dL/dZ (ḡ's conjugate). The bias is added
    to the rank's positions; its gradient, from the gathered dL/dZ, is whole on every rank."""

    def forward(self, comm, x_shard):
        check_comm(comm, self.tp, self.rank, "SequenceParallelRow")
        self._x = np.asarray(x_shard)
        partial_sum = linear_forward(self._x, self.weight)
        yield from spend_flops(comm, matmul_flops(self._x, self.weight), self.flop_rate)
        mine = yield from scatter_sequence(comm, partial_sum, self.algorithm)
        return mine + self.bias

    def backward(self, comm, dz_shard):
        dz = yield from gather_sequence(comm, np.asarray(dz_shard), self.algorithm)
        return (yield from super().backward(comm, dz))


NORM_PARAMS = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias")


class SequenceParallelBlock(TensorParallelBlock):
    """TensorParallelBlock with Korthikanti et al.'s sequence parallelism: LayerNorms and
    residuals on this rank's s/t positions; forward takes and returns (b, s/t, h) shards.
    Per block: forward 2 all-gathers + 2 reduce-scatters, backward the same (+2 all-gathers
    with regather), then one all-reduce of the LayerNorms' 4h parameter gradients."""

    def __init__(self, params: dict, heads: int, tp: int, rank: int, flop_rate=None,
                 algorithm: str = "ring", regather: bool = True):
        super().__init__(params, heads, tp, rank, flop_rate, algorithm)
        self.algorithm = algorithm
        self.attention, self.mlp = parallel_sublayers(
            params, heads, tp, rank, layers=(partial(SequenceParallelColumn, regather=regather),
                                             SequenceParallelRow),
            flop_rate=flop_rate, algorithm=algorithm)

    def forward(self, comm, x_shard):
        """Rank program piece: this rank's positions of the block's output, (b, s/t, h)."""
        return (yield from super().forward(comm, x_shard))

    def backward(self, comm, dy_shard):
        """Rank program piece: (dL/dx for this rank's positions; its shard gradients)."""
        dx_shard, grads = yield from super().backward(comm, dy_shard)
        partial_norms = np.concatenate([grads[name] for name in NORM_PARAMS])
        norms = yield from allreduce(comm, partial_norms, op="sum", algorithm=self.algorithm)
        for name, piece in zip(NORM_PARAMS, np.split(norms, len(NORM_PARAMS))):
            grads[name] = piece
        return dx_shard, grads


# -- cell 213
from dsml.train.transformer import arrays_in, held_bytes


def activations_held(block) -> int:
    """Bytes of the distinct arrays a (tensor- or sequence-parallel) block keeps between
    forward and backward: its LayerNorm caches and every sub-layer's, parameters left out."""
    keep = [block._cache[:2], block.attention._cache, block.attention.qkv._x,
            block.attention.proj._x, block.mlp._pre, block.mlp.fc._x, block.mlp.proj._x]
    return held_bytes(arrays_in(keep, block.ln))


def parallel_block_step(comm, params: dict, heads: int, x, dout, sequence_parallel=True,
                        regather=True, flop_rate=None, algorithm: str = "ring"):
    """Rank program: the tensor-parallel block (sequence_parallel=False) or the sequence-parallel
    one on the whole x and dout (b, s, h), cut here. Returns a dict: "output" and "input_grad"
    (this rank's positions with sequence parallelism, else whole), "grads", "forward_end" (s)
    and "held", the activation bytes kept between forward and backward."""
    t, r = comm.size, comm.rank
    if sequence_parallel:
        x, dout = sequence_shard(x, t, r), sequence_shard(dout, t, r)
        block = SequenceParallelBlock(shard_block_params(params, heads, t, r), heads, t, r,
                                      flop_rate, algorithm, regather)
    else:
        block = TensorParallelBlock.from_full(params, heads, t, r, flop_rate=flop_rate,
                                              algorithm=algorithm)
    y = yield from block.forward(comm, x)
    forward_end, held = (yield comm.now()), activations_held(block)
    dx, grads = yield from block.backward(comm, dout)
    return {"output": y, "input_grad": dx, "grads": grads, "forward_end": forward_end,
            "held": held}
