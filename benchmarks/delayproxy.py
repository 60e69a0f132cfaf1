"""A TCP proxy on loopback that holds every byte back a fixed time in each direction: a long link.

`tc netem` is not available on these machines, so a link with a round
trip of 2 x delay is made in user space: each chunk read on one side is
written on the other once `delay` has passed since it was read, in order,
without slowing the stream (latency, not a bandwidth limit). Loopback
only, at most `max_conns` connections at once, at most QUEUE chunks held
per direction, and it stops with the benchmark (stop(), or its thread
dies with the process).

    with DelayProxy(target_port=9000, delay=0.020) as proxy:
        ... http://127.0.0.1:{proxy.port} ...

A benchmark runs it as a process of its own (`Spawned`, or `python
delayproxy.py PORT DELAY`, which prints the port it listens on), as a
real link is: in the measured process its thread would wait for the GIL
behind the upload threads, and stretch the delay.
"""

import asyncio
import subprocess
import sys
import threading
import time

CHUNK = 1 << 20
QUEUE = 64             # chunks held per direction: 64 MiB in flight at most


class DelayProxy:
    def __init__(self, target_port, delay, max_conns=64):
        self.target, self.delay, self.max_conns = target_port, delay, max_conns
        self.port = None
        self.conns = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = None

    def __enter__(self):
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if not self._thread.is_alive():
            return
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._server = None
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _cancel_all(self):
        """End every connection still open (each closes its sockets as it goes)."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, creader, cwriter):
        if self.conns >= self.max_conns:
            cwriter.close()
            return
        self.conns += 1
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            self.conns -= 1
            cwriter.close()
            return
        try:
            await asyncio.gather(self._pipe(creader, swriter), self._pipe(sreader, cwriter))
        except asyncio.CancelledError:
            pass            # stop(): end quietly
        finally:
            self.conns -= 1
            for w in (cwriter, swriter):
                w.close()

    async def _pipe(self, reader, writer):
        queue = asyncio.Queue(QUEUE)

        async def read():
            try:
                while True:
                    data = await reader.read(CHUNK)
                    await queue.put((time.monotonic() + self.delay, data))
                    if not data:
                        return
            except OSError:
                await queue.put((time.monotonic(), b""))

        async def write():
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        try:
            await asyncio.gather(read(), write())
        except OSError:
            pass


class Spawned:
    """A DelayProxy in a process of its own: .port, .stop()."""

    def __init__(self, target_port, delay):
        self.proc = subprocess.Popen([sys.executable, __file__, str(target_port), str(delay)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


if __name__ == "__main__":
    proxy = DelayProxy(int(sys.argv[1]), float(sys.argv[2])).__enter__()
    print(proxy.port, flush=True)
    proxy._thread.join()
