"""`python -m sparktop` runs the same entry point as the `sparktop` script."""

from sparktop.cli import main

raise SystemExit(main())
