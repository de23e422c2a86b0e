"""ctypes bindings to the few libbpf 1.x calls the XDP drop path needs.

Why libbpf through ctypes (docs/xdp.md has the figures): libbpf does the ELF/BTF
relocation, the pinned-map reuse across program replacement and the netlink XDP
attach with XDP_FLAGS_REPLACE — re-implementing that on the raw bpf syscall is
hundreds of lines; `ip`/`bpftool`/`xdp-loader` cost a fork+exec per call and
bpftool's map update is one element per process (100k bans: minutes). One shared
library (libbpf1, Debian 12: 1.1.2) and no compiler at run time.

Every call that returns a negative errno is turned into XdpError naming the call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

from ...errors import NetlimitError

# linux/if_link.h
XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
XDP_FLAGS_HW_MODE = 1 << 3
XDP_FLAGS_REPLACE = 1 << 4
# enum xdp_attach_mode (XDP_ATTACHED_*)
ATTACHED_NONE, ATTACHED_DRV, ATTACHED_SKB, ATTACHED_HW, ATTACHED_MULTI = range(5)
# map update flags
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2


class XdpError(NetlimitError, RuntimeError):
    """A libbpf/kernel refusal, or a state netlimit will not touch (foreign program)."""

    def __init__(self, message: str, errno: int = 0):
        super().__init__(message)
        self.errno = errno


class XdpAttachOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("old_prog_fd", ctypes.c_int)]


class XdpQueryOpts(ctypes.Structure):
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("prog_id", ctypes.c_uint32),
        ("drv_prog_id", ctypes.c_uint32),
        ("hw_prog_id", ctypes.c_uint32),
        ("skb_prog_id", ctypes.c_uint32),
        ("attach_mode", ctypes.c_uint8),
    ]


class TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.1)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


_lib: Any = None

_P = ctypes.c_void_p
_I = ctypes.c_int
_U32 = ctypes.c_uint32
_STR = ctypes.c_char_p
_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "bpf_object__open_file": (_P, [_STR, _P]),
    "bpf_object__load": (_I, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__find_map_by_name": (_P, [_P, _STR]),
    "bpf_object__find_program_by_name": (_P, [_P, _STR]),
    "bpf_map__set_pin_path": (_I, [_P, _STR]),
    "bpf_map__set_max_entries": (_I, [_P, _U32]),
    "bpf_map__fd": (_I, [_P]),
    "bpf_program__fd": (_I, [_P]),
    "bpf_obj_pin": (_I, [_I, _STR]),
    "bpf_obj_get": (_I, [_STR]),
    "bpf_prog_get_fd_by_id": (_I, [_U32]),
    "bpf_obj_get_info_by_fd": (_I, [_I, _P, ctypes.POINTER(_U32)]),
    "bpf_xdp_attach": (_I, [_I, _I, _U32, ctypes.POINTER(XdpAttachOpts)]),
    "bpf_xdp_detach": (_I, [_I, _U32, ctypes.POINTER(XdpAttachOpts)]),
    "bpf_xdp_query": (_I, [_I, _I, ctypes.POINTER(XdpQueryOpts)]),
    "bpf_map_update_elem": (_I, [_I, _P, _P, ctypes.c_uint64]),
    "bpf_map_lookup_elem": (_I, [_I, _P, _P]),
    "bpf_map_delete_elem": (_I, [_I, _P]),
    "bpf_map_get_next_key": (_I, [_I, _P, _P]),
    "bpf_map_update_batch": (_I, [_I, _P, _P, ctypes.POINTER(_U32), _P]),
    "bpf_map_delete_batch": (_I, [_I, _P, ctypes.POINTER(_U32), _P]),
    "bpf_prog_test_run_opts": (_I, [_I, ctypes.POINTER(TestRunOpts)]),
    "libbpf_num_possible_cpus": (_I, []),
    "libbpf_set_print": (_P, [_P]),
}


def lib() -> Any:
    """libbpf.so.1, loaded once; XdpError naming the package when it is missing."""
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            handle = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise XdpError(f"libbpf is not installed ({exc}); install it with 'apt-get install libbpf1'") from exc
        for fn, (res, args) in _SIGS.items():
            f = getattr(handle, fn)
            f.restype = res
            f.argtypes = args
        handle.libbpf_set_print(None)  # libbpf's own stderr chatter: our errors say it
        _lib = handle
    return _lib


def check(rc: int, what: str) -> int:
    """rc when >= 0, else XdpError with the errno (libbpf 1.x returns -errno)."""
    if rc < 0:
        err = -rc if rc != -1 else (ctypes.get_errno() or 1)
        raise XdpError(f"{what}: {os.strerror(err)} (errno {err})", err)
    return rc


def prog_info(fd: int) -> tuple[int, str]:
    """(id, name) of a BPF program by fd (struct bpf_prog_info: id at 4, name[16] at 64)."""
    buf = ctypes.create_string_buffer(256)
    size = _U32(len(buf))
    check(lib().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(size)), "bpf_obj_get_info_by_fd")
    raw = buf.raw
    return int.from_bytes(raw[4:8], "little"), raw[64:80].split(b"\0", 1)[0].decode(errors="replace")


def prog_info_by_id(prog_id: int) -> tuple[int, str]:
    fd = check(lib().bpf_prog_get_fd_by_id(prog_id), f"bpf_prog_get_fd_by_id({prog_id})")
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


def obj_get(path: str) -> int:
    return check(lib().bpf_obj_get(path.encode()), f"bpf_obj_get({path})")


def num_cpus() -> int:
    return check(lib().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")
