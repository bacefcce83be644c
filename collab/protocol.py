"""The y-websocket wire format (y-protocols sync, awareness and query-awareness messages).

A message is a varuint message type followed by its body; byte strings are varuint-length
prefixed. We decode into small dataclasses so the rest of collab never touches raw framing.
"""

from __future__ import annotations

from dataclasses import dataclass

MESSAGE_SYNC = 0
MESSAGE_AWARENESS = 1
MESSAGE_AUTH = 2
MESSAGE_QUERY_AWARENESS = 3

SYNC_STEP1 = 0
SYNC_STEP2 = 1
SYNC_UPDATE = 2


class ProtocolError(ValueError):
    """A message that does not follow the y-websocket protocol."""


@dataclass(frozen=True)
class SyncStep1:
    state_vector: bytes


@dataclass(frozen=True)
class SyncStep2:
    update: bytes


@dataclass(frozen=True)
class SyncUpdate:
    update: bytes


@dataclass(frozen=True)
class AwarenessEntry:
    client_id: int
    clock: int
    state_json: str  # "null" means the client is gone


@dataclass(frozen=True)
class AwarenessUpdate:
    entries: tuple[AwarenessEntry, ...]


@dataclass(frozen=True)
class QueryAwareness:
    pass


@dataclass(frozen=True)
class AuthMessage:
    payload: bytes


Message = SyncStep1 | SyncStep2 | SyncUpdate | AwarenessUpdate | QueryAwareness | AuthMessage


def encode_varuint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"varuint value must be >= 0, got {value}")
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varbytes(data: bytes) -> bytes:
    return encode_varuint(len(data)) + data


class Decoder:
    """Reads varuints and length-prefixed byte strings from one message."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varuint(self) -> int:
        value = 0
        shift = 0
        while True:
            if self.pos >= len(self.data):
                raise ProtocolError("message ends inside a varuint")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ProtocolError("varuint longer than 64 bits")

    def varbytes(self) -> bytes:
        length = self.varuint()
        end = self.pos + length
        if end > len(self.data):
            raise ProtocolError("byte string runs past the end of the message")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def varstring(self) -> str:
        try:
            return self.varbytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("string is not valid UTF-8") from exc


def encode_sync_step1(state_vector: bytes) -> bytes:
    return bytes([MESSAGE_SYNC, SYNC_STEP1]) + encode_varbytes(state_vector)


def encode_sync_step2(update: bytes) -> bytes:
    return bytes([MESSAGE_SYNC, SYNC_STEP2]) + encode_varbytes(update)


def encode_sync_update(update: bytes) -> bytes:
    return bytes([MESSAGE_SYNC, SYNC_UPDATE]) + encode_varbytes(update)


def encode_awareness_entries(entries: list[AwarenessEntry]) -> bytes:
    """The body of an awareness update (as y-protocols' encodeAwarenessUpdate writes it)."""
    out = bytearray(encode_varuint(len(entries)))
    for entry in entries:
        out += encode_varuint(entry.client_id)
        out += encode_varuint(entry.clock)
        out += encode_varbytes(entry.state_json.encode("utf-8"))
    return bytes(out)


def encode_awareness(entries: list[AwarenessEntry]) -> bytes:
    return encode_varuint(MESSAGE_AWARENESS) + encode_varbytes(encode_awareness_entries(entries))


def encode_query_awareness() -> bytes:
    return encode_varuint(MESSAGE_QUERY_AWARENESS)


def decode_awareness_entries(body: bytes) -> tuple[AwarenessEntry, ...]:
    decoder = Decoder(body)
    count = decoder.varuint()
    entries = []
    for _ in range(count):
        client_id = decoder.varuint()
        clock = decoder.varuint()
        entries.append(AwarenessEntry(client_id, clock, decoder.varstring()))
    return tuple(entries)


def decode_message(data: bytes) -> Message:
    """Decode one websocket message; raises ProtocolError for anything malformed or unknown."""
    decoder = Decoder(data)
    kind = decoder.varuint()
    if kind == MESSAGE_SYNC:
        sync_kind = decoder.varuint()
        payload = decoder.varbytes()
        if sync_kind == SYNC_STEP1:
            return SyncStep1(payload)
        if sync_kind == SYNC_STEP2:
            return SyncStep2(payload)
        if sync_kind == SYNC_UPDATE:
            return SyncUpdate(payload)
        raise ProtocolError(f"unknown sync message type {sync_kind}")
    if kind == MESSAGE_AWARENESS:
        return AwarenessUpdate(decode_awareness_entries(decoder.varbytes()))
    if kind == MESSAGE_QUERY_AWARENESS:
        return QueryAwareness()
    if kind == MESSAGE_AUTH:
        return AuthMessage(data[decoder.pos :])
    raise ProtocolError(f"unknown message type {kind}")
