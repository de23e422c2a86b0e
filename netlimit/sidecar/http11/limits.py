"""The bounds of one client connection (:class:`Limits`, nginx's defaults) and
the refusal a client gets when a request oversteps them or breaks the grammar
(:class:`ClientError`: a 4xx and the connection closed).  The bottom of the
package: it imports none of its modules."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import NetlimitError


@dataclass
class Limits:
    """What one client connection may cost; the defaults follow nginx's."""

    header_timeout: float = 30.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 75.0
    send_timeout: float = 60.0
    max_head: int = 64 * 1024
    max_headers: int = 100
    max_pipeline: int = 32
    max_body_buffer: int = 256 * 1024
    write_high: int = 256 * 1024
    write_low: int = 64 * 1024


class ClientError(NetlimitError):
    """A request answered with a 4xx and the connection closed (status, detail)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail
