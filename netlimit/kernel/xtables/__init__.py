"""The legacy x_tables family: iptables / ip6tables (and ipset for the ban sets).

plan.py (the iptables planner both backends share), backend.py (the family loop,
rollback, `list` rows), restore.py (iptables-legacy-save/-restore: "restore") and
libiptc.py (python-iptables: "python-iptables"), ipset.py (the ban sets), present.py
(plan sections, hot entries from /proc, the host note). Imports no other family.
"""
