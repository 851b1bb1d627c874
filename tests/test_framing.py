"""The two incremental frame decoders: any split of the stream gives the same frames, in order;
oversized frames are reported once each and never buffered; the first byte picks the framing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eurekamem.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    BinaryDecoder,
    FrameTooLarge,
    NdjsonDecoder,
    decoder_for_first_byte,
    frame_binary,
    frame_ndjson,
)

# Deterministic and fast: fixed seed, no example database, no per-example deadline.
FAST = settings(derandomize=True, database=None, deadline=None, max_examples=150,
                suppress_health_check=[HealthCheck.too_slow])

MAX = 64  # a small limit so that oversized frames are cheap to make
TOO_LARGE = "TOO_LARGE"  # the expected-event marker for an oversized frame


def feed_split(decoder, stream: bytes, cuts: list[int], bound: int) -> list:
    """Feed `stream` cut at `cuts`; return the events, asserting the pending-bytes bound after each feed."""
    events: list = []
    prev = 0
    for cut in sorted(set(cuts)) + [len(stream)]:
        events.extend(decoder.feed(stream[prev:cut]))
        assert decoder.pending_bytes <= bound
        prev = cut
    assert decoder.pending_bytes == 0  # every frame was complete
    return events


def normalize(events: list) -> list:
    return [TOO_LARGE if isinstance(e, FrameTooLarge) else e for e in events]


@st.composite
def cuts_for(draw, stream: bytes) -> list[int]:
    return draw(st.lists(st.integers(0, len(stream)), max_size=40))


# --- NDJSON -------------------------------------------------------------------------------------

# A line's payload: any bytes except the newline, and not blank (blank lines are skipped).
ndjson_payload = (
    st.binary(min_size=1, max_size=MAX)
    .map(lambda b: b.replace(b"\n", b"x"))
    .filter(lambda b: b.strip() != b"")
)
oversized_line = st.binary(min_size=MAX + 1, max_size=4 * MAX).map(lambda b: b.replace(b"\n", b"x"))


@FAST
@given(st.data(), st.lists(ndjson_payload, max_size=20))
def test_ndjson_any_split_gives_the_same_frames(data, frames):
    stream = b"".join(frame_ndjson(f) for f in frames)
    events = feed_split(NdjsonDecoder(MAX), stream, data.draw(cuts_for(stream)), MAX)
    assert events == frames


@FAST
@given(
    st.data(),
    st.lists(st.one_of(ndjson_payload.map(lambda b: (b, b)), oversized_line.map(lambda b: (b, TOO_LARGE))), max_size=20),
)
def test_ndjson_oversized_lines_are_reported_once_each(data, items):
    stream = b"".join(frame_ndjson(raw) for raw, _ in items)
    events = feed_split(NdjsonDecoder(MAX), stream, data.draw(cuts_for(stream)), MAX)
    assert normalize(events) == [expected for _, expected in items]
    for event in events:
        if isinstance(event, FrameTooLarge):
            assert event.size > MAX


blank_line = st.sampled_from([b"", b" ", b"\t", b"\r", b"  \t \r"])


@FAST
@given(st.data(), st.lists(st.one_of(ndjson_payload.map(lambda b: (b, True)), blank_line.map(lambda b: (b, False))), max_size=20))
def test_ndjson_blank_lines_are_skipped(data, items):
    stream = b"".join(frame_ndjson(raw) for raw, _ in items)
    events = feed_split(NdjsonDecoder(MAX), stream, data.draw(cuts_for(stream)), MAX)
    assert events == [raw for raw, keep in items if keep]


@FAST
@given(st.data(), st.lists(ndjson_payload.filter(lambda b: not b.endswith(b"\r")).map(lambda b: b[: MAX - 1]), max_size=20))
def test_ndjson_crlf_is_tolerated(data, frames):
    frames = [f for f in frames if f.strip()]
    stream = b"".join(f + b"\r\n" for f in frames)
    events = feed_split(NdjsonDecoder(MAX), stream, data.draw(cuts_for(stream)), MAX)
    # The '\r' stays on the line (JSON ignores it as white space); nothing else changes.
    assert [e.removesuffix(b"\r") for e in events] == frames


def test_ndjson_limit_is_inclusive():
    decoder = NdjsonDecoder(MAX)
    exact, over = b"a" * MAX, b"b" * (MAX + 1)
    assert decoder.feed(exact + b"\n") == [exact]
    events = decoder.feed(over + b"\n" + exact + b"\n")
    assert normalize(events) == [TOO_LARGE, exact]


def test_ndjson_oversized_line_is_dropped_as_it_arrives():
    decoder = NdjsonDecoder(MAX)
    events = decoder.feed(b"x" * (MAX + 1))  # no newline yet: reported at once, not buffered
    assert normalize(events) == [TOO_LARGE]
    assert decoder.pending_bytes == 0
    for _ in range(100):
        assert decoder.feed(b"y" * 1000) == []
        assert decoder.pending_bytes == 0
    assert decoder.feed(b"tail\n{}\n") == [b"{}"]


def test_ndjson_partial_line_is_kept_between_feeds():
    decoder = NdjsonDecoder(MAX)
    assert decoder.feed(b'{"id":') == []
    assert decoder.pending_bytes == 6
    assert decoder.feed(b"1}\n{") == [b'{"id":1}']
    assert decoder.feed(b"}\n") == [b"{}"]


def test_ndjson_partial_line_growing_past_the_limit():
    decoder = NdjsonDecoder(MAX)
    assert decoder.feed(b"a" * MAX) == []  # exactly at the limit: still a candidate
    assert normalize(decoder.feed(b"a")) == [TOO_LARGE]
    assert decoder.feed(b"aaa\nok\n") == [b"ok"]


# --- binary -------------------------------------------------------------------------------------

binary_payload = st.binary(max_size=MAX)
oversized_payload = st.binary(min_size=MAX + 1, max_size=4 * MAX)


@FAST
@given(st.data(), st.lists(binary_payload, max_size=20))
def test_binary_any_split_gives_the_same_frames(data, frames):
    stream = b"".join(frame_binary(f) for f in frames)
    events = feed_split(BinaryDecoder(MAX), stream, data.draw(cuts_for(stream)), MAX + 4)
    assert events == frames


@FAST
@given(
    st.data(),
    st.lists(st.one_of(binary_payload.map(lambda b: (b, b)), oversized_payload.map(lambda b: (b, TOO_LARGE))), max_size=20),
)
def test_binary_oversized_frames_are_reported_once_each(data, items):
    stream = b"".join(frame_binary(raw) for raw, _ in items)
    events = feed_split(BinaryDecoder(MAX), stream, data.draw(cuts_for(stream)), MAX + 4)
    assert normalize(events) == [expected for _, expected in items]
    sizes = [e.size for e in events if isinstance(e, FrameTooLarge)]
    assert sizes == [len(raw) for raw, expected in items if expected is TOO_LARGE]  # the declared size


def test_binary_limit_is_inclusive():
    decoder = BinaryDecoder(MAX)
    exact, over = b"a" * MAX, b"b" * (MAX + 1)
    assert decoder.feed(frame_binary(exact)) == [exact]
    assert normalize(decoder.feed(frame_binary(over) + frame_binary(exact))) == [TOO_LARGE, exact]


def test_binary_huge_declared_frame_is_skipped_without_buffering():
    decoder = BinaryDecoder(MAX)
    size = 10_000_000
    events = decoder.feed(size.to_bytes(4, "big") + b"z" * 100)
    assert len(events) == 1 and isinstance(events[0], FrameTooLarge) and events[0].size == size
    assert decoder.pending_bytes == 0
    remaining = size - 100
    chunk = b"z" * 65536
    while remaining > len(chunk):
        assert decoder.feed(chunk) == []
        assert decoder.pending_bytes == 0
        remaining -= len(chunk)
    assert decoder.feed(b"z" * remaining + frame_binary(b"after")) == [b"after"]


def test_binary_header_split_byte_by_byte():
    decoder = BinaryDecoder(MAX)
    stream = frame_binary(b"hello") + frame_binary(b"")
    events: list = []
    for i in range(len(stream)):
        events += decoder.feed(stream[i : i + 1])
    assert events == [b"hello", b""]


# --- choosing the framing -----------------------------------------------------------------------


@pytest.mark.parametrize("first", range(256))
def test_decoder_for_first_byte(first):
    decoder = decoder_for_first_byte(first, max_frame_bytes=1234)
    if first == 0:
        assert isinstance(decoder, BinaryDecoder) and decoder.framing == "binary"
    elif bytes([first]) in (b"{", b"[", b" ", b"\t", b"\r", b"\n"):
        assert isinstance(decoder, NdjsonDecoder) and decoder.framing == "ndjson"
    else:
        assert decoder is None
        return
    assert decoder.max_frame_bytes == 1234


def test_default_limit_is_16_mib():
    assert DEFAULT_MAX_FRAME_BYTES == 16 * 1024 * 1024
    assert decoder_for_first_byte(ord("{")).max_frame_bytes == DEFAULT_MAX_FRAME_BYTES
    assert decoder_for_first_byte(0).max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


def test_framers():
    assert frame_ndjson(b"{}") == b"{}\n"
    assert frame_binary(b"\x80") == b"\x00\x00\x00\x01\x80"
    assert frame_binary(b"") == b"\x00\x00\x00\x00"


def test_binary_frames_do_not_alias_a_reused_receive_buffer():
    """Clients recv_into one buffer and feed views of it: frames must be copies, not views."""
    from eurekamem.protocol import BinaryDecoder, frame_binary

    buf = bytearray(frame_binary(b"first") + frame_binary(b"second"))
    decoder = BinaryDecoder()
    frames = decoder.feed(memoryview(buf))
    buf[:] = b"\xff" * len(buf)
    assert frames == [b"first", b"second"]
