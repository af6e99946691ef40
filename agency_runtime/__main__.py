"""``python -m agency_runtime ...``: the ``agency`` command line."""

from agency_runtime.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
