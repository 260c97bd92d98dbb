"""Plumbing (hand-written): words for message tags in "waits for …" descriptions.

A layer above may register what one of its tags means (`TAG_MEANINGS[tag] = "…"`), so that a
deadlock report says e.g. "tag 1048579: a collective with op='max'" instead of a bare number —
which is how ranks that pass different ops to one collective learn what went wrong.

A tag may also belong to a group of tags that stand for the values of one argument
(`TAG_GROUPS[tag] = ("op", "op='max'")`): a report then asks "did every rank pass the same
op?" only when it has reason to (`differing`) — not after every wait in a collective.
"""
from __future__ import annotations

TAG_MEANINGS: dict[int, str] = {}
# Functions tag -> words or None, for tags that describe themselves (the collectives' signature
# tags: dsml.collectives.signatures), asked when TAG_MEANINGS has no entry.
TAG_DECODERS: list = []


def meaning(tag) -> str | None:
    """What a tag stands for, if anyone said: a registered meaning, or a decoder's words."""
    found = TAG_MEANINGS.get(tag)
    if found is None:
        for decode in TAG_DECODERS:
            found = decode(tag)
            if found is not None:
                return f"a collective: {found}"
    return found


def tag_words(tag) -> str:
    """"tag 7", or "tag 7: <meaning>" for a tag with a meaning."""
    words = meaning(tag)
    return f"tag {tag}" if words is None else f"tag {tag}: {words}"


# tag -> (the argument its group stands for, this tag's value of it), e.g. ("op", "op='max'").
TAG_GROUPS: dict[int, tuple[str, str]] = {}


def _call_of(tag):
    for decode in TAG_DECODERS:
        found = decode(tag)
        if found is not None:
            return found
    return None


def _arguments(call: str) -> dict:
    """{name: value text} of a decoded call "f(a=1, b='x')"."""
    inside = call[call.index("(") + 1:-1]
    return dict(part.split("=", 1) for part in inside.split(", ") if "=" in part)


def differing(waits, left=()) -> str:
    """What a report should end with when ranks are in different collective calls, or "".
    `waits`: (rank, tag) each waiting rank waits on; `left`: (rank that sent it or None, tag)
    of messages that arrived and no receive took (on real engines, the last one each rank
    stashed). Signature tags (dsml.collectives.signatures) name each rank's call: "rank 0
    called allreduce(op='sum', algorithm='ring'), rank 1 called broadcast(…)", and for one
    collective what differs ("algorithm 'ring' vs 'recursive_doubling'"). Tags of a group
    (`TAG_GROUPS`) that show different values ask whether every rank passed the same one."""
    calls: dict[str, set] = {}
    values: dict[str, set] = {}
    for rank, tag in list(waits) + list(left):
        call = _call_of(tag)
        if call is not None:
            calls.setdefault(call, set())
            if rank is not None:
                calls[call].add(rank)
        group = TAG_GROUPS.get(tag)
        if group is not None:
            values.setdefault(group[0], set()).add(group[1])
    if len(calls) > 1:
        ordered = sorted(calls.items(), key=lambda item: (min(item[1], default=1 << 62), item[0]))
        said = []
        for call, ranks in ordered:
            who = (f"rank {min(ranks)}" if len(ranks) == 1 else
                   f"ranks {', '.join(map(str, sorted(ranks)))}" if ranks else "a rank")
            said.append(f"{who} called {call}")
        text = "ranks are in different collective calls: " + ", ".join(said)
        names = {call.split("(", 1)[0] for call in calls}
        if len(names) == 1:
            argsets = [_arguments(call) for call, _ in ordered]
            for name in argsets[0]:
                seen = []
                for args in argsets:
                    if args.get(name) not in seen:
                        seen.append(args.get(name))
                if len(seen) > 1:
                    text += f"; {name} {' vs '.join(str(v) for v in seen)}"
                    text += f" — did every rank pass the same {name}?"
        else:
            text += " — every rank must make the same collective calls in the same order"
        return text
    for what, seen in values.items():
        if len(seen) > 1:
            return (f"ranks are in collectives with different {what}s ({', '.join(sorted(seen))}):"
                    f" did every rank pass the same {what}?")
    return ""
