"""The XDP drop path (issue 34): bans, the deny list and per-source token buckets
dropped by a BPF program before the kernel allocates an skb.

Public API (what the kernel registry / daemon wire in):

    XdpPath(netns)            one namespace's program + pinned maps (/sys/fs/bpf/netlimit/…)
      .sync(interfaces, mode) load (maps kept), attach/replace atomically, detach elsewhere
      .load() / .attach(ifname, mode) / .detach(ifname) / .attachments() / .foreign()
      .set_rules([XdpRule]) / .rules() / .counters() -> Counters
      .add_bans(...) / .remove_prefixes("bans", ...) / .set_prefixes(kind, ...) / .prefixes(kind)
      .flush()                detach everywhere + unpin
      .test_run(frame, repeat) BPF_PROG_TEST_RUN cost per packet
    XdpRule                   one early rule (limit/period/burst/protocol/ports/source prefix)
    XdpError                  every refusal (foreign program, missing interface, kernel error)
    leftovers()               files still pinned under /sys/fs/bpf/netlimit
    prune_stale()             unpin the directories of namespaces that no longer exist
    UNSUPPORTED               rule features XDP cannot express, with the reason
"""

from netlimit.kernel.xdp.libbpf import XdpError
from netlimit.kernel.xdp.maps import MAX_RULES, XdpRule
from netlimit.kernel.xdp.packets import frame
from netlimit.kernel.xdp.path import PIN_ROOT, Attachment, Counters, XdpPath, leftovers, prune_stale

# Rule features an XDP program cannot express: it runs before conntrack, so it has no
# notion of a connection. validate must refuse these with `early: true`, naming why.
UNSUPPORTED = {
    "recent": "XDP runs before conntrack: there is no 'new connection' to count",
    "connlimit": "XDP runs before conntrack: concurrent connections are not visible",
    "new_connections": "XDP runs before conntrack: it cannot tell a new connection from a packet",
    "bandwidth": "XDP can only pass or drop, not queue or shape (use tc)",
}

__all__ = [
    "MAX_RULES",
    "PIN_ROOT",
    "UNSUPPORTED",
    "Attachment",
    "Counters",
    "XdpError",
    "XdpPath",
    "XdpRule",
    "frame",
    "leftovers",
    "prune_stale",
]
