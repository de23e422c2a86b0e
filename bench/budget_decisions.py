"""Decisions for bench/budget_instructions.sh: N calls of Limiter.check_fast (as /v1/check makes them):
one key, or a new X-Api-Key each call beside the client address (argv: one|new|none N)."""

import sys
import textwrap

from netlimit.config.validate import load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.rules import from_loaded

CONFIG = textwrap.dedent("""\
    version: 1
    http:
      domain: bench
      max_keys: 2000
      descriptors:
        - key: remote_address
          rate_limit: {unit: second, requests_per_unit: 100000000}
        - key: "header:X-Api-Key"
          rate_limit: {unit: minute, requests_per_unit: 1000}
    """)
case = sys.argv[1]
lim = Limiter(from_loaded(load_string(CONFIG, "b.yaml")))
N = int(sys.argv[2])
if case == "one":
    descs = [[[("remote_address", "10.0.0.1")]]] * N
elif case == "new":
    descs = [[[("remote_address", "10.0.0.1")], [("header:X-Api-Key", f"k{i}")]] for i in range(N)]
else:
    descs = []
cf = lim.check_fast
for d in descs:
    cf(d)
