"""What the running kernel can honour, read without root (with safe fallbacks).

Kept in one place so the validator, the compiler and the tests agree.
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# xt_hashlimit: names are IFNAMSIZ (16) bytes with the NUL, i.e. 15 characters.
HASHLIMIT_NAME_MAX = 15
# iptables' libxt_hashlimit (revision >= 2) scales rates by 10^6: the fastest
# rate is 1,000,000/s; the kernel rejects an interval (avg) above U32_MAX us,
# i.e. slower than one packet per 4294 s.
HASHLIMIT_MAX_PER_SECOND = 1_000_000
HASHLIMIT_MAX_INTERVAL_S = (2**32 - 1) / 1_000_000
HASHLIMIT_BURST_MAX = 1_000_000
# xt_recent: with ip_pkt_list_tot == 0 (kernels >= 4.10 default) the hit count
# may go up to XT_RECENT_MAX_NSTAMPS - 1 (255 before 6.11; we assume the lower).
RECENT_MAX_NSTAMPS_DEFAULT = 255
RECENT_FALLBACK = 20  # classic default of ip_pkt_list_tot when /sys says nothing
ETH_FRAME = 1514  # one full-size Ethernet frame (1500 MTU + 14 header)


@dataclass(frozen=True)
class KernelLimits:
    recent_max_hitcount: int
    recent_source: str
    hz: int
    hz_source: str


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _kernel_hz() -> tuple[int, str]:
    cfg_paths = [f"/boot/config-{os.uname().release}"]
    for p in cfg_paths:
        try:
            m = re.search(r"^CONFIG_HZ=(\d+)$", Path(p).read_text(), re.M)
            if m:
                return int(m.group(1)), p
        except OSError:
            pass
    try:
        with gzip.open("/proc/config.gz", "rt") as fh:
            m = re.search(r"^CONFIG_HZ=(\d+)$", fh.read(), re.M)
            if m:
                return int(m.group(1)), "/proc/config.gz"
    except OSError:
        pass
    return 100, "assumed (lowest common HZ; no kernel config readable)"


@lru_cache(maxsize=1)
def host_limits() -> KernelLimits:
    path = "/sys/module/xt_recent/parameters/ip_pkt_list_tot"
    tot = _read_int(path)
    if tot is None:
        recent, source = RECENT_FALLBACK, "default (xt_recent parameters not readable)"
    elif tot == 0:
        recent, source = RECENT_MAX_NSTAMPS_DEFAULT, f"{path} = 0 (per-rule, kernel maximum 255)"
    else:
        recent, source = tot, path
    hz, hz_source = _kernel_hz()
    return KernelLimits(recent, source, hz, hz_source)


def default_tc_burst(rate_bits: int, hz: int) -> int:
    """A safe TBF/HTB burst: what the rate sends in 2 timer ticks, at least 4 frames, in whole KiB."""
    per_tick = rate_bits / 8 / hz
    burst = max(2 * per_tick, 4 * ETH_FRAME)
    return int(-(-burst // 1024) * 1024)


def min_tc_burst(rate_bits: int, hz: int) -> int:
    """The smallest burst tc can honour: one MTU-sized frame and one tick's worth of bytes."""
    return int(max(ETH_FRAME, -(-rate_bits // (8 * hz))))
