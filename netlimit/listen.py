"""Listen addresses as operators write them on the command line."""

from __future__ import annotations


def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """HOST:PORT, [v6]:PORT or :PORT (all interfaces) → (host, port); ValueError
    naming ``flag`` otherwise."""
    t = text.strip()
    if t.startswith("["):
        end = t.find("]")
        if end < 0 or not t[end + 1 :].startswith(":"):
            raise ValueError(f"{flag} {text!r}: expected [ADDRESS]:PORT")
        host, port_s = t[1:end], t[end + 2 :]
    else:
        host, sep, port_s = t.rpartition(":")
        if not sep:
            raise ValueError(f"{flag} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8181")
        if ":" in host:
            raise ValueError(f"{flag} {text!r}: write IPv6 addresses as [ADDRESS]:PORT")
    if not (port_s.isascii() and port_s.isdigit()) or len(port_s) > 5 or int(port_s) > 65535:
        raise ValueError(f"{flag} {text!r}: port must be 0-65535")
    return host or "0.0.0.0", int(port_s)


def format_hostport(host: str, port: int) -> str:
    """(host, port) as HOST:PORT, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
