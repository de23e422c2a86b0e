"""Shaping: tc through pyroute2 (shaping.py), whatever the packet-filter backend.
Imports no packet-filter family."""
