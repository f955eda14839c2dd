"""A second client of the same streams: an HTTP relay between the bench and the engine that
reads every streamed response from the engine itself, stamps each read with its own clock,
and parses the server-sent events with code of its own (not the bench's), so that the
bench's per-stream figures can be checked against an independent measurement.

    with Relay(engine_url) as relay:        # relay.url goes to the bench as --url
        ...
    relay.streams -> [RelayedStream(prefix, reads=[(t, bytes)], ...)]
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length",
               "content-encoding", "host"}


@dataclass
class RelayedStream:
    """One streamed chat completion as the relay saw it."""

    prefix: str
    status: int = 0
    reads: list[tuple[float, bytes]] = field(default_factory=list)

    def events(self) -> list[tuple[float, dict | str]]:
        """(time the bytes completing the event were read, parsed data) per `data:` event."""
        out, pending = [], b""
        for stamp, chunk in self.reads:
            pending += chunk
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                for line in event.decode().splitlines():
                    if line.startswith("data:"):
                        payload = line[5:].strip()
                        out.append((stamp, payload if payload == "[DONE]" else json.loads(payload)))
        return out

    def figures(self) -> dict:
        """Token counts from the usage the server put in each event and its final usage;
        decode rate over the span from the first token-bearing event to the last; when each
        token-bearing event was read (time.perf_counter)."""
        stamps, cumulative, final_usage, every_chunk_has_usage = [], [], None, True
        for stamp, event in self.events():
            if event == "[DONE]":
                continue
            usage = event.get("usage")
            if not event.get("choices"):
                final_usage = usage
                continue
            if not usage:
                every_chunk_has_usage = False
                continue
            total = usage["completion_tokens"]
            if total > (cumulative[-1] if cumulative else 0):
                stamps.append(stamp)
                cumulative.append(total)
        completion = final_usage["completion_tokens"] if final_usage else None
        decode = completion - cumulative[0] if completion is not None and cumulative else None
        span = stamps[-1] - stamps[0] if len(stamps) > 1 else None
        return {"completion_tokens": completion, "decode_tokens": decode,
                "first_chunk_tokens": cumulative[0] if cumulative else None,
                "token_chunks": len(stamps), "every_chunk_has_usage": every_chunk_has_usage,
                "span_s": span, "tok_s": decode / span if decode is not None and span else None,
                "token_chunk_stamps": stamps}


class Relay:
    """Reverse proxy on a loopback port, run in a thread with its own event loop."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.streams: list[RelayedStream] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        stream = None
        if request.path == "/v1/chat/completions":
            try:
                messages = json.loads(body).get("messages") or [{}]
                prefix = str(messages[0].get("content", ""))
            except ValueError:
                prefix = ""
            stream = RelayedStream(prefix=prefix)
            self.streams.append(stream)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         data=body, headers=headers) as upstream:
            reply = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await reply.prepare(request)
            if stream is not None:
                stream.status = upstream.status
            async for chunk in upstream.content.iter_any():
                if stream is not None:
                    stream.reads.append((time.perf_counter(), chunk))
                await reply.write(chunk)
            await reply.write_eof()
            return reply

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                              connector=aiohttp.TCPConnector(limit=64))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def __enter__(self) -> Relay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def by_prefix(self) -> dict[str, RelayedStream]:
        return {s.prefix.split("]")[0] + "]": s for s in self.streams if s.prefix.startswith("[")}
