"""Bans: repeat offenders dropped at L3 on every host (README: Escalation and bans).

* model.py          a ban (prefix, expiry, rule, reason, who), parsing, who is never banned
* store.py          what a ban list answers; the memory list (one host, kept by netlimitd)
* redis_store.py    the fleet's list in Redis: Lua writes, a pub/sub channel per change
* socket_client.py  the memory list of this host's netlimitd, over its status socket
* follow.py         follow a list from a thread (snapshot on every connect, then changes)
* index.py          a host's active bans and what its kernel set must hold (pure)
* escalate.py       L7 escalation: count a client's denials, ban the repeat offender
* cli.py            `netlimit ban add|del|list|flush`

The engine (netlimit.limit) does not know this package: the Limiter calls one hook
on every denial (``on_over``) that the sidecar points at escalate.Escalator.note.
"""
