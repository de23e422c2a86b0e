"""`python -m netlimit.daemon`: netlimitd (daemon/main.py)."""

from .main import main

if __name__ == "__main__":
    main()
