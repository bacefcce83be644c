"""Turning a new text into CRDT edits: correct for any text, small for small changes."""

from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Text

from collab.textdiff import apply_text, text_edits

# Letters, newlines, accents, CJK, emoji (astral plane, 4 UTF-8 bytes, 2 UTF-16 units), ZWJ.
alphabet = st.sampled_from(list("ab \nxé中😀👍\u200d"))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet, max_size=40), st.text(alphabet, max_size=40))
def test_apply_text_reaches_any_target(old: str, new: str) -> None:
    doc = Doc()
    text = doc.get("content", type=Text)
    text += old
    with doc.transaction():
        apply_text(text, new)
    assert str(text) == new


def test_small_change_in_large_text_is_one_small_edit() -> None:
    old = "".join(f"line {i} ünïcödé 😀\n" for i in range(2000))
    new = old.replace("line 1000 ", "line 1000 (edited) ", 1)
    edits = text_edits(old, new)
    assert len(edits) == 1
    assert edits[0].start == edits[0].end
    assert edits[0].insert == "(edited) "


def test_edits_keep_concurrent_insert_elsewhere() -> None:
    """Two replicas: one rewrites a line through apply_text, the other types; both survive."""
    server, client = Doc(), Doc()
    server_text = server.get("content", type=Text)
    client_text = client.get("content", type=Text)
    server_text += "alpha 😀\nbeta\ngamma\n"
    client.apply_update(server.get_update())

    client_text.insert(len("alpha 😀\nbeta\ngamma\n".encode()), "delta 🦊\n")
    with server.transaction():
        apply_text(server_text, "alpha 😀\nBETA!\ngamma\n")
    server.apply_update(client.get_update(server.get_state()))
    client.apply_update(server.get_update(client.get_state()))
    assert str(server_text) == str(client_text) == "alpha 😀\nBETA!\ngamma\ndelta 🦊\n"
