"""Gather facts from hosts: the facts script over each host's one connection, parsed here."""

from __future__ import annotations

import shlex
from functools import cache
from importlib import resources

from gpuprov.connection import HostConnection
from gpuprov.errors import GpuprovError
from gpuprov.facts.parsers import parse_facts


@cache
def facts_script() -> str:
    return resources.files("gpuprov.facts").joinpath("script.sh").read_text()


def facts_command(managed_files: tuple[str, ...] = ()) -> str:
    """The one command that gathers every fact: `sh -c SCRIPT gpuprov-facts FILE...`, all quoted."""
    args = " ".join(shlex.quote(path) for path in managed_files)
    return f"sh -c {shlex.quote(facts_script())} gpuprov-facts {args}".rstrip()


def gather(conn: HostConnection, managed_files: tuple[str, ...] = ()) -> dict:
    """Facts of the connected host (one SSH command)."""
    command = facts_command(managed_files)
    result = conn.run(command, timeout=120)
    facts = parse_facts(conn.host.name, result.stdout)
    if not facts["complete"]:
        raise GpuprovError("the facts script did not finish", host=conn.host.name, step="facts",
                           command="sh -c <gpuprov facts script>", output=result.stderr or result.stdout,
                           hint="check that /bin/sh works for this user on the host")
    return facts
