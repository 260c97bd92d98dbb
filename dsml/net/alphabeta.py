"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 40
from heapq import heappush

from dsml.validate_args import positive_number


def check_time_parameter(name: str, value: float) -> float:
    """A latency or per-byte time: a finite number ≥ 0 (seconds or seconds per byte)."""
    return positive_number(name, value, allow_zero=True)


class AlphaBeta:
    """The Hockney α–β model, single-port and full-duplex.

    An n-byte message occupies the sender's out-port and the receiver's in-port together
    for α + nβ seconds (α in s, β in s/byte). A rank sends one message and receives one
    message at a time; messages wait for both ports, first come first served (ties in the
    order they were issued). `gamma` (s/byte) is the reduction cost that collectives charge.
    """

    def __init__(self, alpha: float, beta: float, gamma: float = 0.0):
        self.alpha = check_time_parameter("alpha", alpha)
        self.beta = check_time_parameter("beta", beta)
        self.gamma = check_time_parameter("gamma", gamma)

    def __repr__(self):
        return f"AlphaBeta(alpha={self.alpha:g}, beta={self.beta:g}, gamma={self.gamma:g})"

    def message_time(self, nbytes: int) -> float:
        """α + nβ: the model's time for one uncontended message (the formula, for plots)."""
        return self.alpha + nbytes * self.beta

    def attach(self, sim, world_size: int) -> None:
        """Start a run: every port free at time 0."""
        self.sim = sim
        self.out_free = [0.0] * world_size
        self.in_free = [0.0] * world_size

    def transmit(self, src: int, dst: int, nbytes: int, on_sent, on_delivered, message) -> None:
        """Carry one message: call on_sent(None) when it has left src and
        on_delivered(message) when it has fully arrived at dst (here the same instant)."""
        sim = self.sim
        start = max(sim.now, self.out_free[src], self.in_free[dst])
        end = start + self.alpha + nbytes * self.beta
        self.out_free[src] = end
        self.in_free[dst] = end
        # Both happen at `end`: one event does both (deliver first, then release the sender).
        # (sim.at inlined, once per message: end ≥ now by construction.)
        heappush(sim._heap, (end, next(sim._sequence), self._complete,
                             (on_sent, on_delivered, message)))

    @staticmethod
    def _complete(event) -> None:
        on_sent, on_delivered, message = event
        on_delivered(message)
        on_sent(None)
