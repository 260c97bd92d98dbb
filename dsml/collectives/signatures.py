"""Plumbing (hand-written): each call of a collective says what it is, so that ranks calling
different ones are told what differs.

Every collective sends its messages with the collectives' tag (`COLLECTIVE_TAG`). Ranks that
called different collectives, or one collective with a different algorithm, root or op, could
then match each other's messages, and a rank noticed at best that a block had the wrong size
("rank 1 passed shape (4,) float64, which does not match another rank's") — or, with equal
sizes, went on with the wrong data. So each call of a collective exported by
`dsml.collectives` sends on a tag of its own that encodes its *signature*: the collective and
its arguments other than the array (algorithm, root, op, chunks, …; `SCHEMAS`). Ranks whose
calls agree use the same tag and nothing changes; ranks whose calls differ never match a
message: each waits for the other, the engine reports a deadlock (at once on sim, threads and
processes), and the report decodes the tags into calls — "rank 0 called allreduce(op='sum',
algorithm='ring'), rank 1 called broadcast(root=0, algorithm='binomial')"
(`dsml.comm.tags.differing`). Shapes and dtypes are not in the tag: ranks that pass different
ones to the same call are told by the size check on arrival, which names both.

The tag is computed once per distinct set of arguments (a dict lookup afterwards), and the
collective gets `comm` wrapped (`Signed`) so that its sends and receives use it: on
`processes` that is about a microsecond a call (benchmarks/small_messages.py). A tag is
`SIGNATURE_BASE` plus the collective's number and each argument's value packed in bits, so any
process can read it back (`describe`) — the parent of the processes engine included, which
writes the deadlock report. Tags stay below 2**63, as the engines' raw message heads need.
"""
from __future__ import annotations

import numbers

from dsml.collectives.auto import auto_algorithm
from dsml.collectives.allgather import ALLGATHER_ALGORITHMS
from dsml.collectives.allreduce import ALLREDUCE_ALGORITHMS
from dsml.collectives.broadcast import BROADCAST_ALGORITHMS
from dsml.collectives.buffers import COLLECTIVE_TAG
from dsml.collectives.checks import op_name
from dsml.collectives.hierarchical import HIERARCHICAL_SCHEMES
from dsml.collectives.reduce import REDUCE_ALGORITHMS
from dsml.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS
from dsml.collectives.rooted import (BARRIER_ALGORITHMS, GATHER_ALGORITHMS,
                                     SCATTER_ALGORITHMS)
from dsml.comm.tags import TAG_DECODERS

SIGNATURE_BASE = 1 << 56
OP_NAMES = ("sum", "mean", "prod", "max", "min")
ROOT, CHUNKS = ("int", 24), ("int", 16)

# Each collective's arguments after the array, in order, with how each is packed: a choice
# among names (4 bits: 0 for a value not among them) or an integer of so many bits.
SCHEMAS = {
    "broadcast": (("root", ROOT), ("algorithm", BROADCAST_ALGORITHMS), ("chunks", CHUNKS)),
    "reduce": (("root", ROOT), ("op", OP_NAMES), ("algorithm", REDUCE_ALGORITHMS)),
    "allreduce": (("op", OP_NAMES), ("algorithm", ALLREDUCE_ALGORITHMS + ("auto",))),
    "allgather": (("algorithm", ALLGATHER_ALGORITHMS),),
    "reduce_scatter": (("op", OP_NAMES), ("algorithm", REDUCE_SCATTER_ALGORITHMS)),
    "alltoall": (),
    "allreduce_hierarchical": (("per_node", CHUNKS), ("op", OP_NAMES),
                               ("scheme", HIERARCHICAL_SCHEMES)),
    "gather": (("root", ROOT), ("algorithm", GATHER_ALGORITHMS)),
    "scatter": (("root", ROOT), ("algorithm", SCATTER_ALGORITHMS)),
    "barrier": (("algorithm", BARRIER_ALGORITHMS),),
}
NAMES = tuple(SCHEMAS)                       # a collective's number is its index + 1
_WITHOUT_ARRAY = {"barrier"}                 # collectives whose first argument is no array
# The tags a collective's own code sends on: COLLECTIVE_TAG, and the per-op tags of checks.py.
_LOW, _HIGH = COLLECTIVE_TAG, COLLECTIVE_TAG + len(OP_NAMES) - 1
_KEPT = 4096            # communicators whose Signed objects `signer` keeps


