"""The `gpuprov` console script: the same task collection as `invoke` in a checkout."""

from __future__ import annotations

import os

from invoke import Program

from gpuprov import __version__
from gpuprov.tasks import namespace


class GpuprovProgram(Program):
    """Reads `invoke.yaml` from the working directory, as `invoke` does beside tasks.py."""

    def update_config(self, merge: bool = True) -> None:
        self.config.set_project_location(os.getcwd())
        self.config.load_project(merge=False)
        super().update_config(merge)


def main() -> None:
    GpuprovProgram(namespace=namespace(), version=__version__, name="gpuprov", binary="gpuprov").run()
