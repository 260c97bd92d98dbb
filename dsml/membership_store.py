"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dsml.comm.failures import PeerFailed


# -- cell 114
STORE_TAG = 72              # requests to the membership store, and its answers


def membership_store(comm, clients, members):
    """Rank program: the membership store. It holds the membership and its generation and
    changes them only by compare-and-set: ("cas", generation seen, members) succeeds when the
    generation is still the one seen, and moves it on by one; otherwise it is refused. A
    ("read",) changes nothing. Every request is answered (verdict, generation, members). It
    serves `clients` until each has said ("bye",) or failed, and returns {"generation",
    "members", "log": [(generation, members, proposer)], "refused": [(proposer, generation
    seen, generation held)]}."""
    generation, members = 0, list(members)
    log, refused, gone = [(0, list(members), None)], [], set()
    while not set(clients) <= gone:            # a failed non-client counts for nothing
        got = yield from next_request(comm, STORE_TAG, gone)
        if got is None:
            continue
        src, request = got
        if request[0] == "read":
            yield comm.send(src, ("ok", generation, members), tag=STORE_TAG)
            continue
        verdict = "ok" if request[1] == generation else "refused"
        if verdict == "ok":
            generation, members = generation + 1, list(request[2])
            log.append((generation, members, src))
        else:
            refused.append((src, request[1], generation))
        yield comm.send(src, (verdict, generation, members), tag=STORE_TAG)
    return {"status": "store", "generation": generation, "members": members, "log": log,
            "refused": refused}


def next_request(comm, tag: int, gone: set):
    """A server's next request on `tag`: (src, request), or None when it was a failure notice
    or a ("bye",) — its sender then joins `gone`."""
    try:
        src, request = yield comm.recv_any(tag)
    except PeerFailed as failure:
        gone.add(failure.rank)
        return None
    if request[0] == "bye":
        gone.add(src)
        return None
    return src, request


# -- cell 115
def propose(comm, store, members, seen: int):
    """Have the membership store at rank `store` take `members` on top of generation `seen`;
    returns the generation it took them under. A refusal means someone moved the generation
    on since `seen` (in a fail-stop run: a proposer that has died since — a live one is
    never passed over), so propose again on top of what the store holds."""
    while True:
        yield comm.send(store, ("cas", seen, members), tag=STORE_TAG)
        verdict, generation, _ = yield comm.recv(store, tag=STORE_TAG)
        if verdict == "ok":
            return generation
        seen = generation


def read_store(comm, store):
    """(generation, members) as the membership store at rank `store` holds them now."""
    yield comm.send(store, ("read",), tag=STORE_TAG)
    _, generation, members = yield comm.recv(store, tag=STORE_TAG)
    return generation, members
