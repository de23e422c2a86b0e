"""A realistic combined-format access log, generated (deterministic per seed).

A day of traffic with a diurnal rate (a trough at 04:00 UTC, a peak at 16:00,
about 6:1): thousands of clients whose activity is heavy-tailed (a few busy
offices behind one address, many occasional visitors), each visit a few page
views of one page and its assets fetched within a second or two, pages a
reading pause apart; and a few abusers: a scraper walking the catalogue at
25 requests/s for half an hour, a password guesser on POST /login at 2/s for
an hour, and a bot firing bursts of 60 requests every 30 s for three hours.

    python -m bench.access_log 1000000 > access.log
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DAY = 86400
#: 2023-11-14T00:00:00Z
START = 1_699_920_000
CLIENTS = 5000

_WEBKIT = "AppleWebKit/537.36 (KHTML, like Gecko)"
AGENTS = (
    f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) {_WEBKIT} Chrome/120.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
    f"Mozilla/5.0 (Linux; Android 14; Pixel 8) {_WEBKIT} Chrome/120.0.0.0 Mobile Safari/537.36",
)
PREFIXES = (81, 84, 92, 109, 176, 185, 212)
PAGES = (
    "/",
    "/products",
    "/products/{n}",
    "/search?q=item{n}",
    "/cart",
    "/account",
    "/blog/{n}",
    "/api/items?page={n}",
)
ASSETS = ("/static/app.{n}.js", "/static/style.{n}.css", "/img/p{n}.webp", "/favicon.ico", "/api/session")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _diurnal(rng: random.Random) -> float:
    """A time of day (seconds) drawn from a rate of 1 + 0.7 sin(...), peaking at 16:00 UTC."""
    while True:
        t = rng.random() * DAY
        if rng.random() * 1.7 <= 1 + 0.7 * math.sin(2 * math.pi * (t - 10 * 3600) / DAY):
            return t


def _clients(rng: random.Random) -> tuple[list[str], list[float]]:
    ips = []
    seen = set()
    while len(ips) < CLIENTS:
        ip = f"{rng.choice(PREFIXES)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        if ip not in seen:
            seen.add(ip)
            ips.append(ip)
    weights = [1.0 / (i + 1) ** 0.9 for i in range(CLIENTS)]  # Zipf-like: offices and occasional visitors
    return ips, weights


def events(n: int, seed: int = 21) -> list[tuple[float, str, str, str, int, str]]:
    """(time, client, method, target, status, agent) for about ``n`` requests, sorted by time."""
    rng = random.Random(seed)
    ev: list[tuple[float, str, str, str, int, str]] = []
    # the abusers (scaled with n so the mix stays the same: about 7% of the lines)
    scale = n / 1_000_000
    scraper_s = max(1, int(1800 * scale))
    t0 = START + 14 * 3600
    for s in range(scraper_s):
        for k in range(25):
            ev.append((t0 + s + k / 25, "203.0.113.10", "GET", f"/products/{s * 25 + k}", 200, "python-requests/2.31"))
    t0 = START + 2 * 3600
    for s in range(max(1, int(3600 * scale))):
        ev.append((t0 + s, "198.51.100.23", "POST", "/login", 401, "curl/8.4.0"))
        ev.append((t0 + s + 0.5, "198.51.100.23", "POST", "/login", 401, "curl/8.4.0"))
    t0 = START + 18 * 3600
    for b in range(max(1, int(360 * scale))):
        for k in range(60):
            ev.append((t0 + 30 * b + k / 200, "192.0.2.77", "GET", f"/api/items?page={k}", 200, "Go-http-client/1.1"))
    ips, weights = _clients(rng)
    agent_of = {ip: rng.choice(AGENTS) for ip in ips}
    while len(ev) < n:
        ip = rng.choices(ips, weights)[0]
        ua = agent_of[ip]
        t = START + _diurnal(rng)
        for _ in range(1 + int(rng.expovariate(1 / 4))):  # page views in the visit
            page = rng.choice(PAGES).format(n=rng.randrange(2000))
            method = "POST" if page == "/cart" and rng.random() < 0.3 else "GET"
            ev.append((t, ip, method, page, 200, ua))
            if rng.random() < 0.02:
                ev.append((t + 1, ip, "POST", "/login", 302, ua))
            for _ in range(rng.randrange(12)):  # its assets, fetched within ~2 s
                ev.append((t + rng.random() * 2, ip, "GET", rng.choice(ASSETS).format(n=rng.randrange(40)), 200, ua))
            t += rng.expovariate(1 / 30)
    del ev[n:]
    ev.sort(key=lambda e: e[0])
    return ev


def _stamp(t: int) -> str:
    tm = time.gmtime(t)
    return (
        f"{tm.tm_mday:02d}/{MONTHS[tm.tm_mon - 1]}/{tm.tm_year}:{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000"
    )


def lines(n: int, seed: int = 21) -> Iterator[str]:
    last = -1
    stamp = ""
    rng = random.Random(seed + 1)
    for t, ip, method, target, status, ua in events(n, seed):
        s = int(t)
        if s != last:
            last, stamp = s, _stamp(s)
        size = rng.randrange(200, 60000)
        yield f'{ip} - - [{stamp}] "{method} {target} HTTP/1.1" {status} {size} "-" "{ua}"\n'


def write(path: Path, n: int, seed: int = 21) -> Path:
    with open(path, "w") as f:
        f.writelines(lines(n, seed))
    return path


if __name__ == "__main__":
    sys.stdout.writelines(lines(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000))
