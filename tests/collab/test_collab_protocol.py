"""The y-websocket framing, checked against pycrdt's own encoder (a second implementation)."""

import pycrdt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collab.protocol import (
    AwarenessEntry,
    AwarenessUpdate,
    Decoder,
    ProtocolError,
    QueryAwareness,
    SyncStep1,
    SyncStep2,
    SyncUpdate,
    decode_message,
    encode_awareness,
    encode_query_awareness,
    encode_sync_step1,
    encode_sync_step2,
    encode_sync_update,
    encode_varuint,
)


@given(st.integers(min_value=0, max_value=2**53))
def test_varuint_matches_pycrdt(value: int) -> None:
    assert encode_varuint(value) == pycrdt.write_var_uint(value)


def test_varuint_known_bytes() -> None:
    assert encode_varuint(0) == b"\x00"
    assert encode_varuint(127) == b"\x7f"
    assert encode_varuint(128) == b"\x80\x01"
    assert encode_varuint(300) == b"\xac\x02"


def test_sync_messages_match_pycrdt_and_round_trip() -> None:
    doc = pycrdt.Doc()
    doc.get("content", type=pycrdt.Text).insert(0, "héllo 😀")
    state, update = doc.get_state(), doc.get_update()
    assert encode_sync_step1(state) == pycrdt.create_sync_message(doc)
    assert encode_sync_update(update) == pycrdt.create_update_message(update)
    assert decode_message(encode_sync_step1(state)) == SyncStep1(state)
    assert decode_message(encode_sync_step2(update)) == SyncStep2(update)
    assert decode_message(encode_sync_update(update)) == SyncUpdate(update)
    # pycrdt answers our step 1 with a step 2 our decoder reads.
    other = pycrdt.Doc()
    reply = pycrdt.handle_sync_message(encode_sync_step1(other.get_state())[1:], doc)
    decoded = decode_message(reply)
    assert isinstance(decoded, SyncStep2)
    other.apply_update(decoded.update)
    assert str(other.get("content", type=pycrdt.Text)) == "héllo 😀"


def test_awareness_round_trip_matches_pycrdt() -> None:
    entries = [AwarenessEntry(12345, 3, '{"user":{"name":"Zoë 🦊"}}'), AwarenessEntry(7, 9, "null")]
    message = encode_awareness(entries)
    assert decode_message(message) == AwarenessUpdate(tuple(entries))
    awareness = pycrdt.Awareness(pycrdt.Doc())
    decoder = Decoder(message)
    decoder.varuint()
    awareness.apply_awareness_update(decoder.varbytes(), "test")
    assert awareness.states[12345] == {"user": {"name": "Zoë 🦊"}}


def test_query_awareness() -> None:
    assert decode_message(encode_query_awareness()) == QueryAwareness()


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"\x00\x05\x01", b"\x00\x09\x00", b"\x07", b"\x01\x05\x01\x02", b"\x80\x80\x80"],
)
def test_malformed_messages_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_message(data)
