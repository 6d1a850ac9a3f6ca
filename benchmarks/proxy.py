"""Overhead of the fault proxy with no toxics, against a direct connection, on loopback.

    python benchmarks/proxy.py [--blocks 10] [--small 3000] [--fresh 1000] [--seconds 0.5] [--uploads 30]
                               [--loop uvloop] [--toxic http_status:toxicity=0]

Starts the echo HTTP upstream (``python -m mmchaos.proxy.echo``) and the proxy, each in its own
process, and measures from this process with raw keep-alive sockets (so the client adds as little
as possible):

- small ``GET /json`` requests on one connection, one at a time: the added latency;
- small requests on 8 connections kept busy for ``--seconds`` per block: requests/s under load;
- small requests each on a new connection (connect, request, response, close), one at a time:
  the cost of connection set-up (issue 11: 47-66% of direct before its fix);
- ``POST /upload`` of 5 MB bodies, one at a time: MB/s.

Direct and proxied runs alternate in blocks, so drift on a shared machine hits both alike.
Throughput of uploads is size / median time (the mean-based ratio is printed under the table: on
a shared machine a few scheduler stalls move the mean a lot). Goal (issue 6): added p50 <= 0.3 ms
and >= 80% of direct throughput. All traffic stays on 127.0.0.1; both child processes are
stopped, and their ports checked closed, before exit.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = b"GET /json HTTP/1.1\r\nHost: bench\r\n\r\n"


def _spawn(args: list[str]) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise RuntimeError(f"{args} did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    host, _, port = line.removeprefix("listening ").rpartition(":")
    return proc, (host, int(port))


def _stop(proc: subprocess.Popen[str], addr: tuple[str, int]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    with socket.socket() as s:
        assert s.connect_ex(addr) != 0, f"{addr} still listening"


class Client:
    """An HTTP/1.1 keep-alive client for Content-Length responses, blocking or driven by a selector."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.t0 = 0.0

    def parse(self) -> bytes | None:
        """One complete response from the buffer (status line + body), or None."""
        header, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return None
        length = 0
        for line in header.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if len(rest) < length:
            return None
        self.buf = rest[length:]
        return header.split(b"\r\n", 1)[0] + b" " + rest[:length]

    def request(self, head: bytes, body: bytes = b"") -> bytes:
        self.sock.sendall(head)
        if body:
            self.sock.sendall(body)
        while (resp := self.parse()) is None:
            data = self.sock.recv(1 << 18)
            if not data:
                raise ConnectionError("closed")
            self.buf += data
        return resp


def _sequential(addr: tuple[str, int], n: int, head: bytes, body: bytes = b"") -> list[float]:
    client = Client(addr)
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            status = client.request(head, body)
            out.append((time.perf_counter_ns() - t0) / 1e6)
            assert status.startswith(b"HTTP/1.1 200"), status[:80]
    finally:
        client.sock.close()
    return out


