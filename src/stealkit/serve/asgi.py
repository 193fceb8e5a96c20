"""The ASGI plumbing of the query path: responses counted, ambiguous framing refused, the body read under a
size limit and a deadline, and a watch on the client that stops each step of a request when it leaves."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import anyio
from starlette.requests import Request

from stealkit.serve.cancel import Cancelled
from stealkit.serve.service import ApiError


class CountResponses:
    """Pure ASGI middleware: every HTTP response, whatever its status, is counted once (an unhandled error as a
    500). Unlike ``@app.middleware("http")`` it passes ``send`` through untouched, so a route's ``send`` returns
    once the bytes are handed to the server's transport (what settling after delivery relies on)."""

    def __init__(self, app: Any, observe: Any, endpoint_of: Any) -> None:
        self.app, self.observe, self.endpoint_of = app, observe, endpoint_of

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.observe(self.endpoint_of(scope["path"]), status[0], time.perf_counter() - start)


class RefuseAmbiguousFraming:
    """Pure ASGI middleware: a request that frames its body twice (``Transfer-Encoding`` and ``Content-Length``,
    the raw material of request smuggling; RFC 9112 6.1 lets a server refuse it) is answered 400 and its
    connection closed, before any route sees it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            names = {name for name, _ in scope["headers"]}
            if b"transfer-encoding" in names and b"content-length" in names:
                await ApiError(400, "bad_framing", "a request may carry Transfer-Encoding or Content-Length, not "
                               "both", {"Connection": "close"}).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytearray:
    """The request body, refused (413) past ``limit`` bytes and (408, connection closed) if it has not all
    arrived ``timeout`` seconds after this call: a client that trickles its body holds only its own request.
    The body grows in one buffer as bytes arrive (no list of chunks to join, and nothing is allocated for bytes
    a client only declared)."""
    length = request.headers.get("content-length")
    declared: int | None = None
    if length is not None:
        if not length.isascii() or not length.isdigit() or len(length) > 18:
            raise ApiError(400, "bad_input", f"invalid Content-Length {length[:40]!r}")
        declared = int(length)
        if declared > limit:
            raise ApiError(413, "too_large", f"request body of {declared} bytes exceeds the limit of {limit}; "
                           "send smaller batches")
    buf = bytearray()
    total = 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                end = total + len(chunk)
                if end > (declared if declared is not None else limit):
                    raise ApiError(413, "too_large", f"request body exceeds the limit of {limit} bytes; "
                                   "send smaller batches")
                buf += chunk
                total = end
    except TimeoutError:
        raise ApiError(408, "body_timeout", f"the request body did not arrive within {timeout:g} s; send it "
                       "at once", {"Connection": "close"}) from None
    if declared is not None and total != declared:
        raise ApiError(400, "bad_input", f"the body ended after {total} of {declared} bytes")
    return buf


class disconnect_watch:  # noqa: N801 - used like a function
    """Started after the body is read: whether the client has disconnected since. A pending ``receive()``
    returns ``http.disconnect`` when the connection drops (and once the answer is complete, so it is asked only
    before the answer is sent). :meth:`unless_gone` runs a step of the request (its parse, its wait for a
    compute slot, its computation) until it ends or the client leaves; :meth:`stop` remembers the answer so far
    and stops listening."""

    def __init__(self, request: Request) -> None:
        self._task = asyncio.ensure_future(request.receive())
        self._gone: bool | None = None

    def _left(self) -> bool:
        task = self._task
        return task.done() and not task.cancelled() and task.exception() is None \
            and task.result().get("type") == "http.disconnect"

    def stop(self) -> None:
        if self._gone is None:
            self._gone = self._left()
            if not self._task.done():
                self._task.cancel()

    async def __call__(self) -> bool:
        await asyncio.sleep(0)  # let a disconnect the loop has already seen wake the watcher first
        if self._gone is None:
            self.stop()
        return bool(self._gone)

    async def unless_gone(self, step: Any, cancel: threading.Event | None = None,
                          undo: Any = None) -> Any:
        """The result of the awaitable ``step``, or :class:`~stealkit.serve.cancel.Cancelled` once the client
        has left: then ``cancel`` is set (the thread-pool work stops at its next check and is awaited) or, with
        no ``cancel``, the step's task is cancelled; ``undo(result)`` (awaited if it returns an awaitable) if the
        step finished all the same."""
        work = asyncio.ensure_future(step)
        if self._gone is None and not self._task.done():
            await asyncio.wait({work, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if work.done() or not (self._gone or (self._gone is None and self._left())):
            return await work
        if cancel is not None:
            cancel.set()
        else:
            work.cancel()
        try:
            result = await (asyncio.shield(work) if cancel is not None else work)
        except (Exception, asyncio.CancelledError):
            pass  # stopped (or failed): nothing to undo
        else:
            if undo is not None:
                done = undo(result)
                if inspect.isawaitable(done):
                    await done
        raise Cancelled("the client disconnected")
