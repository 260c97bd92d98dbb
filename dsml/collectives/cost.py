"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.allgather import ALLGATHER_ALGORITHMS
from dsml.collectives.allreduce import ALLREDUCE_ALGORITHMS
from dsml.collectives.broadcast import BROADCAST_ALGORITHMS
from dsml.collectives.buffers import check_algorithm, lg
from dsml.collectives.reduce import REDUCE_ALGORITHMS
from dsml.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS


# -- cell 38
import math

from dsml.validate_args import integer, positive_number

COLLECTIVE_ALGORITHMS = {
    "broadcast": BROADCAST_ALGORITHMS, "reduce": REDUCE_ALGORITHMS,
    "allreduce": ALLREDUCE_ALGORITHMS, "allgather": ALLGATHER_ALGORITHMS,
    "reduce_scatter": REDUCE_SCATTER_ALGORITHMS, "alltoall": ("pairwise",),
}


def cost(op: str, algorithm: str, p: int, nbytes: float, alpha: float, beta: float,
         gamma: float = 0.0, chunks: int = 4) -> float:
    """Closed-form time (s) of a collective under the α–β–γ model, single-port full-duplex
    (Thakur, Rabenseifner & Gropp 2005). `nbytes`: the vector a rank holds (broadcast,
    reduce, all-reduce, reduce-scatter), the gathered total (all-gather), or a rank's whole
    send buffer (all-to-all). Exact for p a power of two and n divisible by p; lg p is
    rounded up otherwise."""
    if op not in COLLECTIVE_ALGORITHMS:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(COLLECTIVE_ALGORITHMS)}")
    check_algorithm(op, algorithm, COLLECTIVE_ALGORITHMS[op])
    p, chunks = integer("p", p, 1), integer("chunks", chunks, 1)
    for name, value in (("nbytes", nbytes), ("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        positive_number(name, value, allow_zero=True)
    if p == 1:
        return 0.0
    n, L = nbytes, lg(p)
    frac = (p - 1) / p
    table = {
        ("broadcast", "naive"): (p - 1) * (alpha + n * beta),
        ("broadcast", "binomial"): L * (alpha + n * beta),
        ("broadcast", "scatter_allgather"): (L + p - 1) * alpha + 2 * frac * n * beta,
        ("broadcast", "chain"): (p - 2 + chunks) * (alpha + n * beta / chunks),
        ("reduce", "naive"): (p - 1) * (alpha + n * beta) + (p - 1) * n * gamma,
        ("reduce", "binomial"): L * (alpha + n * beta + n * gamma),
        ("reduce", "rabenseifner"): 2 * L * alpha + 2 * frac * n * beta + frac * n * gamma,
        ("allreduce", "naive"): 2 * (p - 1) * (alpha + n * beta) + (p - 1) * n * gamma,
        ("allreduce", "ring"): 2 * (p - 1) * alpha + 2 * frac * n * beta + frac * n * gamma,
        ("allreduce", "recursive_doubling"): L * (alpha + n * beta + n * gamma),
        ("allreduce", "halving_doubling"): 2 * L * alpha + 2 * frac * n * beta + frac * n * gamma,
        ("allreduce", "tree"): 2 * L * (alpha + n * beta) + L * n * gamma,
        ("allgather", "ring"): (p - 1) * alpha + frac * n * beta,
        ("allgather", "recursive_doubling"): L * alpha + frac * n * beta,
        ("reduce_scatter", "ring"): (p - 1) * alpha + frac * n * (beta + gamma),
        ("reduce_scatter", "recursive_halving"): L * alpha + frac * n * (beta + gamma),
        ("alltoall", "pairwise"): (p - 1) * (alpha + n / p * beta),
    }
    return table[(op, algorithm)]


# -- cell 39
def best_algorithm(op: str, p: int, nbytes: float, alpha: float, beta: float,
                   gamma: float = 0.0) -> str:
    """The algorithm with the smallest closed-form cost (ties: the first listed), as MPI
    libraries' and NCCL's tuning tables choose by (p, n)."""
    times = {a: cost(op, a, p, nbytes, alpha, beta, gamma)
             for a in COLLECTIVE_ALGORITHMS.get(op, ())}
    if not times:
        cost(op, "", p, nbytes, alpha, beta, gamma)    # raises the unknown-op error
    return min(times, key=times.get)


# -- cell 58
# busbw / algbw per collective (nccl-tests' doc/PERFORMANCE.md): the share of the size S that an
# optimal algorithm pushes through each rank's port.
BUSBW_FACTORS = {"allreduce": "2(p-1)/p", "allgather": "(p-1)/p", "reduce_scatter": "(p-1)/p",
                 "alltoall": "(p-1)/p", "broadcast": "1", "reduce": "1"}


def busbw_factor(collective: str, p: int) -> float:
    """busbw = algbw × this factor: it makes an optimal algorithm's busbw equal the link
    bandwidth whatever p is (BUSBW_FACTORS gives the formulas, for printing)."""
    if collective not in BUSBW_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; choose one of "
                         f"{', '.join(BUSBW_FACTORS)}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be an integer ≥ 1, got {p!r}")
    if collective == "allreduce":
        return 2 * (p - 1) / p
    return 1.0 if BUSBW_FACTORS[collective] == "1" else (p - 1) / p