def _fresh(addr: tuple[str, int], n: int) -> list[float]:
    """``n`` small requests, each on a new connection closed after its response; latencies ms."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        client = Client(addr)
        try:
            status = client.request(SMALL)
        finally:
            client.sock.close()
        out.append((time.perf_counter_ns() - t0) / 1e6)
        assert status.startswith(b"HTTP/1.1 200"), status[:80]
    return out


def _concurrent(addr: tuple[str, int], conns: int, seconds: float) -> tuple[list[float], int]:
    """Keep ``conns`` connections busy with small requests for ``seconds``; (latencies ms, completed)."""
    clients = [Client(addr) for _ in range(conns)]
    sel = selectors.DefaultSelector()
    lat: list[float] = []
    try:
        for c in clients:
            c.sock.setblocking(False)
            sel.register(c.sock, selectors.EVENT_READ, c)
            c.t0 = time.perf_counter()
            c.sock.send(SMALL)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for key, _ in sel.select(timeout=1.0):
                c = key.data
                c.buf += c.sock.recv(1 << 16)
                while (resp := c.parse()) is not None:
                    now = time.perf_counter()
                    assert resp.startswith(b"HTTP/1.1 200"), resp[:80]
                    lat.append((now - c.t0) * 1000)
                    c.t0 = now
                    c.sock.send(SMALL)
    finally:
        sel.close()
        for c in clients:
            c.sock.close()
    return lat, len(lat)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a child process (Linux /proc); NaN elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def run(args: argparse.Namespace) -> str:
    upstream, up_addr = _spawn(["-m", "mmchaos.proxy.echo", "--listen", "127.0.0.1:0"])
    proxy = None
    try:
        proxy_args = [__file__, "--role", "proxy", "--upstream", f"{up_addr[0]}:{up_addr[1]}", "--loop", args.loop]
        proxy_args += [f"--toxic={t}" for t in args.toxic]
        if args.profile:
            proxy_args += ["--profile", args.profile]
        proxy, px_addr = _spawn(proxy_args)
        addrs = {"direct": up_addr, "proxy": px_addr}
        body = os.urandom(1024) * (args.upload_mb * 1024)
        up_head = b"POST /upload HTTP/1.1\r\nHost: bench\r\nContent-Length: %d\r\n\r\n" % len(body)
        for addr in addrs.values():  # warm up both paths
            _sequential(addr, 200, SMALL)
            _sequential(addr, 2, up_head, body)
        seq: dict[str, list[float]] = {"direct": [], "proxy": []}
        conc: dict[str, list[float]] = {"direct": [], "proxy": []}
        done: dict[str, int] = {"direct": 0, "proxy": 0}
        upl: dict[str, list[float]] = {"direct": [], "proxy": []}
        fresh: dict[str, list[float]] = {"direct": [], "proxy": []}
        fresh_cpu = 0.0  # the proxy process's CPU seconds over the new-connection workload
        for block in range(args.blocks):
            order = ["direct", "proxy"] if block % 2 == 0 else ["proxy", "direct"]
            for name in order:
                seq[name] += _sequential(addrs[name], args.small // args.blocks, SMALL)
            for name in order:
                c0 = _cpu_seconds(proxy.pid)
                fresh[name] += _fresh(addrs[name], max(1, args.fresh // args.blocks))
                if name == "proxy":
                    fresh_cpu += _cpu_seconds(proxy.pid) - c0
            for name in order:
                lat, n = _concurrent(addrs[name], args.connections, args.seconds)
                conc[name] += lat
                done[name] += n
            for name in order:
                upl[name] += _sequential(addrs[name], max(1, args.uploads // args.blocks), up_head, body)
    finally:
        if proxy is not None:
            _stop(proxy, px_addr)
        _stop(upstream, up_addr)

    total = args.blocks * args.seconds
    mb = args.upload_mb
    rows: list[tuple[str, dict[str, list[float]], Callable[[str], float], str]] = [
        (f"small GET, 1 connection (n={len(seq['direct'])})", seq, lambda k: 1000 / statistics.fmean(seq[k]), "req/s"),
        (
            f"small GET, new connection each (n={len(fresh['direct'])})",
            fresh,
            lambda k: 1000 / statistics.fmean(fresh[k]),
            "req/s",
        ),
        (f"small GET, {args.connections} connections", conc, lambda k: done[k] / total, "req/s"),
        (f"{mb} MB POST upload (n={len(upl['direct'])})", upl, lambda k: mb * 1000 / statistics.median(upl[k]), "MB/s"),
    ]
    lines = [
        "| workload | direct p50 ms | proxy p50 ms | added p50 ms | direct p99 ms | proxy p99 ms | added p99 ms "
        "| direct throughput | proxy throughput | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, data, thr, unit in rows:
        d, p = data["direct"], data["proxy"]
        d50, p50, d99, p99 = _pct(d, 50), _pct(p, 50), _pct(d, 99), _pct(p, 99)
        dt, pt = thr("direct"), thr("proxy")
        lines.append(
            f"| {label} | {d50:.3f} | {p50:.3f} | **{p50 - d50:+.3f}** | {d99:.3f} | {p99:.3f} | {p99 - d99:+.3f} "
            f"| {dt:,.0f} {unit} | {pt:,.0f} {unit} | **{pt / dt:.0%}** |"
        )
    mean_ratio = statistics.fmean(upl["direct"]) / statistics.fmean(upl["proxy"])
    lines.append("")
    toxics = ", ".join(args.toxic) or "none"
    lines.append(
        f"proxy CPU per new-connection request: {fresh_cpu / len(fresh['proxy']) * 1e6:,.0f} us "
        "(CPU time, so less disturbed by other load than the latencies)"
    )
    lines.append(
        f"proxy event loop: {args.loop}; toxics: {toxics}; uploads mean-based throughput ratio: {mean_ratio:.0%}"
    )
    return "\n".join(lines)


async def _proxy_role(upstream: str, toxics: list[str]) -> None:
    import signal

    from mmchaos.cli.proxy_cmd import parse_toxic_spec
    from mmchaos.proxy.proxy import FaultProxy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FaultProxy(upstream, listen="127.0.0.1:0", toxics=[parse_toxic_spec(t) for t in toxics]) as proxy:
        print(f"listening {proxy.address[0]}:{proxy.address[1]}", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10, help="alternating direct/proxy blocks")
    parser.add_argument("--small", type=int, default=3000, help="sequential small requests per path")
    parser.add_argument("--fresh", type=int, default=1000, help="requests on new connections per path")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.5, help="concurrent phase per block and path")
    parser.add_argument("--uploads", type=int, default=30, help="uploads per path")
    parser.add_argument("--upload-mb", type=int, default=5)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="the proxy's event loop")
    parser.add_argument("--toxic", action="append", default=[], help="a toxic on the proxy (mmchaos proxy --toxic)")
    parser.add_argument("--profile", help="write the proxy process's cProfile stats to this file")
    parser.add_argument("--role", choices=["bench", "proxy"], default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "proxy":
        if args.loop == "uvloop":
            import uvloop

            uvloop.install()
        if not args.profile:
            asyncio.run(_proxy_role(args.upstream, args.toxic))
            return
        import cProfile

        with cProfile.Profile(time.process_time) as profile:  # CPU, not the waits in epoll
            asyncio.run(_proxy_role(args.upstream, args.toxic))
        profile.dump_stats(args.profile)
        return
    print(run(args))


if __name__ == "__main__":
    main()
