"""Wyoming's events on a TCP connection, read and written by the ``wyoming`` package, within limits.

An event is a JSON header line (``type``, and ``data`` inline or ``data_length``, ``payload_length``), then a data
block (JSON, merged into ``data``) and a payload of that many bytes. ``wyoming.event.async_read_event`` reads one; it
is given an ``EventReader`` that holds it to this server's limits, since the library bounds neither the line nor the
blocks: a header line over ``MAX_HEADER_LINE_BYTES``, or a block over the server's ``max_body_bytes``, raises
``FramingError`` before anything past it is read. A line that is not an event (not JSON, no ``type``, ``data`` that
is not an object) is a ``FramingError`` too. After one the stream's framing is lost: the connection says so in an
``error`` event and closes.

``EventWriter`` writes events through ``wyoming.event.async_write_event`` (data always in a data block, so a
client's header line stays short: Home Assistant reads it with a 64 KiB limit); once the client is gone, writes
raise ``Gone``.
"""

from __future__ import annotations

import asyncio
from typing import cast

from wyoming.event import Event, async_read_event, async_write_event

MAX_HEADER_LINE_BYTES = 65_536
"""The longest header line read (its newline aside): what Home Assistant's client reads (asyncio's default limit)."""


class FramingError(Exception):
    """The client's bytes are not a Wyoming event within the limits; the connection cannot go on."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Gone(Exception):
    """The client left (or the connection was closed): nothing more can be written."""


class EventReader:
    """What ``async_read_event`` reads through: the connection's reader, with limits on the line and the blocks."""

    def __init__(self, reader: asyncio.StreamReader, max_block_bytes: int) -> None:
        self._reader = reader
        self.max_block_bytes = max_block_bytes
        self.at_eof = False
        """The client closed its side (or left) where an event would start."""

    async def readline(self) -> bytes:
        try:
            line = await self._reader.readline()
        except ValueError as error:  # asyncio's LimitOverrunError, as readline raises it
            raise FramingError(
                f"the header line is longer than {MAX_HEADER_LINE_BYTES} bytes", "header_too_long"
            ) from error
        if not line.endswith(b"\n"):  # b"": the client closed; else a last line cut off by the close
            self.at_eof = True
            return b""
        return line

    async def readexactly(self, n: int) -> bytes:
        if not isinstance(n, int):
            raise FramingError(f"data_length and payload_length must be integers, not {n!r}", "invalid_event")
        if n > self.max_block_bytes:
            raise FramingError(
                f"a data or payload block of {n} bytes is over the limit of {self.max_block_bytes}",
                "block_too_large",
            )
        return await self._reader.readexactly(n)


async def read_event(reader: EventReader) -> Event | None:
    """The next event; None when the client closed (or left) before one; FramingError for bytes that are not one.

    A client that leaves in the middle of an event raises ``asyncio.IncompleteReadError`` (an ``EOFError``)."""
    try:
        event = await async_read_event(cast(asyncio.StreamReader, reader))
    except (KeyError, TypeError, AttributeError) as error:  # a header without "type", or data that is no object
        raise FramingError(f"not a Wyoming event: {error!r}", "invalid_event") from error
    if event is None:
        if reader.at_eof:
            return None
        # async_read_event returns None for JSON that does not read (it catches the ValueError)
        raise FramingError("not a Wyoming event: the header line or data block is not JSON", "invalid_event")
    if not isinstance(event.type, str) or not isinstance(event.data, dict):
        raise FramingError("not a Wyoming event: 'type' must be a string and 'data' an object", "invalid_event")
    return event


class EventWriter:
    """One connection's writing side: each event whole (header, data, payload), in the order written."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()
        self.closed = False

    async def write(self, event: Event) -> None:
        async with self._lock:
            if self.closed or self._writer.is_closing():
                self.closed = True
                raise Gone
            try:
                await async_write_event(event, self._writer)
            except (ConnectionError, OSError) as error:
                self.closed = True
                raise Gone from error

    async def close(self) -> None:
        """Close once; later writes raise Gone."""
        self.closed = True
        if not self._writer.is_closing():
            self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
