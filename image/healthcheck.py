"""The image's HEALTHCHECK: GET /healthz on the admin listener answers 200."""

import os
import sys
import urllib.request

url = os.environ.get("NETLIMIT_HEALTH_URL") or f"http://{os.environ.get('NETLIMIT_ADMIN_LISTEN', '127.0.0.1:8182')}/healthz"
try:
    with urllib.request.urlopen(url, timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except OSError as exc:
    print(f"{url}: {exc}", file=sys.stderr)
    sys.exit(1)
