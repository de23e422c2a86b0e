"""The nftables family: one table `inet netlimit`.

compile.py (config -> the table's chains, sets and rules), backend.py (plan and write
with `nft -f`, rollback records; the FilterBackend registry.py names "nftables"),
netlink.py (the netlink read of the table), elements.py (set elements over netlink),
bansets.py (the ban list's elements), present.py (plan sections, hot entries, warnings).
Imports no other family.
"""
