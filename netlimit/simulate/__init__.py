"""Replaying access logs through a rules file: ``netlimit simulate`` and ``netlimit suggest``.

``logs.py`` reads access logs (nginx/Apache combined and common, JSON lines,
Envoy's default format; ``.gz`` and stdin) into requests with their logged
time; ``replay.py`` runs them through the engine the sidecar runs (the same
actions, descriptor tree, algorithms and memory store, with the log's time as
the clock) and gathers the figures per rule, including what each of the five
algorithms would have done with the same limit; ``report.py`` shows them (a
terminal table, JSON, an HTML page with plots); ``suggest.py`` proposes limits
from the same figures.  It imports the engine and the config loader, never a
door.
"""
