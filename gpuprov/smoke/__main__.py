"""`python -m smoke --config FILE [--only a,b] [--level quick|burn-in] [--strict]`: see runner.py."""

from .runner import main

raise SystemExit(main())
