"""A real S3-compatible endpoint for tests (moto's server on 127.0.0.1) and a fault proxy.

The proxy sits between s3fs and moto and injects faults on a deterministic schedule:
every `slowdown_every`-th request (default 10th; each costs the client a backoff) answers 503
SlowDown; the first ranged GET of each object sends 64 KB of its body and then drops the
connection; the second ranged GET of each object answers a well-formed but short body; one
ranged GET stalls past the client's read timeout; objects named in `deny` answer 403.
Counters record what actually happened.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        *,
        stall_s: float = 3.0,
        cut_after: int = 64 << 10,
        faults: bool = True,
        slowdown_every: int = 10,
    ) -> None:
        self.upstream = urlsplit(upstream)
        self.stall_s = stall_s
        self.cut_after = cut_after
        self.faults = faults
        self.slowdown_every = slowdown_every
        self.deny: set[str] = set()
        self.counts: Counter = Counter()
        self.requests: list[tuple[str, str]] = []
        self._gets: Counter = Counter()
        self._lock = threading.Lock()
        self._stalled = False
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                proxy.handle(self, "GET")

            def do_HEAD(self) -> None:
                proxy.handle(self, "HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _decide(self, method: str, path: str, ranged: bool) -> str:
        with self._lock:
            self.counts["requests"] += 1
            self.requests.append((method, path))
            key = path.split("?", 1)[0]
            if any(key.endswith("/" + name) for name in self.deny):
                return "deny"
            if not self.faults:
                return "pass"
            if self.counts["requests"] % self.slowdown_every == 0:
                return "slowdown"
            if method == "GET" and ranged:
                self._gets[key] += 1
                if self._gets[key] == 1:
                    return "cut"
                if self._gets[key] == 2:
                    return "short"
                if self._gets[key] == 4 and not self._stalled:
                    self._stalled = True
                    return "stall"
            return "pass"

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        ranged = "Range" in req.headers
        action = self._decide(method, req.path, ranged)
        if action in ("slowdown", "deny"):
            body = SLOWDOWN if action == "slowdown" else DENIED
            self.counts[action] += 1
            req.send_response(503 if action == "slowdown" else 403)
            req.send_header("Content-Type", "application/xml")
            req.send_header("Content-Length", str(len(body) if method == "GET" else 0))
            req.end_headers()
            if method == "GET":
                req.wfile.write(body)
            return
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        headers = {k: v for k, v in req.headers.items() if k.lower() != "connection"}
        conn.request(method, req.path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        if action == "stall":
            self.counts["stall"] += 1
            time.sleep(self.stall_s)
        if action == "short" and resp.status == 206 and len(body) > 1000:
            self.counts["short"] += 1
            body = body[:1000]
        req.send_response(resp.status)
        for name, value in resp.getheaders():
            if name.lower() not in (
                "content-length",
                "transfer-encoding",
                "connection",
                "date",
                "server",
            ):
                req.send_header(name, value)
        if method == "HEAD":
            req.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            req.end_headers()
            return
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        try:
            if action == "cut" and resp.status == 206 and len(body) > self.cut_after:
                self.counts["cut"] += 1
                req.wfile.write(body[: self.cut_after])
                req.wfile.flush()
                req.connection.shutdown(socket.SHUT_RDWR)
                req.close_connection = True
                return
            req.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on a stalled response
