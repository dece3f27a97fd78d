"""One async client per event loop, closed inside the loop that used it.

An async HTTP client (the ``openai`` backend's ``aiohttp.ClientSession``, gemini's client) keeps connections
bound to the event loop that opened them, and a stage may run several loops in a row (one ``asyncio.run`` per
phase). ``PerLoop`` gives each loop its own client and closes it in that loop: when the loop shuts down
(``asyncio.run`` finalises the async generator that owns the client) or when ``aclose()`` is awaited, whichever
comes first.

    clients = PerLoop(lambda: aiohttp.ClientSession(), lambda c: c.close())
    client = await clients.get()      # inside a running loop
    await clients.aclose()            # this loop's client now; those of loops running in other threads too
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


async def _owner(resource, close: Callable[[T], Awaitable[None]]) -> AsyncGenerator:
    try:
        yield resource
    finally:
        await close(resource)


class PerLoop(Generic[T]):
    def __init__(self, make: Callable[[], T], close: Callable[[T], Awaitable[None]]):
        self._make = make
        self._close = close
        self._owners: dict[asyncio.AbstractEventLoop, tuple[T, AsyncGenerator]] = {}

    async def get(self) -> T:
        loop = asyncio.get_running_loop()
        self._forget_closed_loops()
        entry = self._owners.get(loop)
        if entry is not None:
            return entry[0]
        resource = self._make()
        owner = _owner(resource, self._close)
        self._owners[loop] = (resource, owner)
        # a started async generator is finalised by the loop's shutdown: that is what closes the client
        await owner.__anext__()
        return resource

    def _forget_closed_loops(self) -> None:
        for loop in [loop for loop in list(self._owners) if loop.is_closed()]:
            self._owners.pop(loop, None)  # its shutdown already closed the client

    async def aclose(self) -> None:
        current = asyncio.get_running_loop()
        owners, self._owners = self._owners, {}
        for loop, (_, owner) in owners.items():
            if loop is current:
                await owner.aclose()
            elif loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(owner.aclose(), loop))
