"""An upstream for attack tests: it records every byte each connection
delivers, splits them into requests with llhttp (httptools, strict), answers
each with a short 200, and keeps the list of (method, target, body) it saw.

What an attack is judged by is what reached the application: this upstream
is the application.
"""

from __future__ import annotations

import socket
import threading

import httptools


class _Split:
    def __init__(self, out: list, lock: threading.Lock, conn: socket.socket, heads: list | None = None):
        self.out, self.lock, self.conn = out, lock, conn
        self.heads = heads  # the header fields of each request, as received (parallel to out)
        self.url = b""
        self.body = b""
        self.fields: list[tuple[str, str]] = []

    def on_message_begin(self) -> None:
        self.url, self.body, self.fields = b"", b"", []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        with self.lock:
            self.out.append((self.parser.get_method().decode(), self.url.decode("latin-1"), self.body))
            if self.heads is not None:
                self.heads.append(self.fields)
        try:
            self.conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass


class LoggingUpstream:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[tuple[str, str, bytes]] = []
        #: each request's header fields as received, in the order of ``requests``
        self.heads: list[list[tuple[str, str]]] = []
        self.raw: list[bytes] = []
        self.bad = 0  # connections whose bytes llhttp refused
        self.accepts = 0
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepts += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        split = _Split(self.requests, self.lock, c, self.heads)
        p = split.parser = httptools.HttpRequestParser(split)
        raw = b""
        c.settimeout(30)
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                raw += data
                try:
                    p.feed_data(data)
                except httptools.HttpParserError:
                    with self.lock:
                        self.bad += 1
                    break
        except OSError:
            pass
        finally:
            with self.lock:
                self.raw.append(raw)
            c.close()
