"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.membership_store import STORE_TAG, membership_store, next_request, propose, read_store


# -- cell 110
import copy
import zlib

import numpy as np

from dsml.comm.api import snapshot
from dsml.comm.failures import PeerFailed
from dsml.data_parallel import flatten, shard_bounds, unflatten
from dsml.train.models import loss_and_grads
from dsml.utils import add_to_class

UP, DOWN = 70, 71           # tags: messages towards the leader, and from the leader
RULES = ("global", "linear")
RESTORES = ("checkpoint", "replica")


class InjectedCrash(RuntimeError):
    """The failure a crash schedule injects: a rank raises it and ends (fail-stop)."""


class TrainingLost(RuntimeError):
    """Elastic training ended with no rank holding a finished model: every member failed, or
    the survivors held no replica or checkpoint to resume from. The message says what happened."""


def stream_batch(n_examples: int, cursor: int, size: int, seed: int) -> np.ndarray:
    """Indices of the `size` samples at positions cursor … cursor+size−1 of the data stream:
    pass after pass over the n_examples, each pass a fresh seeded permutation. The cursor is
    the data loader's position: a checkpoint holds it, so a restored run reads on from there."""
    if n_examples < 1 or cursor < 0 or size < 0:
        raise ValueError(f"need n_examples ≥ 1, cursor ≥ 0 and size ≥ 0, got n_examples="
                         f"{n_examples}, cursor={cursor}, size={size}")
    positions = np.arange(cursor, cursor + size)
    out = np.empty(size, dtype=np.int64)
    for epoch in np.unique(positions // n_examples):
        here = positions // n_examples == epoch
        order = np.random.default_rng([seed, int(epoch)]).permutation(n_examples)
        out[here] = order[positions[here] % n_examples]
    return out


def scaled(rule: str, batch: int, lr: float, members: int, initial_members: int):
    """(global batch in samples, learning rate) for a membership of `members` ranks.
    rule "global": keep the global batch `batch` and the lr (each rank's share grows as ranks
    leave: the trajectory does not depend on the membership). rule "linear": keep the per-rank
    batch `batch`, so the global batch is batch·members, and scale the lr with it (Goyal et al.
    2017's linear scaling rule, relative to the initial membership): lr·members/initial_members."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if batch < 1 or members < 1 or initial_members < 1:
        raise ValueError(f"need batch, members and initial_members ≥ 1, got batch={batch}, "
                         f"members={members}, initial_members={initial_members}")
    if rule == "global":
        return batch, lr
    return batch * members, lr * members / initial_members


# -- cell 111
import time

CRASH_POINTS = ("step", "reply", "rendezvous", "commit")


def check_crashes(crashes, world_size: int) -> dict:
    """Validate a crash schedule {rank: (point, number)}: point "step" (raise at the start of
    step `number`, before computing), "reply" (after sending step `number`'s gradient; a
    leader: after sending the step's result to the more junior half of the workers) or
    "rendezvous" (in the rendezvous that makes epoch `number`: a worker after sending its
    report, a leader after sending the new membership to the first half — in the final
    rendezvous, before its first message: see CrashingRank) or "commit" (a leader, just
    before it commits the membership of epoch `number`)."""
    crashes = dict(crashes or {})
    for rank, spec in crashes.items():
        if not 0 <= rank < world_size:
            raise ValueError(f"crashes: rank {rank} is not in 0..{world_size - 1}")
        if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] in CRASH_POINTS
                and int(spec[1]) >= 0):
            raise ValueError(f"crashes[{rank}] must be (point, number ≥ 0) with point in "
                             f"{CRASH_POINTS}, got {spec!r}")
    return crashes


def state_checksum(state) -> int:
    """CRC-32 of a state's step, parameters and optimizer moments: two replicas with the same
    checksum hold the same model (the leader uses it to tell who needs a copy)."""
    crc = zlib.crc32(np.int64(state["step"]).tobytes())
    for name in sorted(state["params"]):
        crc = zlib.crc32(np.ascontiguousarray(state["params"][name]).tobytes(), crc)
    for name in sorted(state["optimizer"]["state"]):
        value = state["optimizer"]["state"][name]
        for part in (value if isinstance(value, tuple) else (value,)):
            crc = zlib.crc32(np.ascontiguousarray(part).tobytes(), crc)
    return crc


def pause(comm, seconds: float):
    """Let `seconds` pass on any engine: simulated time on the simulator; on the real engines,
    where compute takes no time, the rest is slept."""
    start = yield comm.now()
    yield comm.compute(seconds)
    left = seconds - ((yield comm.now()) - start)
    if left > 1e-9:
        time.sleep(left)


# -- cell 113
class ElasticRank:
    """One rank of elastic data-parallel SGD (see elastic_train). Holds the live state (model,
    optimizer, step, data cursor, history of committed steps, log of rendezvous), an in-memory
    checkpoint of it, the current membership and epoch, and the ranks it knows to be dead."""

    def __init__(self, comm, model, optimizer, X, y, steps, batch, lr, members, joins,
                 rule, restore, checkpoint_every, seconds_per_sample, detect_seconds, seed,
                 loss):
        self.comm, self.me = comm, comm.rank
        self.model, self.optimizer = copy.deepcopy(model), copy.deepcopy(optimizer)
        self.X, self.y, self.steps, self.batch, self.base_lr = X, y, steps, batch, lr
        self.initial, self.joins = list(members), dict(joins)
        # Seniority: initial members by rank, then joiners by (join step, rank). The most
        # senior live rank leads; every rank can work it out from what it knows.
        self.seniority = self.initial + sorted(self.joins, key=lambda r: (self.joins[r], r))
        self.rule, self.restore, self.every = rule, restore, checkpoint_every
        self.per_sample, self.detect = seconds_per_sample, detect_seconds
        self.seed, self.loss = seed, loss
        self.member = self.me in self.initial
        self.members = list(self.initial) if self.member else []
        self.epoch, self.dead = 0, set()
        self.store = None                       # the membership store's rank (elastic_train)
        self.detector, self.stall, self.alarm = None, None, False   # watched_gather
        self.suspected, self.told, self.refused, self.fence_verdict = {}, set(), 0, None
        self.step, self.cursor, self.history, self.rendezvous_log = 0, 0, [], []
        self.computed_samples = 0              # every sample this rank took a gradient of
        self.holds = self.member                # a spare holds no model until it is given one
        self.checkpoint = snapshot(self.state()) if self.member else None

    # -- state ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """The live state as a payload (references, not copies: snapshot it to keep it)."""
        opt = self.optimizer
        return {"params": self.model.params, "step": self.step, "cursor": self.cursor,
                "optimizer": {"state": opt.state, "steps": opt.steps, "trust": opt.trust},
                "history": self.history, "rendezvous": self.rendezvous_log}

    def load(self, state) -> None:
        state = snapshot(state)
        for name, value in state["params"].items():
            self.model.params[name][...] = value
        self.optimizer.state = dict(state["optimizer"]["state"])
        self.optimizer.steps = int(state["optimizer"]["steps"])
        self.optimizer.trust = dict(state["optimizer"]["trust"])
        self.step, self.cursor = int(state["step"]), int(state["cursor"])
        self.history, self.rendezvous_log = list(state["history"]), list(state["rendezvous"])
        self.holds = True

    def noticed(self, rank: int):
        """A receive from `rank` raised PeerFailed: remember it, and pay the detection delay a
        heartbeat timeout would cost (the simulator's notice itself is instantaneous)."""
        self.dead.add(rank)
        if self.detect:
            yield self.comm.compute(self.detect)


# -- cell 116
@add_to_class(ElasticRank)
def candidate(self) -> int:
    """The most senior rank not known dead that this rank can see: its members (a member),
    or every rank more senior than itself (a spare waiting to join)."""
    if self.member:
        view = [r for r in self.seniority if r in self.members or r == self.me]
    else:
        view = self.seniority[:self.seniority.index(self.me) + 1]
    return next(r for r in view if r not in self.dead)


@add_to_class(ElasticRank)
def joiners_due(self, step: int) -> list:
    return [r for r in self.seniority if r in self.joins and r not in self.members
            and r not in self.dead and self.joins[r] <= step and self.joins[r] < self.steps]


@add_to_class(ElasticRank)
def local_gradient(self):
    """This rank's shard of the current global batch: (samples, flat vector of gradient sums
    with the loss sum in the last slot)."""
    size, _ = scaled(self.rule, self.batch, self.base_lr, len(self.members), len(self.initial))
    batch = stream_batch(len(self.X), self.cursor, size, self.seed)
    start, stop = shard_bounds(len(batch), len(self.members), self.members.index(self.me))
    mine = batch[start:stop]
    trainable = {n: w for n, w in self.model.params.items() if n not in self.model.frozen}
    if len(mine):
        value, grads = loss_and_grads(self.model, self.X[mine], self.y[mine], self.loss)
        if self.per_sample:
            yield self.comm.compute(len(mine) * self.per_sample)
    else:
        value, grads = 0.0, {n: np.zeros_like(w) for n, w in trainable.items()}
    vector, _ = flatten(grads, extra=1)
    vector[-1] = value
    vector *= len(mine)                       # shard means → shard sums
    self.computed_samples += len(mine)
    return len(mine), vector


@add_to_class(ElasticRank)
def apply(self, total, sizes) -> None:
    """Take the step every member takes with the summed vector; record it; checkpoint."""
    size, lr = scaled(self.rule, self.batch, self.base_lr, len(self.members), len(self.initial))
    samples = int(sum(sizes))
    layout = [(n, w.shape) for n, w in self.model.params.items() if n not in self.model.frozen]
    grads = unflatten(total[:-1] / samples, layout)
    self.optimizer.lr = lr
    self.optimizer.step(self.model.params, grads)
    self.history.append({"step": self.step, "epoch": self.epoch, "members": list(self.members),
                         "cursor": self.cursor, "batch": size, "lr": lr,
                         "shard_sizes": [int(s) for s in sizes],
                         "loss": float(total[-1] / samples)})
    self.cursor += samples
    self.step += 1
    if self.step % self.every == 0:
        self.checkpoint = snapshot(self.state())


# -- cell 117
@add_to_class(ElasticRank)
def train_step(self):
    """One synchronous step as a star through the leader: workers send their gradient sums
    and wait for the leader only; the leader waits for each worker. So every wait ends —
    with the message or with PeerFailed — and the leader decides for everyone.
    Returns None (step taken), "failure" (go to a rendezvous) or "stopped: fenced out …"
    (this rank was suspected while alive: see watched_gather)."""
    comm, leader = self.comm, self.members[0]
    yield from self.stall_if_due()
    samples, vector = yield from self.local_gradient()
    if self.me != leader:
        yield from self.send_gradient(leader, samples, vector)
        try:
            reply = yield comm.recv(leader, tag=DOWN)
        except PeerFailed:
            yield from self.noticed(leader)
            return "failure"
        if reply[0] == "rendezvous":
            self.dead |= set(reply[1])
            return "failure"
        if reply[0] == "fenced":                  # suspected while alive (watched_gather)
            return (yield from self.fenced_out(reply[1]))
        if self.detector is not None and reply[3] != self.epoch:   # the leader is not watched
            raise RuntimeError(f"rank {self.me}: step from epoch {reply[3]} in {self.epoch}")
        self.apply(reply[1], reply[2])
        return None
    total, sizes = vector.copy(), [samples]
    gather = self.gather if self.detector is None else self.watched_gather
    failed = yield from gather(total, sizes)
    workers = [w for w in self.members[1:] if w not in failed]
    if failed:                  # suspects are not named until a decision commits them
        dead = sorted(self.dead - set(self.suspected))
        for worker in workers:
            yield comm.send(worker, ("rendezvous", dead), tag=DOWN)
        return "failure"
    yield from self.send_step(workers, total, sizes)
    self.apply(total, sizes)
    return None


@add_to_class(ElasticRank)
def gather(self, total, sizes):
    """The leader adds each worker's gradient sums into `total`, in order; returns the
    workers found failed."""
    comm, failed = self.comm, []
    for worker in self.members[1:]:
        try:
            step, their_samples, theirs = yield comm.recv(worker, tag=UP)
        except PeerFailed:
            yield from self.noticed(worker)
            failed.append(worker)
            continue
        if step != self.step:
            raise RuntimeError(f"leader {self.me}: rank {worker} sent step {step} in step "
                               f"{self.step}")
        total += theirs
        sizes.append(their_samples)
    return failed


# -- cell 118
@add_to_class(ElasticRank)
def send_gradient(self, leader: int, samples: int, vector):
    if self.detector is None:
        yield self.comm.send(leader, (self.step, samples, vector), tag=UP)
    else:                                       # watched: the sender's epoch goes along
        yield self.comm.send(leader, (self.epoch, self.step, samples, vector), tag=GRAD_TAG)


@add_to_class(ElasticRank)
def send_step(self, workers, total, sizes):
    """The leader sends the step's summed vector to the workers, the most junior first."""
    for worker in reversed(workers):
        message = ("step", total, sizes) if self.detector is None else \
            ("step", total, sizes, self.epoch)
        yield self.comm.send(worker, message, tag=DOWN)


# -- cell 120
@add_to_class(ElasticRank)
def report(self, reason: str) -> dict:
    """What a rank tells the leader in a rendezvous: where it is and what it holds."""
    live = self.state()
    return {"reason": reason, "epoch": self.epoch, "holds": self.holds,
            "step": self.step if self.holds else -1,
            "live_sum": state_checksum(live) if self.holds else -1,
            "checkpoint_step": self.checkpoint["step"] if self.checkpoint else -1,
            "checkpoint_sum": state_checksum(self.checkpoint) if self.checkpoint else -1,
            "dead": sorted(self.dead)}


@add_to_class(ElasticRank)
def rendezvous(self, reason: str):
    """Agree on a new membership with the others. Send a report to the most senior live rank
    and wait for its decision; if that rank is dead, try the next; if it is this rank, lead.
    With a store, first read it (fenced_by_store). Returns "go on", "done" or "stopped: why"."""
    comm = self.comm
    while True:
        stopped = yield from self.fenced_by_store()
        if stopped:
            return stopped
        leader = self.candidate()
        if leader == self.me:
            outcome = yield from self.lead_rendezvous(reason)
            return outcome
        yield from self.send_report(leader, reason)
        try:
            while True:
                decision = yield comm.recv(leader, tag=DOWN)
                if decision[0] == "send":                # the leader needs our copy
                    which = self.state() if decision[1] == "live" else self.checkpoint
                    yield comm.send(leader, ("state", which), tag=UP)
                    continue
                break
        except PeerFailed:
            yield from self.noticed(leader)
            reason = "failure"
            continue
        if decision[0] == "stop":
            return "stopped: " + decision[1]
        return self.adopt(decision)


@add_to_class(ElasticRank)
def adopt(self, decision) -> str:
    """Take the leader's decision: new members, epoch, and the state to resume from."""
    _, epoch, members, dead, kind, state, done, record = decision
    self.epoch, self.members, self.member = epoch, list(members), True
    self.dead |= set(dead)
    if kind == "checkpoint":
        self.load(self.checkpoint)
    elif kind == "state":
        self.load(state)
    # kind "live": this rank already holds the chosen state
    self.rendezvous_log = self.rendezvous_log + [record]
    self.checkpoint = snapshot(self.state())   # a new membership starts from a checkpoint
    return "done" if done else "go on"


# -- cell 122
@add_to_class(ElasticRank)
def collect_reports(self, reason: str):
    """The leader's first phase: reports from the members it knows (a dead one raises
    PeerFailed) and from spares due to join. Returns (reports, whether a member failed)."""
    comm = self.comm
    reports = {self.me: self.report(reason)}
    for rank in [r for r in self.members if r != self.me and r not in self.dead]:
        try:
            reports[rank] = self.expect_report(rank, (yield comm.recv(rank, tag=UP)))
        except PeerFailed:
            yield from self.noticed(rank)
    high = max(report["step"] for report in reports.values())
    for rank in self.joiners_due(high):
        try:
            reports[rank] = self.expect_report(rank, (yield comm.recv(rank, tag=UP)))
        except PeerFailed:
            yield from self.noticed(rank)
    for report in reports.values():
        self.dead |= set(report["dead"])
    # A failure among the members (a spare's report counts not: a spare that lost its first
    # contact has lost no work)
    failure = (any(reports[r]["reason"] == "failure" for r in reports if r in self.members)
               or any(r in self.dead for r in self.members))
    return reports, failure


# -- cell 123
@add_to_class(ElasticRank)
def choose_state(self, reports: dict, failure: bool):
    """The second phase: the state to resume from — the latest checkpoint after a failure
    (restore="checkpoint"), else the most advanced live replica — fetched if the leader
    lacks it (a source that dies meanwhile: choose again). Returns (kind, (step, checksum)
    chosen, ranks that hold it, holders, the state, failure), or "stopped: why" when no
    replica or checkpoint survives (everyone is told to stop)."""
    comm = self.comm
    while True:
        holders = [r for r in reports if reports[r]["holds"] and r not in self.dead]
        if not holders:
            why = (f"no surviving replica or checkpoint: ranks {sorted(reports)} are alive "
                   f"but hold no model; ranks {sorted(self.dead)} failed")
            yield from self.stop_all([r for r in reports if r != self.me], why)
            waiting = [r for r in self.seniority
                       if r not in reports and r not in self.dead and r not in self.members]
            yield from self.stop_all(waiting, why, collect=True)
            return "stopped: " + why
        kind = "checkpoint" if self.restore == "checkpoint" and failure else "live"
        step_key, sum_key = ("checkpoint_step", "checkpoint_sum") if kind == "checkpoint" \
            else ("step", "live_sum")
        source = max(holders, key=lambda r: (reports[r][step_key], -self.seniority.index(r)))
        chosen = (reports[source][step_key], reports[source][sum_key])
        has_it = {r for r in holders if (reports[r][step_key], reports[r][sum_key]) == chosen}
        if self.me in has_it:
            state = self.checkpoint if kind == "checkpoint" else self.state()
            break
        yield comm.send(source, ("send", kind), tag=DOWN)
        try:
            state = (yield comm.recv(source, tag=UP))[1]
        except PeerFailed:                  # the source died: choose again among the rest
            yield from self.noticed(source)
            failure = True
            continue
        break
    return kind, chosen, has_it, holders, state, failure


# -- cell 124
@add_to_class(ElasticRank)
def announce(self, epoch: int, decisions):
    """Send each rank of the new membership (epoch `epoch`) its decision, in order."""
    for rank, decision in decisions:
        yield self.comm.send(rank, decision, tag=DOWN)


@add_to_class(ElasticRank)
def lead_rendezvous(self, reason: str):
    """The leader's side: collect the reports, choose the state to resume from, and send
    every member its decision (the new membership, its epoch, and the state if it lacks it)."""
    comm = self.comm
    start = yield comm.now()
    reports, failure = yield from self.collect_reports(reason)
    choice = yield from self.choose_state(reports, failure)
    if isinstance(choice, str):
        return choice
    kind, chosen, has_it, holders, state, failure = choice
    members = [r for r in self.seniority if r in reports and r not in self.dead]
    epoch = yield from self.commit(members, max(r["epoch"] for r in reports.values()))
    resume = chosen[0]
    done = resume >= self.steps
    lost = max(reports[r]["step"] for r in holders) - resume
    record = {"epoch": epoch, "reason": "failure" if failure else reason, "start": start,
              "end": (yield comm.now()), "leader": self.me, "members": members,
              "joined": [r for r in members if r not in self.members],
              "resume_step": resume, "lost_steps": max(lost, 0), "restored_from": kind}
    others = [r for r in members if r != self.me]
    # A rank told "done" leaves; if the leader died half-way through *that* broadcast, the
    # others would wait for a rank that has left. Ending safely needs a termination protocol
    # (e.g. a uniform reliable broadcast), which this section leaves out (see CrashingRank).
    decisions = []
    for rank in others:
        mine = ("live" if kind == "live" else "checkpoint") if rank in has_it else "state"
        decisions.append((rank, ("members", epoch, members, sorted(self.dead), mine,
                                 state if mine == "state" else None, done, record)))
    yield from self.announce(epoch, decisions)
    self.epoch, self.members, self.member = epoch, members, True
    if kind == "checkpoint" or self.me not in has_it:
        self.load(state)
    self.rendezvous_log = self.rendezvous_log + [record]
    self.checkpoint = snapshot(self.state())
    if done:
        turned_away = [r for r in self.seniority if r not in members and r not in self.dead]
        yield from self.stop_all(turned_away, "training finished before this rank joined",
                                 collect=True)
        yield from self.fence_untold()
        return "done"
    return "go on"


# -- cell 125
@add_to_class(ElasticRank)
def expect_report(self, rank, message) -> dict:
    if not (isinstance(message, tuple) and message[0] == "report"):
        raise RuntimeError(f"leader {self.me}: expected a report from rank {rank} in a "
                           f"rendezvous, got {str(message)[:60]}")
    return message[1]


@add_to_class(ElasticRank)
def stop_all(self, ranks, why: str, collect: bool = False):
    """Tell `ranks` to stop; with collect, first take the report each owes (spares waiting)."""
    for rank in ranks:
        if collect:
            try:
                yield self.comm.recv(rank, tag=UP)
            except PeerFailed:
                yield from self.noticed(rank)
                continue
        yield self.comm.send(rank, ("stop", why), tag=DOWN)


@add_to_class(ElasticRank)
def send_report(self, leader: int, reason: str):
    yield self.comm.send(leader, ("report", self.report(reason)), tag=UP)


@add_to_class(ElasticRank)
def commit(self, members, seen: int):
    """The generation of the new membership: without a store, the next after the newest any
    reporter has seen; with one, whatever the store takes it under (propose)."""
    if self.store is None:
        return seen + 1
    return (yield from propose(self.comm, self.store, members, seen))


# -- cell 127
@add_to_class(ElasticRank)
def run_rank(self):
    """The rank's whole life: join (a spare), then steps and rendezvous until done."""
    if not self.member:
        outcome = yield from self.rendezvous("join")
    else:
        outcome = "go on"
    while outcome == "go on":
        if self.step >= self.steps:
            outcome = yield from self.rendezvous("finish")
            continue
        if self.joiners_due(self.step):
            outcome = yield from self.rendezvous("join")
            continue
        status = yield from self.train_step()
        if status == "failure":
            outcome = yield from self.rendezvous("failure")
        elif status is not None:               # "stopped: fenced out …"
            outcome = status
    return {"status": "finished" if outcome == "done" else "stopped", "outcome": outcome,
            "rank": self.me, "params": self.model.params, "step": self.step,
            "cursor": self.cursor, "history": self.history, "rendezvous": self.rendezvous_log,
            "epoch": self.epoch, "members": self.members, "dead": sorted(self.dead),
            "computed_samples": self.computed_samples, "suspected": self.suspected,
            "refused": self.refused, "fence_verdict": self.fence_verdict}


def check_membership(comm, members, joins, steps, batch, lr, rule, restore,
                     checkpoint_every, store=None) -> tuple[list, dict]:
    """The starting members (default: every rank that is neither a spare nor the store) and
    spares {rank: step}, checked with the run's sizes, rule, restore mode and store rank;
    clear errors for anything else."""
    joins = dict(joins or {})
    if store is not None and not (0 <= store < comm.size and store not in joins
                                  and store not in (members or [])):
        raise ValueError(f"store must be a rank in 0..{comm.size - 1} that is neither a member "
                         f"nor a spare, got {store}")
    if members is None:
        members = [r for r in range(comm.size) if r not in joins and r != store]
    members = sorted(members)
    if not members or set(members) & set(joins) or not set(members) | set(joins) <= \
            set(range(comm.size)):
        raise ValueError(f"members {members} and spares {sorted(joins)} must be disjoint, "
                         f"non-empty members, all in 0..{comm.size - 1}")
    if steps < 0 or batch < 1 or checkpoint_every < 1:
        raise ValueError(f"need steps ≥ 0, batch ≥ 1 and checkpoint_every ≥ 1, got steps="
                         f"{steps}, batch={batch}, checkpoint_every={checkpoint_every}")
    if restore not in RESTORES:
        raise ValueError(f"restore must be one of {RESTORES}, got {restore!r}")
    scaled(rule, batch, lr, 1, 1)            # validates rule
    return members, joins


# -- cell 128
def crash_after(messages, after: int, why: str):
    """Run the sends of `messages` (a generator) and fail once `after` of them are done — or at
    its end, if it sends fewer."""
    for sent, request in enumerate(messages):
        if sent == after:
            messages.close()
            break
        yield request
    raise InjectedCrash(why)


class CrashingRank(ElasticRank):
    """An ElasticRank that fails (fail-stop, InjectedCrash) at one point, `crash` = (point,
    number) as check_crashes describes; the protocol's methods run unchanged inside. The final
    rendezvous's leader fails before its first message: a rank told "done" leaves, and ending
    safely after a crash half-way needs a termination protocol this section leaves out."""

    def __init__(self, *args, crash):
        super().__init__(*args)
        self.point, self.number = crash
        self.why = f"rank {self.me} crashed at {self.point} {self.number} (injected)"

    def train_step(self):
        if (self.point, self.number) == ("step", self.step):
            raise InjectedCrash(self.why)
        return (yield from super().train_step())

    def send_gradient(self, leader, samples, vector):
        messages = super().send_gradient(leader, samples, vector)
        if (self.point, self.number) == ("reply", self.step):
            messages = crash_after(messages, 1, self.why)
        yield from messages

    def send_step(self, workers, total, sizes):
        messages = super().send_step(workers, total, sizes)
        if (self.point, self.number) == ("reply", self.step):
            half = len(workers) // 2 if len(workers) > 1 else len(workers)
            messages = crash_after(messages, half, self.why)
        yield from messages

    def send_report(self, leader, reason):
        messages = super().send_report(leader, reason)
        if (self.point, self.number) == ("rendezvous", self.epoch + 1):
            messages = crash_after(messages, 1, self.why)
        yield from messages

    def announce(self, epoch, decisions):
        messages = super().announce(epoch, decisions)
        if (self.point, self.number) == ("rendezvous", epoch):
            done = bool(decisions) and decisions[0][1][6]
            half = 0 if done else len(decisions) // 2 if len(decisions) > 1 else len(decisions)
            messages = crash_after(messages, half, self.why)
        yield from messages

    def commit(self, members, seen):
        if (self.point, self.number) == ("commit", seen + 1):
            raise InjectedCrash(self.why)
        return (yield from super().commit(members, seen))


# -- cell 129
GRAD_TAG, CLOCK_TAG = 73, 74    # watched: epoch-stamped gradients and wake-ups; clock requests


def check_detector(comm, detector, members, joins, store):
    """Validate detector = {"clock": rank, "timeout": s, "every": s (default timeout/4)}, or
    None (off). Returns (detector, members): members default to every rank that is not a
    spare, the store or the clock."""
    if detector is None:
        return None, members
    detector = dict(detector)
    clock, timeout = detector.get("clock"), detector.get("timeout")
    if not (isinstance(clock, int) and 0 <= clock < comm.size and clock != store
            and clock not in (joins or {}) and clock not in (members or [])):
        raise ValueError(f"detector['clock'] must be a rank in 0..{comm.size - 1} that is "
                         f"not a member, a spare or the store, got {clock}")
    detector.setdefault("every", timeout / 4 if isinstance(timeout, (int, float)) else 0)
    if not (isinstance(timeout, (int, float)) and timeout > 0 and detector["every"] > 0):
        raise ValueError(f"detector needs timeout > 0 and every > 0 (s), got {detector}")
    if members is None:
        members = [r for r in range(comm.size) if r not in (joins or {})
                   and r not in (store, clock)]
    return detector, members


def check_stalls(stalls, members, joins) -> dict:
    """Validate stalls = {rank: (step, seconds)}: a member or spare other than the first
    leader (a leader is not watched), which pauses once before that step's gradient."""
    stalls = dict(stalls or {})
    for rank, spec in stalls.items():
        if rank not in members[1:] and rank not in joins:
            raise ValueError(f"stalls: rank {rank} must be a member other than the leader "
                             f"{members[0]}, or a spare")
        if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] >= 0 and spec[1] > 0):
            raise ValueError(f"stalls[{rank}] must be (step ≥ 0, seconds > 0), got {spec!r}")
    return stalls


def elastic_clock(comm, clients, every: float):
    """Rank program: the leader's timer. A request ("wake",) is answered `every` s later by
    ("wake",) on GRAD_TAG, where the leader waits for gradients. Serves `clients` until each
    has said ("bye",) or failed; returns how many wake-ups it sent."""
    gone, sent = set(), 0
    while not set(clients) <= gone:
        got = yield from next_request(comm, CLOCK_TAG, gone)
        if got is None:
            continue
        yield from pause(comm, every)
        yield comm.send(got[0], ("wake",), tag=GRAD_TAG)
        sent += 1
    return {"status": "clock", "wakeups": sent}


# -- cell 130
@add_to_class(ElasticRank)
def stall_if_due(self):
    if self.stall is not None and self.stall[0] == self.step:
        seconds, self.stall = self.stall[1], None        # once: alive, just slow
        yield from pause(self.comm, seconds)


@add_to_class(ElasticRank)
def watched_gather(self, total, sizes):
    """gather with a timeout: wake-ups from the clock tell the leader time has passed. A
    worker silent for more than the timeout in this step is suspected — dead or only slow,
    the leader cannot tell — and counted failed: the rendezvous then commits a membership
    without it under a new epoch. A gradient stamped with an old epoch is refused (counted)
    and its sender told it was fenced out. If this leader fails before refusing it, the
    fenced rank learns its fate from the store (fenced_by_store); without one it waits on."""
    comm, clock = self.comm, self.detector["clock"]
    start, waiting, got, failed = (yield comm.now()), set(self.members[1:]), {}, []
    while waiting:
        if not self.alarm:                        # one wake-up outstanding at a time
            yield comm.send(clock, ("wake",), tag=CLOCK_TAG)
            self.alarm = True
        try:
            src, message = yield comm.recv_any(GRAD_TAG)
        except PeerFailed as failure:
            if failure.rank not in self.members:  # a spare: left to the rendezvous, as gather
                continue
            if failure.rank not in self.dead:
                yield from self.noticed(failure.rank)
            if failure.rank in waiting:
                waiting.discard(failure.rank)
                failed.append(failure.rank)
            continue
        if src == clock:
            self.alarm, waited = False, (yield comm.now()) - start
            if waited > self.detector["timeout"]:
                self.suspected.update(dict.fromkeys(waiting, waited))
                self.dead |= waiting
                failed, waiting = failed + sorted(waiting), set()
            continue
        epoch, step, their_samples, theirs = message
        if epoch != self.epoch or src not in waiting:    # a fenced-out rank: refused
            yield from self.refuse(src)
            continue
        if step != self.step:
            raise RuntimeError(f"leader {self.me}: rank {src} sent step {step} in {self.step}")
        got[src], waiting = (their_samples, theirs), waiting - {src}
    for worker in [w for w in self.members[1:] if w in got]:     # in order, as gather
        total += got[worker][1]
        sizes.append(got[worker][0])
    return failed


# -- cell 131
@add_to_class(ElasticRank)
def refuse(self, rank):
    self.refused += 1
    self.told.add(rank)
    yield self.comm.send(rank, ("fenced", self.epoch), tag=DOWN)


@add_to_class(ElasticRank)
def fence_untold(self):
    """Before leaving, take the stale gradient each suspect still owes, and refuse it."""
    for rank in sorted(set(self.suspected) - self.told):
        try:
            yield self.comm.recv(rank, tag=GRAD_TAG)
        except PeerFailed:
            continue
        yield from self.refuse(rank)


@add_to_class(ElasticRank)
def fenced_by_store(self):
    """A rank's fate comes from the store, not from a leader that may have died since: a
    generation past this rank's epoch that leaves it out means it was fenced out (it stops),
    and ranks of its view left out are dropped for good (count them dead). Spares are not
    members yet. Returns the stop outcome, or None. Without a store, nothing to read: a rank
    whose leader died between suspecting it and refusing it still waits, on a leader that
    will not answer (the simulator reports the deadlock)."""
    if self.store is None:
        return None
    generation, members = yield from read_store(self.comm, self.store)
    if generation > self.epoch:
        left_out = (set(self.initial) | set(self.members)) - set(members)
        if self.me in left_out:
            return (yield from self.fenced_out(generation))
        self.dead |= left_out
    return None


@add_to_class(ElasticRank)
def fenced_out(self, epoch: int):
    """This rank was suspected while alive: the membership went on to `epoch` without it.
    With a store, it tries to write back the membership it knew — refused by compare-and-set,
    since the generation moved on — and stops (it does not rejoin)."""
    if self.store is not None:
        yield self.comm.send(self.store, ("cas", self.epoch, self.members), tag=STORE_TAG)
        self.fence_verdict = (yield self.comm.recv(self.store, tag=STORE_TAG))[0]
    return f"stopped: fenced out (suspected while alive; the membership is at epoch {epoch})"


# -- cell 132
def elastic_train(comm, model, optimizer, X, y, steps: int, batch: int, lr: float,
                  members=None, joins=None, rule: str = "global", restore: str = "checkpoint",
                  checkpoint_every: int = 4, crashes=None, seconds_per_sample: float = 0.0,
                  detect_seconds: float = 0.0, seed: int = 0, loss: str = "cross_entropy",
                  store=None, detector=None, stalls=None):
    """Rank program (run with failures="notify"): data-parallel SGD that survives ranks
    leaving and joining. `steps` optimizer steps over a seeded stream of X, y (stream_batch);
    `members` the ranks that start (default: all but the spares), `joins` = {spare rank: step}
    — a spare is admitted at the first step boundary ≥ that step. `rule` rescales batch and
    lr per membership (scaled); `restore` says what a failure resumes from: "checkpoint" (the
    in-memory checkpoint, taken every `checkpoint_every` steps and at every new membership:
    the steps since are lost) or "replica" (the most advanced surviving replica: only the
    step in flight is lost). `crashes` = {rank: (point, number)} injects failures (CrashingRank).
    `seconds_per_sample` is simulated compute per sample; `detect_seconds` the delay a
    heartbeat timeout adds to each detected failure. `store`: a rank that runs the membership
    store (membership_store) instead of training; the others read it before each rendezvous
    attempt (fenced_by_store). `detector` = {"clock": rank, "timeout": s} (off by default) has
    the leader suspect a worker silent for longer than the timeout in a step, and fence it out
    (watched_gather: with a store, even if the leader dies first); `stalls` = {rank: (step, s)} makes a live rank
    pause before that step's gradient. Returns a dict (see ElasticRank.run)."""
    detector, members = check_detector(comm, detector, members, joins, store)
    members, joins = check_membership(comm, members, joins, steps, batch, lr, rule, restore,
                                      checkpoint_every, store)
    crashes = check_crashes(crashes, comm.size)
    stalls = check_stalls(stalls, members, joins)
    if store in crashes:
        raise ValueError(f"crashes: the store (rank {store}) cannot crash: a store that "
                         f"survives failures is replicated (etcd), which this section leaves out")
    if comm.rank == store:
        return (yield from membership_store(comm, members + sorted(joins), members))
    if detector is not None and comm.rank == detector["clock"]:
        if comm.rank in crashes:
            raise ValueError(f"crashes: the detector's clock (rank {comm.rank}) cannot crash")
        return (yield from elastic_clock(comm, members + sorted(joins), detector["every"]))
    args = (comm, model, optimizer, X, y, steps, batch, lr, members, joins, rule, restore,
            checkpoint_every, seconds_per_sample, detect_seconds, seed, loss)
    rank = CrashingRank(*args, crash=crashes[comm.rank]) if comm.rank in crashes \
        else ElasticRank(*args)
    rank.store, rank.detector, rank.stall = store, detector, stalls.get(comm.rank)
    if comm.rank not in members and comm.rank not in joins:
        return {"status": "idle", "rank": comm.rank}
    result = yield from rank.run_rank()
    if store is not None:
        yield comm.send(store, ("bye",), tag=STORE_TAG)
    if detector is not None:
        if rank.alarm:                          # the wake-up still owed to a last leader
            yield comm.recv(detector["clock"], tag=GRAD_TAG)
        yield comm.send(detector["clock"], ("bye",), tag=CLOCK_TAG)
    return result


# -- cell 134
def elastic_outcome(result) -> dict:
    """The outcome of a run of elastic_train (a RunResult): the finished ranks, their (identical)
    parameters, the history of committed steps and the rendezvous log. Raises TrainingLost,
    naming every failed rank and every stop reason, when no rank finished; RuntimeError if
    finished ranks disagree (they must hold bit-identical replicas)."""
    finished = {r: v for r, v in enumerate(result.values)
                if isinstance(v, dict) and v.get("status") == "finished"}
    if not finished:
        failed = ", ".join(f"rank {r} ({error})" for r, error in sorted(result.failed.items()))
        stopped = sorted({v["outcome"] for v in result.values
                          if isinstance(v, dict) and v.get("status") == "stopped"})
        raise TrainingLost(f"elastic training lost: no rank finished. Failed: {failed or 'none'}"
                           + (f". Stopped: {'; '.join(stopped)}" if stopped else ""))
    first = finished[min(finished)]
    for rank, value in finished.items():
        same = all(np.array_equal(value["params"][n], first["params"][n]) for n in first["params"])
        if not same or value["history"] != first["history"]:
            raise RuntimeError(f"ranks {min(finished)} and {rank} finished with different models")
    return {"ranks": sorted(finished), "params": first["params"], "history": first["history"],
            "rendezvous": first["rendezvous"], "failed": sorted(result.failed),
            "computed_samples": {r: v["computed_samples"] for r, v in finished.items()}}


def replay(model, optimizer, X, y, history, seed: int = 0, loss: str = "cross_entropy"):
    """The reference: one process, no failures, taking the committed steps of `history` in
    order — each its whole global batch (read from the stream at the record's cursor) at the
    record's learning rate. Returns the batch losses; updates model in place."""
    losses = []
    for record in history:
        batch = stream_batch(len(X), record["cursor"], record["batch"], seed)
        value, grads = loss_and_grads(model, X[batch], y[batch], loss)
        optimizer.lr = record["lr"]
        optimizer.step(model.params, grads)
        losses.append(value)
    return losses
