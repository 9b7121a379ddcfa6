"""The machine's limit: a plain grpc.aio unary echo server (uvloop, no
interceptors, no health or reflection services), run as its own process.

Every bench plan is measured beside this server driven by the same load
generator at the same concurrency, so a throughput figure can be read as a
share of what this machine does with one gRPC round trip per request at that
moment (other load on a shared machine moves both).

    python -m controlplane.bench.echo --listen 127.0.0.1:0
    # prints: ECHO_READY host:port

With ``--tls-dir DIR`` it serves mutual TLS with the `dispatch` certificate
of a `galaxy certs` directory: the yardstick for a TLS control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys

import grpc

from controlplane.runtime import procs

METHOD = "/galaxy.bench.Echo/Echo"
READY_PREFIX = "ECHO_READY "


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def serve(listen: str, tls_dir: str | None = None) -> None:
    """Serve the echo method until SIGTERM/SIGINT or stdin closes (mutual
    TLS with tls_dir's `dispatch` certificate when given)."""
    server = grpc.aio.server()
    # Bytes in, bytes out: no (de)serializer, the cheapest unary call there is.
    handler = grpc.method_handlers_generic_handler(
        "galaxy.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    if tls_dir:
        from controlplane.runtime.tls import TlsConfig

        creds = TlsConfig.for_identity(tls_dir, "dispatch").server_credentials()
        port = server.add_secure_port(listen, creds)
    else:
        port = server.add_insecure_port(listen)
    await server.start()
    host = listen.rsplit(":", 1)[0]
    print(f"{READY_PREFIX}{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Lifeline: the runner holds our stdin; EOF means it is gone.
    loop.add_reader(sys.stdin.fileno(), lambda: _on_stdin(stop))
    await stop.wait()
    await server.stop(grace=0.5)


def _on_stdin(stop: asyncio.Event) -> None:
    import os

    try:
        data = os.read(sys.stdin.fileno(), 4096)
    except OSError:
        data = b""
    if not data:
        asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
        stop.set()


class EchoProcess:
    """The echo server as a child process of the runner."""

    def __init__(self) -> None:
        self.proc: procs.Spawned | None = None
        self.address = ""

    async def start(self, listen: str = "127.0.0.1:0", tls_dir: str | None = None) -> str:
        """Start the server; returns its address."""
        self.proc = await procs.spawn(
            sys.executable,
            "-m",
            "controlplane.bench.echo",
            "--listen",
            listen,
            *(["--tls-dir", tls_dir] if tls_dir else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        text = line.decode().strip()
        if not text.startswith(READY_PREFIX):
            await self.stop()
            raise RuntimeError(f"echo server did not start: {text!r}")
        self.address = text[len(READY_PREFIX) :]
        return self.address

    @property
    def pid(self) -> int:
        """Process id (0 before start)."""
        return self.proc.pid if self.proc else 0

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        p, self.proc = self.proc, None
        if p is None or p.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
        try:
            await asyncio.wait_for(p.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m controlplane.bench.echo``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--tls-dir", default=None, help="serve mutual TLS (a `galaxy certs` dir)")
    args = p.parse_args(argv)
    from controlplane.runtime.host import install_uvloop

    install_uvloop()
    asyncio.run(serve(args.listen, args.tls_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
