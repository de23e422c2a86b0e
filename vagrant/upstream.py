"""The small upstream application the limiter's HTTP sidecar proxies to (stdlib only).

    python3 upstream.py --listen 127.0.0.1:8081

Answers every GET with a short JSON body naming itself, the path and the
client address the sidecar forwarded (X-Forwarded-For), so a 200 seen by a
client provably came from here and a 429 provably did not.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    server_version = "netlimit-upstream/1"

    def do_GET(self) -> None:  # http.server's naming
        body = json.dumps(
            {"app": "netlimit-upstream", "path": self.path, "forwarded_for": self.headers.get("X-Forwarded-For")}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args) -> None:  # quiet: the scenario sends bursts
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1:8081")
    a = p.parse_args()
    host, _, port = a.listen.rpartition(":")
    srv = ThreadingHTTPServer((host, int(port)), Handler)
    print(f"netlimit-upstream listening on {a.listen}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
