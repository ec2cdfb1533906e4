"""AsyncSandbox: Sandbox's methods as coroutines. Each call runs the blocking one on the
default executor's threads (asyncio.to_thread), so many tasks drive sandboxes at once."""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from .sandbox import ExecResult, Sandbox


class AsyncSandbox:
    def __init__(self, name: str) -> None:
        self._s = Sandbox(name)
        self.name = name
        self.files = _AsyncFiles(self._s)

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.name!r})"

    @classmethod
    async def create(cls, name: str, **kw) -> "AsyncSandbox":
        await asyncio.to_thread(Sandbox.create, name, **kw)
        return cls(name)

    @classmethod
    async def connect(cls, name: str) -> "AsyncSandbox":
        await asyncio.to_thread(Sandbox.connect, name)
        return cls(name)

    @staticmethod
    async def list() -> list[dict]:
        return await asyncio.to_thread(Sandbox.list)

    async def exec(self, cmd, **kw) -> ExecResult:
        return await asyncio.to_thread(self._s.exec, cmd, **kw)

    async def exec_detached(self, cmd, **kw) -> str:
        return await asyncio.to_thread(self._s.exec_detached, cmd, **kw)

    async def attach(self, session: str, **kw) -> ExecResult:
        return await asyncio.to_thread(self._s.attach, session, **kw)

    async def stream(self, cmd, **kw) -> AsyncIterator[tuple[str, bytes]]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def put(item) -> None:
            loop.call_soon_threadsafe(q.put_nowait, item)

        def run() -> None:
            try:
                r = self._s.exec(cmd, on_output=lambda s, b: put((s, b)), **kw)
                put(("exit", str(r.exit_code).encode()))
                put(None)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(e)
        fut = loop.run_in_executor(None, run)
        while True:
            item = await q.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
        await fut

    @contextlib.asynccontextmanager
    async def forward(self, port: int, host_port: int = 0) -> AsyncIterator[int]:
        cm = self._s.forward(port, host_port)
        p = await asyncio.to_thread(cm.__enter__)
        try:
            yield p
        finally:
            await asyncio.to_thread(cm.__exit__, None, None, None)

    async def stop(self) -> None:
        await asyncio.to_thread(self._s.stop)

    async def pause(self) -> None:
        await asyncio.to_thread(self._s.pause)

    async def resume(self) -> None:
        await asyncio.to_thread(self._s.resume)

    async def archive(self) -> None:
        await asyncio.to_thread(self._s.archive)

    async def fork(self, *names: str, stopped: bool = False) -> list["AsyncSandbox"]:
        await asyncio.to_thread(self._s.fork, *names, stopped=stopped)
        return [AsyncSandbox(n) for n in names]

    async def rm(self) -> None:
        await asyncio.to_thread(self._s.rm)

    async def state(self) -> str:
        return await asyncio.to_thread(self._s.state)


class _AsyncFiles:
    def __init__(self, s: Sandbox) -> None:
        self._s = s

    async def read(self, path: str) -> bytes:
        return await asyncio.to_thread(self._s.files.read, path)

    async def write(self, path: str, data, mode: int = 0o644) -> None:
        await asyncio.to_thread(self._s.files.write, path, data, mode)

    async def list(self, path: str = "/") -> list[str]:
        return await asyncio.to_thread(self._s.files.list, path)

    async def remove(self, path: str) -> None:
        await asyncio.to_thread(self._s.files.remove, path)
