"""Generated from notebooks/week4_async_and_parameter_servers.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 5
from dsml.comm.sim_engine import SimEngine
from dsml.sim import Thrown
from dsml.utils import add_to_class


class PeerFailed(Exception):
    """Raised in a rank program by a receive from a rank that has failed (failures="notify");
    `.rank` is the failed rank, and the exception it raised is the __cause__."""

    def __init__(self, rank: int, error: BaseException):
        self.rank = rank
        super().__init__(f"rank {rank} failed: {type(error).__name__}: {error}")
        self.__cause__ = error

    def __reduce__(self):          # pickled by the processes engine: rebuild from both parts
        return type(self), (self.rank, self.__cause__)


@add_to_class(SimEngine)
def on_rank_failure(self, process, error) -> bool:
    """A process of rank `process.pid` raised: end the rank, and tell its peers through
    their receives (see the text above). Returns True: the simulation goes on."""
    rank, now = process.pid, self.sim.now
    if rank in self.failed:                      # another activity of a rank already gone
        return True
    notice = self.failed[rank] = Thrown(PeerFailed(rank, error))
    self.record(rank, "failed", now)
    for other in self.sim.processes:             # the rank's other activities end with it
        if other.pid == rank and other is not process and not other.done:
            other.gen.close()
            other.done, other.finish_time, other.value = True, now, error
    for dst in range(self.world_size):
        if dst == rank or dst in self.failed:
            continue
        if getattr(self.network, "route", None) is None:
            # One hop, and a send completes only when its message is delivered: nothing the
            # rank sent is still on its way, so the notice is there at once.
            self.notice_arrives((rank, dst))
        else:
            # A multi-hop network: the notice travels the route as an empty message, behind
            # whatever the rank sent before (links are first come, first served).
            self.network.transmit(rank, dst, 0, _nothing, self.notice_arrives, (rank, dst))
    return True


# -- cell 6
def _nothing(_=None) -> None:
    """The notice's `on_sent`: a dead rank has nothing to resume."""


@add_to_class(SimEngine)
def notice_arrives(self, ranks) -> None:
    """The notice that `rank` failed reaches `dst` (ranks = (rank, dst)): every receive dst has
    posted for that rank raises it, and so does dst's first waiting receive from any source —
    or, if none waits, its next one."""
    rank, dst = ranks
    notice = self.notices[dst][rank] = self.failed[rank]
    if dst in self.failed:                       # dst has failed meanwhile
        return
    now = self.sim.now
    for key in [key for key in self.posted[dst] if key[0] == rank]:
        for callback in self.posted[dst].pop(key):
            self.sim.at(now, callback, notice)
    waiting = next((queue for queue in self.any_posted[dst].values() if queue), None)
    if waiting:
        self.sim.at(now, waiting.popleft(), notice)
    else:
        unnotified = self.__dict__.setdefault("unnotified",
                                              [set() for _ in range(self.world_size)])
        unnotified[dst].add(rank)
