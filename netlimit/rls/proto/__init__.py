"""Envoy's rate limit service protocol (rls.proto and the messages it uses),
as generated Python modules.  See regen.py."""
