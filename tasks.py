"""Invoke entry point: `invoke --list` from a checkout shows gpuprov's tasks.

Invoke imports this file before it reads invoke.yaml beside it: the project's config file and the
INVOKE_GPUPROV_* variables are checked here, so that a bad one is exit 2 with its place, not a traceback.
"""

import sys
from pathlib import Path

from gpuprov.program import check_project
from gpuprov.tasks import namespace

check_project(Path(__file__).parent, sys.argv)
ns = namespace()
