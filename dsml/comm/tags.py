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


def tag_words(tag) -> str:
    """"tag 7", or "tag 7: <meaning>" for a registered tag."""
    meaning = TAG_MEANINGS.get(tag)
    return f"tag {tag}" if meaning is None else f"tag {tag}: {meaning}"


# tag -> (the argument its group stands for, this tag's value of it), e.g. ("op", "op='max'").
TAG_GROUPS: dict[int, tuple[str, str]] = {}


def differing(waits, left=()) -> str:
    """The question a report should end with, or "". `waits`: the tags ranks wait on; `left`:
    tags of messages that arrived but no receive took (on real engines, the last one each
    rank stashed). Asked when they name different values of one group's argument."""
    values: dict[str, set] = {}
    for tag in list(waits) + [tag for tag in left if tag is not None]:
        group = TAG_GROUPS.get(tag)
        if group is not None:
            values.setdefault(group[0], set()).add(group[1])
    for what, seen in values.items():
        if len(seen) > 1:
            return (f"ranks are in collectives with different {what}s ({', '.join(sorted(seen))}):"
                    f" did every rank pass the same {what}?")
    return ""