def _width(kind) -> int:
    return kind[1] if kind[0] == "int" else 4


def encode(name: str, values) -> int:
    """The tag of a call of collective `name` with these argument values (SCHEMAS order)."""
    tag, shift = NAMES.index(name) + 1, 5
    for (_, kind), value in zip(SCHEMAS[name], values):
        width = _width(kind)
        if kind[0] == "int":
            field = int(value) % (1 << width) if isinstance(value, numbers.Integral) \
                and not isinstance(value, bool) else 0
        else:
            value = op_name(value) if kind is OP_NAMES else value     # "avg" is "mean"
            field = kind.index(value) + 1 if isinstance(value, str) and value in kind else 0
        tag |= field << shift
        shift += width
    return SIGNATURE_BASE + tag


def describe(tag) -> str | None:
    """The call a signature tag stands for, e.g. "allreduce(op='sum', algorithm='ring')";
    None for any other tag."""
    if not isinstance(tag, int) or not SIGNATURE_BASE <= tag < 2 * SIGNATURE_BASE:
        return None
    bits = tag - SIGNATURE_BASE
    number = bits & 31
    if not 1 <= number <= len(NAMES):
        return None
    name, shift, parts = NAMES[number - 1], 5, []
    for param, kind in SCHEMAS[name]:
        width = _width(kind)
        field = (bits >> shift) & ((1 << width) - 1)
        shift += width
        if kind[0] == "int":
            parts.append(f"{param}={field}")
        else:
            parts.append(f"{param}={kind[field - 1]!r}" if field else f"{param}=?")
    return f"{name}({', '.join(parts)})"


TAG_DECODERS.append(describe)


class Signed:
    """`comm` with the collectives' tags replaced by one call's signature tag (see the
    module's text); everything else is `comm`'s."""
    __slots__ = ("_comm", "_tag", "rank", "size", "combine", "compute")

    def __init__(self, comm, tag: int):
        self._comm, self._tag = comm, tag
        self.rank, self.size = comm.rank, comm.size
        # What the collectives ask for at every step, at the cost of a slot (not __getattr__).
        self.combine, self.compute = comm.combine, comm.compute

    def send(self, dst, payload, tag=0):
        return self._comm.send(dst, payload, self._tag if _LOW <= tag <= _HIGH else tag)

    def recv(self, src, tag=0):
        return self._comm.recv(src, self._tag if _LOW <= tag <= _HIGH else tag)

    def sendrecv(self, dst, payload, src, tag=0):
        return self._comm.sendrecv(dst, payload, src,
                                   self._tag if _LOW <= tag <= _HIGH else tag)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def signer(name: str):
    """`sign(comm, *args)` for collective `name`: `comm` wrapped to send on the call's
    signature tag (args as the collective takes them after `comm`, defaults filled in)."""
    schema = SCHEMAS[name]
    skip = 0 if name in _WITHOUT_ARRAY else 1
    # comm -> {arguments -> its Signed}: a rank's program calls with the same comm and the
    # same arguments again and again, and then gets the same Signed (no tag to work out, no
    # object to make). Emptied when it holds many communicators (runs come and go).
    made = {}

    def sign(comm, *args):
        key = args[skip:]
        if name == "allreduce" and "auto" in key:
            # The algorithm "auto" runs, as every rank works it out: ranks that name it and
            # ranks that get it by "auto" agree, and ranks whose "auto" differs are told so.
            key = tuple(auto_algorithm(comm, name, args[0]) if value == "auto" else value
                        for value in key)
        try:
            return made[comm][key]
        except KeyError:
            if len(made) >= _KEPT:
                made.clear()
            signed = made.setdefault(comm, {})[key] = Signed(comm, encode(name, key[:len(schema)]))
            return signed
        except TypeError:          # something unhashable: the collective will refuse it
            return Signed(comm, encode(name, key[:len(schema)]))

    sign.__name__ = f"sign_{name}"
    return sign
