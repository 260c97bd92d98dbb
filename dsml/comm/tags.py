"""Plumbing (hand-written): words for message tags in "waits for …" descriptions.

A layer above may register what one of its tags means (`TAG_MEANINGS[tag] = "…"`), so that a
deadlock report says e.g. "tag 1048579: a collective with op='max'" instead of a bare number —
which is how ranks that pass different ops to one collective learn what went wrong.
"""
from __future__ import annotations

TAG_MEANINGS: dict[int, str] = {}


def tag_words(tag) -> str:
    """"tag 7", or "tag 7: <meaning>" for a registered tag."""
    meaning = TAG_MEANINGS.get(tag)
    return f"tag {tag}" if meaning is None else f"tag {tag}: {meaning}"
