"""Generated from notebooks/week4_async_and_parameter_servers.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 3
from collections import deque

from dsml.comm.api import ADDED_REQUESTS, Comm, Request, payload_nbytes
from dsml.comm.sim_engine import SimEngine
from dsml.sim import PENDING, Thrown
from dsml.utils import add_to_class


class RecvAny(Request):
    """Receive the next message with tag `tag`, from whichever rank sent it; the answer is
    (source, payload)."""
    __slots__ = ("tag",)

    def __init__(self, tag):
        self.tag = tag

    def describe(self):
        return f"waits for a message from any rank (tag {self.tag})"


@add_to_class(Comm)
def recv_any(self, tag: int = 0) -> RecvAny:
    """Request: the next message with `tag` from any rank; yielding it answers (src, payload)."""
    return RecvAny(self._tag(tag))


@add_to_class(SimEngine)
def on_recv_any(self, process, req):
    rank, tag, start = process.pid, req.tag, self.sim.now
    unnotified = self.__dict__.get("unnotified")
    if unnotified and unnotified[rank]:          # a peer failed: say so once (failures.py)
        self.sim.at(start, process.resume, self.failed[min(unnotified[rank])])
        unnotified[rank].discard(min(unnotified[rank]))
        return PENDING
    mailbox = self.mailbox[rank]
    order = self.arrivals[rank].get(tag)
    if order is None:        # the first ask for this tag: what came before, lowest source first
        order = self.arrivals[rank][tag] = deque(
            src for (src, t), box in sorted(mailbox.items()) if t == tag for _ in box)
    while order:             # the earliest arrival still waiting (recv(src) may have taken some)
        src = order.popleft()
        box = mailbox.get((src, tag))
        if box:
            payload = box.popleft()
            self.record(rank, "recv", start, src, rank, payload_nbytes(payload), tag)
            return src, payload

    def arrived(src, payload=None):
        if isinstance(src, Thrown):              # called with a failure notice instead
            process.resume(src)
            return
        self.record(rank, "recv", start, src, rank, payload_nbytes(payload), tag)
        process.resume((src, payload))
    self.any_posted[rank].setdefault(tag, deque()).append(arrived)
    return PENDING


ADDED_REQUESTS[RecvAny] = "recv_any"
