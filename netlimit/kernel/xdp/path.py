"""One network namespace's XDP drop path: load, pin, attach, fill maps, read counters, flush.

Layout: /sys/fs/bpf/netlimit/<ns-NAME | host>/ holds the program (`prog`) and its maps
by name (exempt4/6, bans4/6, deny4/6, rules, buckets, counters). One program per
namespace, attached to every listed interface of it; the maps — bans, per-source
buckets — are shared by those interfaces and survive program replacement (libbpf
reuses a pinned map of the same shape) and daemon restarts (pins outlive processes).

Every method opens what it needs from the pins: no in-process state that a restart
could lose. Attachment is netlink (bpf_xdp_attach): the kernel holds the program as
long as it is attached, `ip link` shows it, and XDP_FLAGS_REPLACE with the expected
old program swaps it without a gap. A program that is not netlimit's (another name) is
never replaced nor detached.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import netlimit.kernel.xdp.libbpf as bpf
from netlimit.kernel.netns import NetnsError, check_netns, netns_path, run_in_netns
from netlimit.kernel.xdp.libbpf import XdpError, check
from netlimit.kernel.xdp.maps import (
    BUCKET_KEY,
    COUNTER,
    MAX_RULES,
    RULE,
    STAT_BANNED,
    STAT_DENIED,
    STAT_EXEMPT,
    STAT_PASSED,
    VALUE,
    BpfMap,
    Network,
    XdpRule,
    decode_rule,
    encode_rules,
    lpm_key_decode,
    prefix_key,
    split_keys,
)

BPFFS = "/sys/fs/bpf"
PIN_ROOT = os.path.join(BPFFS, "netlimit")
PROG_NAME = "netlimit_xdp"  # the C function's name: how an attached program is recognised as ours
MODES = ("auto", "native", "generic")
_MODE_FLAG = {"native": bpf.XDP_FLAGS_DRV_MODE, "generic": bpf.XDP_FLAGS_SKB_MODE}
_ATTACHED_MODE = {bpf.ATTACHED_DRV: "native", bpf.ATTACHED_SKB: "generic", bpf.ATTACHED_HW: "offload"}

# name -> (key size, value size, per-CPU)
MAP_SHAPES: dict[str, tuple[int, int, bool]] = {
    "exempt4": (8, 8, False),
    "exempt6": (20, 8, False),
    "bans4": (8, 8, False),
    "bans6": (20, 8, False),
    "deny4": (8, 8, False),
    "deny6": (20, 8, False),
    "rules": (4, RULE.size, False),
    "buckets": (BUCKET_KEY.size, 8, False),
    "counters": (4, COUNTER.size, True),
}
KINDS = ("exempt", "bans", "deny")


@dataclass(frozen=True)
class Attachment:
    netns: str | None
    ifname: str
    ifindex: int
    prog_id: int
    mode: str  # native | generic
    replaced: bool = False  # an older netlimit program was swapped out (atomically)


@dataclass
class Counters:
    """Sums over CPUs. rules[i] = (passed, dropped) of rule slot i."""

    rules: list[tuple[int, int]] = field(default_factory=list)
    banned: int = 0
    denied: int = 0
    exempt: int = 0
    passed: int = 0


def ensure_bpffs() -> None:
    """bpffs at /sys/fs/bpf (mounted if it is not; containers often lack it)."""
    with open("/proc/self/mounts") as fh:
        if any(line.split()[1:3] == [BPFFS, "bpf"] for line in fh if len(line.split()) > 2):
            return
    if subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True, timeout=30).returncode != 0:
        raise XdpError(f"bpffs is not mounted at {BPFFS} and mounting it failed (needs root)")


def pin_dir_for(netns: str | None, root: str = PIN_ROOT) -> str:
    return os.path.join(root, f"ns-{netns}" if netns else "host")


class XdpPath:
    """The drop path of one namespace (None: the daemon's own)."""

    def __init__(self, netns: str | None = None, *, pin_root: str = PIN_ROOT, obj_path: str | None = None):
        if netns is not None:
            check_netns(netns)
        self.netns = netns
        self.pin_root = pin_root
        self.pin_dir = pin_dir_for(netns, pin_root)
        self.obj_path = obj_path
        self._maps: dict[str, BpfMap] = {}

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> XdpPath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    def where(self, ifname: str | None = None) -> str:
        ns = f"netns {self.netns}" if self.netns else "the host namespace"
        return f"interface {ifname} in {ns}" if ifname else ns

    def loaded(self) -> bool:
        return os.path.exists(os.path.join(self.pin_dir, "prog"))

    def load(self, *, buckets: int | None = None) -> int:
        """Load the object, reusing the pinned maps (their contents survive), pin the new
        program atomically over the old pin; returns the new program's id. Attached
        interfaces keep the old program until attach() replaces it."""
        ensure_bpffs()
        os.makedirs(self.pin_dir, mode=0o700, exist_ok=True)
        if self.obj_path is None:
            # imported here: `python -m netlimit.kernel.xdp.build` must not find itself imported
            from netlimit.kernel.xdp.build import object_path

            path = object_path()
        else:
            path = self.obj_path
        lib = bpf.lib()
        obj = lib.bpf_object__open_file(path.encode(), None)
        if not obj:
            raise XdpError(f"cannot open BPF object {path}: {os.strerror(ctypes.get_errno() or 22)}")
        try:
            for name in MAP_SHAPES:
                m = lib.bpf_object__find_map_by_name(obj, name.encode())
                if not m:
                    raise XdpError(f"{path} has no map {name!r}: object and loader disagree (rebuild it)")
                check(lib.bpf_map__set_pin_path(m, os.path.join(self.pin_dir, name).encode()), f"pin path of {name}")
                if name == "buckets" and buckets:
                    check(lib.bpf_map__set_max_entries(m, buckets), "buckets max_entries")
            rc = lib.bpf_object__load(obj)
            if rc < 0:
                hint = ""
                if any(os.path.exists(os.path.join(self.pin_dir, n)) for n in MAP_SHAPES):
                    hint = f" (a pinned map under {self.pin_dir} may have another shape: flush the XDP path first)"
                check(rc, f"loading {path} into the kernel{hint}")
            prog = lib.bpf_object__find_program_by_name(obj, PROG_NAME.encode())
            fd = lib.bpf_program__fd(prog) if prog else -1
            if fd < 0:
                raise XdpError(f"{path} has no program {PROG_NAME}")
            prog_id, _ = bpf.prog_info(fd)
            tmp = os.path.join(self.pin_dir, f"prog_new{os.getpid()}")  # bpffs refuses names with a dot
            check(lib.bpf_obj_pin(fd, tmp.encode()), f"pinning the program at {tmp}")
            os.replace(tmp, os.path.join(self.pin_dir, "prog"))
            return prog_id
        finally:
            lib.bpf_object__close(obj)

    def prog_id(self) -> int | None:
        path = os.path.join(self.pin_dir, "prog")
        if not os.path.exists(path):
            return None
        fd = bpf.obj_get(path)
        try:
            return bpf.prog_info(fd)[0]
        finally:
            os.close(fd)

    # -- attachment ----------------------------------------------------------------
    def _in_ns(self, fn, *args):
        return run_in_netns(self.netns, fn, *args)

    def attach(self, ifname: str, mode: str = "auto") -> Attachment:
        """Attach the pinned program to `ifname`: first attach with UPDATE_IF_NOEXIST, or
        an atomic XDP_FLAGS_REPLACE of an older netlimit program. A foreign program:
        XdpError, nothing changed. mode auto = native, else generic."""
        if mode not in MODES:
            raise XdpError(f"xdp mode {mode!r} is not one of {', '.join(MODES)}")
        if not self.loaded():
            raise XdpError(f"no XDP program loaded for {self.where()} (call load() first)")
        fd = bpf.obj_get(os.path.join(self.pin_dir, "prog"))
        try:
            new_id = bpf.prog_info(fd)[0]
            return self._in_ns(self._attach, ifname, mode, fd, new_id)
        finally:
            os.close(fd)

    def _ifindex(self, ifname: str) -> int:
        try:
            return socket.if_nametoindex(ifname)
        except OSError:
            raise XdpError(f"{self.where(ifname)}: no such interface") from None

    def _current(self, ifindex: int) -> tuple[int, str, str]:
        """(prog id, mode, name) of what is attached; (0, '', '') when nothing."""
        q = bpf.XdpQueryOpts(sz=ctypes.sizeof(bpf.XdpQueryOpts))
        check(bpf.lib().bpf_xdp_query(ifindex, 0, ctypes.byref(q)), "bpf_xdp_query")
        if q.attach_mode == bpf.ATTACHED_NONE:
            return 0, "", ""
        if q.attach_mode == bpf.ATTACHED_MULTI:
            pid, mode = (q.drv_prog_id, "native") if q.drv_prog_id else (q.skb_prog_id, "generic")
            if q.hw_prog_id or (q.drv_prog_id and q.skb_prog_id):
                return pid, "multi", "(several XDP programs)"
        else:
            pid, mode = q.prog_id, _ATTACHED_MODE.get(q.attach_mode, "?")
        return pid, mode, bpf.prog_info_by_id(pid)[1]

    def _foreign(self, ifname: str, pid: int, name: str) -> XdpError:
        return XdpError(
            f"{self.where(ifname)} already runs XDP program id {pid} named {name!r}, which is not "
            f"netlimit's ({PROG_NAME}); netlimit never replaces or detaches a foreign XDP program — "
            f"remove it yourself (ip link set dev {ifname} xdp off) or drop {ifname} from xdp.interfaces",
            16,
        )

    def _attach(self, ifname: str, mode: str, fd: int, new_id: int) -> Attachment:
        lib = bpf.lib()
        idx = self._ifindex(ifname)
        cur_id, cur_mode, cur_name = self._current(idx)
        if cur_id and cur_name != PROG_NAME:
            raise self._foreign(ifname, cur_id, cur_name)
        if cur_id:
            if cur_id == new_id and (mode == "auto" or mode == cur_mode):
                return Attachment(self.netns, ifname, idx, cur_id, cur_mode)
            if mode in ("auto", cur_mode):
                old_fd = check(lib.bpf_prog_get_fd_by_id(cur_id), f"bpf_prog_get_fd_by_id({cur_id})")
                try:
                    opts = bpf.XdpAttachOpts(sz=ctypes.sizeof(bpf.XdpAttachOpts), old_prog_fd=old_fd)
                    flags = bpf.XDP_FLAGS_REPLACE | _MODE_FLAG[cur_mode]
                    check(
                        lib.bpf_xdp_attach(idx, fd, flags, ctypes.byref(opts)), f"replacing XDP on {self.where(ifname)}"
                    )
                finally:
                    os.close(old_fd)
                return Attachment(self.netns, ifname, idx, new_id, cur_mode, replaced=True)
            # another mode was asked for: a mode cannot be swapped atomically
            self._detach_ours(idx, ifname)
        tries = ["native", "generic"] if mode == "auto" else [mode]
        errors = []
        for m in tries:
            flags = bpf.XDP_FLAGS_UPDATE_IF_NOEXIST | _MODE_FLAG[m]
            rc = lib.bpf_xdp_attach(idx, fd, flags, None)
            if rc == 0:
                return Attachment(self.netns, ifname, idx, new_id, m, replaced=bool(cur_id))
            errors.append(f"{m}: {os.strerror(-rc)}")
            if -rc == 16:  # EBUSY: someone attached between our query and now
                pid, _m, name = self._current(idx)
                if pid and name != PROG_NAME:
                    raise self._foreign(ifname, pid, name)
        raise XdpError(f"attaching XDP to {self.where(ifname)} failed ({'; '.join(errors)})")

    def _detach_ours(self, idx: int, ifname: str) -> bool:
        pid, mode, name = self._current(idx)
        if not pid:
            return False
        if name != PROG_NAME:
            return False
        lib = bpf.lib()
        old_fd = check(lib.bpf_prog_get_fd_by_id(pid), f"bpf_prog_get_fd_by_id({pid})")
        try:
            opts = bpf.XdpAttachOpts(sz=ctypes.sizeof(bpf.XdpAttachOpts), old_prog_fd=old_fd)
            # REPLACE with the expected program: detaches only if it is still ours
            flags = bpf.XDP_FLAGS_REPLACE | _MODE_FLAG.get(mode, 0)
            check(lib.bpf_xdp_detach(idx, flags, ctypes.byref(opts)), f"detaching XDP from {self.where(ifname)}")
        finally:
            os.close(old_fd)
        return True

    def detach(self, ifname: str) -> bool:
        """Detach netlimit's program from `ifname`; False when none of ours was there
        (a foreign program is left in place)."""
        return self._in_ns(lambda: self._detach_ours(self._ifindex(ifname), ifname))

    def attachments(self) -> list[Attachment]:
        """netlimit's attachments in this namespace (any netlimit program, by name)."""

        def scan() -> list[Attachment]:
            out = []
            for idx, name in socket.if_nameindex():
                pid, mode, pname = self._current(idx)
                if pid and pname == PROG_NAME:
                    out.append(Attachment(self.netns, name, idx, pid, mode))
            return out

        return self._in_ns(scan)

    def foreign(self) -> list[tuple[str, int, str]]:
        """(interface, prog id, name) of XDP programs in this namespace that are not ours."""

        def scan() -> list[tuple[str, int, str]]:
            out = []
            for idx, name in socket.if_nameindex():
                pid, _mode, pname = self._current(idx)
                if pid and pname != PROG_NAME:
                    out.append((name, pid, pname))
            return out

        return self._in_ns(scan)

    def sync(self, interfaces: Sequence[str], mode: str = "auto") -> list[Attachment]:
        """Load the program (maps kept), attach/replace it on `interfaces`, detach ours
        from every other interface of the namespace. Foreign programs: XdpError before
        anything is changed."""
        foreign = [f for f in self.foreign() if f[0] in interfaces]
        if foreign:
            ifname, pid, name = foreign[0]
            raise self._in_ns(lambda: self._foreign(ifname, pid, name))
        self.load()
        out = [self.attach(i, mode) for i in interfaces]
        for a in self.attachments():
            if a.ifname not in interfaces:
                self.detach(a.ifname)
        return out

    def flush(self) -> list[str]:
        """Detach netlimit's program everywhere in the namespace and unpin everything
        (maps and buckets gone). Returns the interfaces it was detached from."""
        gone = self.netns is not None and not os.path.exists(netns_path(self.netns))
        # a deleted namespace took its interfaces (and their attachments) with it: unpin only
        detached = [] if gone else [a.ifname for a in self.attachments() if self.detach(a.ifname)]
        self.close()
        self._unpin(self.pin_dir, self.pin_root)
        return detached

    @staticmethod
    def _unpin(pin_dir: str, pin_root: str) -> None:
        if os.path.isdir(pin_dir):
            for name in os.listdir(pin_dir):
                os.unlink(os.path.join(pin_dir, name))
            os.rmdir(pin_dir)
        try:
            os.rmdir(pin_root)  # the last namespace's flush leaves no netlimit directory
        except OSError:
            pass

    # -- maps ----------------------------------------------------------------------
    def map(self, name: str) -> BpfMap:
        if name not in self._maps:
            if name not in MAP_SHAPES:
                raise XdpError(f"no map {name!r} in the XDP program")
            path = os.path.join(self.pin_dir, name)
            if not os.path.exists(path):
                raise XdpError(f"{path} is not pinned: the XDP path of {self.where()} is not loaded")
            ks, vs, percpu = MAP_SHAPES[name]
            self._maps[name] = BpfMap(name, bpf.obj_get(path), ks, vs, percpu)
        return self._maps[name]

    def _kind(self, kind: str) -> tuple[BpfMap, BpfMap]:
        if kind not in KINDS:
            raise XdpError(f"prefix list {kind!r} is not one of {', '.join(KINDS)}")
        return self.map(f"{kind}4"), self.map(f"{kind}6")

    def add_prefixes(self, kind: str, prefixes: Iterable[str | Network], expires: float = 0) -> int:
        """Add prefixes to exempt/bans/deny (value: expiry in unix seconds, 0 none; the
        daemon removes expired bans). Batched. Returns how many were written."""
        m4, m6 = self._kind(kind)
        k4, k6 = split_keys(prefixes)
        val = VALUE.pack(int(expires))
        m4.update_many([(k, val) for k in k4])
        m6.update_many([(k, val) for k in k6])
        return len(k4) + len(k6)

    def add_bans(self, bans: Mapping[str, float] | Iterable[str], expires: float = 0) -> int:
        """Bans: an iterable of prefixes (one expiry for all) or {prefix: expiry}."""
        if isinstance(bans, Mapping):
            m4, m6 = self._kind("bans")
            items: dict[int, list[tuple[bytes, bytes]]] = {4: [], 6: []}
            for p, exp in bans.items():
                fam, key = prefix_key(p)
                items[fam].append((key, VALUE.pack(int(exp or 0))))
            m4.update_many(items[4])
            m6.update_many(items[6])
            return len(items[4]) + len(items[6])
        return self.add_prefixes("bans", bans, expires)

    def remove_prefixes(self, kind: str, prefixes: Iterable[str | Network]) -> int:
        m4, m6 = self._kind(kind)
        k4, k6 = split_keys(prefixes)
        return m4.delete_many(k4) + m6.delete_many(k6)

    def prefixes(self, kind: str) -> dict[Network, int]:
        """{prefix: expiry} of exempt/bans/deny."""
        out: dict[Network, int] = {}
        for m in self._kind(kind):
            for k in list(m.iter_keys()):
                v = m.lookup(k)
                if v is not None:
                    out[lpm_key_decode(k)] = VALUE.unpack(v)[0]
        return out

    def expire_bans(self, now: float | None = None) -> list[Network]:
        """Remove bans whose expiry (unix seconds, non-zero) is at or before `now`: the
        program does not look at expiry, the daemon calls this. Returns what it removed."""
        now = time.time() if now is None else now
        gone: list[Network] = []
        for m in self._kind("bans"):
            expired = []
            for k in list(m.iter_keys()):
                v = m.lookup(k)
                if v is not None and 0 < VALUE.unpack(v)[0] <= now:
                    expired.append(k)
            m.delete_many(expired)
            gone.extend(lpm_key_decode(k) for k in expired)
        return gone

    def status(self) -> dict:
        """What list/status/plan need: loaded program, attachments, map sizes, counters."""
        if not self.loaded():
            return {"netns": self.netns, "loaded": False, "attachments": [], "foreign": self.foreign()}
        return {
            "netns": self.netns,
            "loaded": True,
            "prog_id": self.prog_id(),
            "pin_dir": self.pin_dir,
            "attachments": [a.__dict__ for a in self.attachments()],
            "foreign": self.foreign(),
            "entries": {
                n: sum(1 for _ in self.map(n).iter_keys())
                for n in ("exempt4", "exempt6", "bans4", "bans6", "deny4", "deny6")
            },
            "rules": len(self.rules()),
            "counters": self.counters().__dict__,
        }

    def set_prefixes(self, kind: str, prefixes: Iterable[str | Network], expires: float = 0) -> tuple[int, int]:
        """Make exempt/bans/deny exactly `prefixes`: (added or rewritten, removed)."""
        k4, k6 = split_keys(prefixes)
        m4, m6 = self._kind(kind)
        removed = 0
        for m, want in ((m4, k4), (m6, k6)):
            keep = set(want)
            removed += m.delete_many([k for k in list(m.iter_keys()) if k not in keep])
        val = VALUE.pack(int(expires))
        m4.update_many([(k, val) for k in k4])
        m6.update_many([(k, val) for k in k6])
        return len(k4) + len(k6), removed

    def set_rules(self, rules: Sequence[XdpRule]) -> None:
        """Write the rule table (all MAX_RULES slots, one batch). A slot whose rule
        changed loses its buckets (they start full); unchanged slots keep theirs."""
        slots = encode_rules(rules)
        m = self.map("rules")
        old = [m.lookup(struct.pack("<I", i)) for i in range(MAX_RULES)]
        m.update_many([(struct.pack("<I", i), s) for i, s in enumerate(slots)])
        changed = {i for i, s in enumerate(slots) if old[i] != s}
        if changed:
            b = self.map("buckets")
            b.delete_many([k for k in list(b.iter_keys()) if BUCKET_KEY.unpack(k)[0] in changed])

    def rules(self) -> list[dict]:
        m = self.map("rules")
        out = []
        for i in range(MAX_RULES):
            raw = m.lookup(struct.pack("<I", i))
            if raw is None or RULE.unpack(raw)[0] == 0:
                break
            out.append(decode_rule(raw))
        return out

    def counters(self) -> Counters:
        m = self.map("counters")

        def at(i: int) -> tuple[int, int]:
            p, d = m.percpu_sum(struct.pack("<I", i), COUNTER)
            return p, d

        n = len(self.rules())
        return Counters(
            rules=[at(i) for i in range(n)],
            banned=at(STAT_BANNED)[1],
            denied=at(STAT_DENIED)[1],
            exempt=at(STAT_EXEMPT)[0],
            passed=at(STAT_PASSED)[0],
        )

    def reset_buckets(self) -> int:
        """Forget every per-source bucket (they start full again)."""
        b = self.map("buckets")
        return b.delete_many(list(b.iter_keys()))

    def bucket_count(self) -> int:
        return sum(1 for _ in self.map("buckets").iter_keys())

    # -- measurement ---------------------------------------------------------------
    def test_run(self, packet: bytes, repeat: int = 100_000) -> tuple[int, float]:
        """BPF_PROG_TEST_RUN of the pinned program on one frame: (XDP action, ns per run)."""
        fd = bpf.obj_get(os.path.join(self.pin_dir, "prog"))
        try:
            buf = ctypes.create_string_buffer(packet, len(packet))
            out = ctypes.create_string_buffer(len(packet) + 256)
            opts = bpf.TestRunOpts(
                sz=ctypes.sizeof(bpf.TestRunOpts),
                data_in=ctypes.cast(buf, ctypes.c_void_p),
                data_size_in=len(packet),
                data_out=ctypes.cast(out, ctypes.c_void_p),
                data_size_out=len(out),
                repeat=repeat,
            )
            check(bpf.lib().bpf_prog_test_run_opts(fd, ctypes.byref(opts)), "BPF_PROG_TEST_RUN")
            return opts.retval, float(opts.duration)
        finally:
            os.close(fd)


def prune_stale(root: str = PIN_ROOT) -> list[str]:
    """Unpin the directories of namespaces that no longer exist (their interfaces and
    attachments went with them; the pinned maps would stay forever). Returns the
    namespaces pruned. The daemon calls this where it prunes its state files."""
    pruned: list[str] = []
    if not os.path.isdir(root):
        return pruned
    for entry in sorted(os.listdir(root)):
        if not entry.startswith("ns-"):
            continue
        name = entry[3:]
        try:
            exists = os.path.exists(netns_path(name))
        except NetnsError:
            continue
        if not exists:
            XdpPath._unpin(os.path.join(root, entry), root)
            pruned.append(name)
    return pruned


def leftovers(root: str = PIN_ROOT) -> list[str]:
    """Everything pinned under /sys/fs/bpf/netlimit (the before-stop leftover check)."""
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        out.extend(os.path.join(dirpath, f) for f in files)
    return sorted(out)


def wait_for(cond, timeout: float = 5.0, step: float = 0.02) -> bool:
    """Poll cond() until true or timeout (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())
