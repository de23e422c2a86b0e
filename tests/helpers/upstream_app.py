"""A tiny upstream application for the proxy and nginx tests (run as a process).

    python upstream_app.py            # prints "PORT <n>" on stdout once listening

Routes:
  * /status/<code>   answers <code> with body "status <code>"
  * /stream          three chunks, 0.6 s apart (no Content-Length: chunked)
  * /big?n=<bytes>   n deterministic bytes with Content-Length
  * /gzip            a gzip body with Content-Encoding: gzip (must not be decoded)
  * /upload          streams the request body in; answers its size and sha256
  * /hop             a response carrying hop-by-hop headers (must be dropped)
  * /count           how many requests this process has seen (all routes)
  * anything else    echoes method, raw path, headers and body as JSON, sets two cookies
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import sys

from aiohttp import web

SEEN = {"n": 0}


@web.middleware
async def count(request, handler):
    if request.path != "/count":
        SEEN["n"] += 1
    return await handler(request)


async def status(request):
    code = int(request.match_info["code"])
    return web.Response(status=code, text=f"status {code}")


async def stream(request):
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    for i in range(3):
        await resp.write(f"chunk-{i}\n".encode())
        if i < 2:
            await asyncio.sleep(0.6)
    await resp.write_eof()
    return resp


def big_body(n: int) -> bytes:
    block = bytes(range(256))
    return (block * (n // 256 + 1))[:n]


async def big(request):
    n = int(request.query.get("n", "1000000"))
    return web.Response(body=big_body(n), content_type="application/octet-stream")


async def gz(request):
    body = gzip.compress(b"compressed hello\n" * 100, mtime=0)
    return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})


async def upload(request):
    h = hashlib.sha256()
    size = 0
    async for chunk in request.content.iter_any():
        h.update(chunk)
        size += len(chunk)
    return web.json_response(
        {
            "size": size,
            "sha256": h.hexdigest(),
            "chunked": "chunked" in request.headers.get("Transfer-Encoding", ""),
            "content_length": request.headers.get("Content-Length"),
        }
    )


async def hop(request):
    return web.Response(
        text="hop",
        headers={
            "Connection": "X-Hop-Secret",
            "X-Hop-Secret": "drop me",
            "Keep-Alive": "timeout=5",
            "X-End-To-End": "keep me",
        },
    )


async def counter(request):
    return web.json_response({"n": SEEN["n"]})


async def echo(request):
    body = await request.read()
    resp = web.json_response(
        {
            "method": request.method,
            "raw_path": request.raw_path,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body": body.decode("utf-8", "replace"),
        }
    )
    resp.headers.add("Set-Cookie", "a=1; Path=/")
    resp.headers.add("Set-Cookie", "b=2; Path=/")
    resp.headers["X-Upstream"] = "yes"
    return resp


def main() -> None:
    app = web.Application(middlewares=[count], client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/status/{code:\\d+}", status)
    app.router.add_get("/stream", stream)
    app.router.add_get("/big", big)
    app.router.add_get("/gzip", gz)
    app.router.add_post("/upload", upload)
    app.router.add_get("/hop", hop)
    app.router.add_get("/count", counter)
    app.router.add_route("*", "/{tail:.*}", echo)

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        print(f"PORT {port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
