"""The sidecar's own endpoints, as a handler of http11.connection.HttpConnection: the
decision endpoints (nginx auth_request, Envoy ext_authz, the JSON API) and the
operator endpoints (/healthz, /metrics, /v1/rules, /v1/top).

The common decision -- a bodiless GET /v1/check admitted by an in-process store
-- is answered in the same loop iteration, from the decision, without building
result objects; everything else goes through the general path.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import BadRequest
from ..limit.limiter import OVER_LIMIT
from ..limit.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..limit.request import CheckRequest
from ..logevery import LogEvery
from . import responses
from .app import Sidecar
from .auth import bearer_ok
from .http11.connection import HttpConnection
from .http11.head import Request
from .http11.limits import ClientError
from .json_api import parse_json_request
from .responses import Reply

log = logging.getLogger("netlimit.sidecar")

#: the JSON API's body
MAX_JSON_BODY = 64 * 1024
#: the fields the decision endpoints read (header actions add theirs)
_FIELDS = frozenset(
    (
        "host",
        "content-length",
        "transfer-encoding",
        "expect",
        "x-original-uri",
        "x-original-method",
        "x-forwarded-uri",
        "x-forwarded-method",
        "x-forwarded-for",
    )
)
_KIND = ("check", "authz")  # FrontStats endpoint names by endpoint kind
_OK = (("check", "ok"), ("authz", "ok"))  # FrontStats.requests keys by endpoint kind
_AUTH_FIELDS = frozenset(("authorization",))
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="netlimit"'}
_auth_log = LogEvery(10.0)


class Endpoints:
    """Routes a request head to an endpoint.  ``decisions``: serve /v1/check and
    /v1/authz; ``admin``: serve /healthz, /metrics, /v1/rules and /v1/top."""

    def __init__(self, sc: Sidecar, *, decisions: bool = True, admin: bool = True):
        self.sc = sc
        self.decisions = decisions
        self.admin = admin
        self._plan: Any = None
        self._wanted: frozenset[str] = _FIELDS
        self.token: bytes | None = sc.admin_token  # --admin-token-file: every request needs it

    @property
    def wanted(self) -> frozenset[str]:
        plan = self.sc.plan
        if plan is not self._plan:  # the rules were reloaded: their header actions may differ
            self._plan = plan
            self._wanted = _FIELDS | plan.header_names | (_AUTH_FIELDS if self.token is not None else frozenset())
        return self._wanted

    def bad_request(self) -> None:
        self.sc.front.request("http", "bad_request")

    def handle(self, conn: HttpConnection, req: Request) -> Any:
        path = req.path
        method = req.method
        if self.token is not None and not bearer_ok(req.fields.get("authorization"), self.token):
            return self._unauthorized(conn, req)
        if self.decisions:
            if path == "/v1/check":
                if method in ("GET", "HEAD"):
                    return self._check(conn, req)
                if method == "POST":
                    return self._json(conn, req)
                raise ClientError(405, "/v1/check takes GET (nginx auth_request) or POST (the JSON API)")
            if path == "/v1/authz" or path.startswith("/v1/authz/"):
                return self._decide(conn, req, 1, 429)
        if self.admin and path in ("/healthz", "/metrics", "/v1/rules", "/v1/top"):
            if method not in ("GET", "HEAD"):
                raise ClientError(405, f"{path} takes GET")
            sc = self.sc
            head = method == "HEAD"
            if sc.peers is not None and path in ("/metrics", "/v1/top"):  # --workers N: every worker's
                return self._gathered(req, path)
            if path == "/metrics":
                return responses.response(
                    200, None, sc.metrics.render(), METRICS_CONTENT_TYPE, keep=req.keep, http10=req.http10,
                    head_only=head,
                )  # fmt: skip
            doc = sc.health() if path == "/healthz" else sc.top_doc() if path == "/v1/top" else sc.rules_doc()
            return responses.json_response(200, doc, keep=req.keep, http10=req.http10, head_only=head)
        return responses.problem(404, "Not Found", f"no endpoint {path[:200]!r} here", keep=req.keep, http10=req.http10)

    async def _gathered(self, req: Request, path: str) -> bytes:
        """/metrics and /v1/top of every worker (peers.py)."""
        sc = self.sc
        peers = sc.peers
        assert peers is not None
        head = req.method == "HEAD"
        if path == "/metrics":
            body = await peers.metrics(sc.metrics.render())
            return responses.response(200, None, body, METRICS_CONTENT_TYPE, keep=req.keep, http10=req.http10,
                                      head_only=head)  # fmt: skip
        doc = await peers.top(sc.top_doc())
        return responses.json_response(200, doc, keep=req.keep, http10=req.http10, head_only=head)

    def _unauthorized(self, conn: HttpConnection, req: Request) -> bytes:
        self.sc.front.request("http", "unauthorized")
        held = _auth_log.due("401")
        if held >= 0:
            more = f" ({held} more since the last report)" if held else ""
            why = "a wrong" if "authorization" in req.fields else "no"
            log.warning("request from %s for %s refused with 401: %s bearer token%s",
                        conn.peer, req.path[:200], why, more)  # fmt: skip
        return responses.problem(
            401, "Unauthorized", "this endpoint needs 'Authorization: Bearer <token>' (--admin-token-file)",
            _CHALLENGE, keep=req.keep, http10=req.http10,
        )  # fmt: skip

    # -- decisions ----------------------------------------------------------------------

    def _check(self, conn: HttpConnection, req: Request) -> Any:
        sc = self.sc
        memo = conn.memo
        if memo is not None and not req.query and (req.xff is None or sc._xff_warned):
            lim = sc.limiter
            rs = lim.rules
            if memo[0] is sc.plan and memo[1] is rs:  # the connection's descriptor, matched and keyed
                result = lim.check_keyed(rs, memo[2], memo[3], memo[4])
                if isinstance(result, tuple):  # admitted, no delay: _decided's answer
                    rule, dec = result
                    sc.front.requests["check", "ok"] += 1
                    return responses.ok_decision(
                        dec.limit, dec.remaining, dec.reset, rule.policy, rule.sf_name, req.keep, req.http10
                    )
                return self._answer(req, 0, result, 429)
        try:
            descs, deny = self.sc.check_request(conn.peer, req.fields, req.query, req.xff)
        except BadRequest as exc:  # answered, the connection kept
            self.sc.front.request("check", "bad_request")
            return responses.problem(400, "Bad Request", str(exc), keep=req.keep, http10=req.http10,
                                     head_only=req.method == "HEAD")  # fmt: skip
        if sc.plan.peer_only and len(descs) == 1 and sc.limiter.is_sync:
            self._remember(conn, descs)
        return self._decided(req, 0, descs, deny)

    def _remember(self, conn: HttpConnection, descs: list) -> None:
        """Keep the connection's descriptor with its rule and store key: with actions
        that read nothing but the TCP peer, every request of the connection has it
        (until a reload changes the plan or the rules: the memo names both)."""
        sc = self.sc
        rs = sc.limiter.rules
        if rs.has_replaces:
            return
        r = rs.match(descs[0])
        key = None if r is None or r.limit is None else rs.store_key(r, descs[0])
        conn.memo = (sc.plan, rs, r, key, descs)

    def _decide(self, conn: HttpConnection, req: Request, kind: int, deny: int) -> Any:
        descs = self.sc.authz_request(conn.peer, req.fields, req.method, req.path, req.query, req.xff)
        return self._decided(req, kind, descs, deny)

    def _decided(self, req: Request, kind: int, descs: list, deny: int) -> Any:
        sc = self.sc
        lim = sc.limiter
        if not lim.is_sync:
            return self._later(req, kind, descs, deny)
        result = lim.check_fast(descs)
        if isinstance(result, tuple):  # one descriptor, admitted, no delay: (rule, decision)
            rule, dec = result
            sc.front.requests[_OK[kind]] += 1
            return responses.ok_decision(
                dec.limit, dec.remaining, dec.reset, rule.policy, rule.sf_name, req.keep, req.http10
            )
        return self._answer(req, kind, result, deny)

    def _answer(self, req: Request, kind: int, result: Any, deny: int) -> Any:
        """The answer to a decision other than the common admitted one."""
        reply = self._reply(kind, result, deny)
        if reply.delay > 0:
            return self._delayed(req, reply)
        return reply.encode(req.keep, req.http10, req.method == "HEAD")

    def _reply(self, kind: int, result: Any, deny: int) -> Reply:
        """Count the decision and have responses.py build its answer (the nginx door
        also gets the problem in a header)."""
        self.sc.front.request(_KIND[kind], "over_limit" if result.code == OVER_LIMIT else "ok")
        return responses.decision_reply(result, deny, nginx=kind == 0)

    async def _later(self, req: Request, kind: int, descs: list, deny: int) -> bytes:
        sc = self.sc
        result = await sc.limiter.check(CheckRequest.simple(sc.limiter.rules.domain, descs))
        reply = self._reply(kind, result, deny)
        if reply.delay > 0:
            await asyncio.sleep(reply.delay)
        return reply.encode(req.keep, req.http10, req.method == "HEAD")

    async def _delayed(self, req: Request, reply: Reply) -> bytes:
        await asyncio.sleep(reply.delay)  # leaky bucket queue mode: the request's slot
        return reply.encode(req.keep, req.http10, req.method == "HEAD")

    async def _json(self, conn: HttpConnection, req: Request) -> bytes:
        sc = self.sc
        try:
            raw = b"" if req.body is None else await req.body.read_all(MAX_JSON_BODY, "the JSON body")
        except ClientError:
            sc.front.request("json", "bad_request")
            raise
        try:
            creq = parse_json_request(raw)
        except BadRequest as exc:
            sc.front.request("json", "bad_request")
            return responses.problem(400, "Bad Request", str(exc), keep=req.keep, http10=req.http10)
        result = await sc.limiter.check(creq)
        sc.front.request("json", "over_limit" if result.code == OVER_LIMIT else "ok")
        return responses.json_decision(result, keep=req.keep, http10=req.http10)
