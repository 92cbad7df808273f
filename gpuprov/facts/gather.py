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
    """Facts of the connected host (one SSH command, as root: managed files may be readable by root only).
    The script travels on stdin; the command line holds only the managed files' paths."""
    args = " ".join(shlex.quote(path) for path in managed_files)
    result = conn.run(f"sh -s -- {args}".rstrip(), sudo=True, stdin=facts_script(), timeout=120)
    return parse_gathered(conn, result.stdout, result.stderr)


def parse_gathered(conn: HostConnection, output: str, stderr: str) -> dict:
    """Parse the facts script's output; a cut-off run is an error naming the host."""
    facts = parse_facts(conn.host.name, output)
    if not facts["complete"]:
        raise GpuprovError("the facts script did not finish", host=conn.host.name, step="facts",
                           command="sh -s <gpuprov facts script>", output=stderr or output,
                           hint="check that /bin/sh works for this user on the host")
    return facts
