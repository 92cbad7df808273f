"""Invoke entry point: `invoke --list` from a checkout shows gpuprov's tasks."""

from gpuprov.tasks import namespace

ns = namespace()
