"""`python -m netlimit.daemon`: netlimitd (daemon/main.py)."""

from .main import main

main()
