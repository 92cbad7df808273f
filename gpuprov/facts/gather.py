"""Gather facts from hosts: the providers a job asks for, composed into one script, run over the host's one
connection (one SSH command), parsed here. See gpuprov.facts.providers for the model, gpuprov.facts.base for the
facts themselves and gpuprov.facts.schema for their types."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from gpuprov.core.connection import HostConnection
from gpuprov.core.errors import GpuprovError
from gpuprov.facts.base import REGISTRY
from gpuprov.facts.providers import FactArgs
from gpuprov.facts.schema import HostFacts

DEFAULT: tuple[str, ...] = REGISTRY.default


def facts_script(managed_files: tuple[str, ...] = (), facts: Iterable[str] = DEFAULT) -> str:
    """The one POSIX sh script that gathers `facts` (and the managed files' contents) on a host."""
    return REGISTRY.script(facts, FactArgs(files=tuple(managed_files)))


def facts_command(managed_files: tuple[str, ...] = (), facts: Iterable[str] = DEFAULT) -> str:
    """The one command that gathers `facts`: `sh -c SCRIPT gpuprov-facts`, quoted (every value in the script is
    quoted too); apply runs it at the end of a batch, whose stdin is the batch itself."""
    return f"sh -c {shlex.quote(facts_script(managed_files, facts))} gpuprov-facts"


def gather(conn: HostConnection, managed_files: tuple[str, ...] = (), facts: Iterable[str] = DEFAULT) -> HostFacts:
    """The connected host's `facts` (default: all of them) in one SSH command, as root (managed files may be
    readable by root only). The script travels on stdin."""
    result = conn.run("sh -s", sudo=True, stdin=facts_script(managed_files, facts), timeout=120)
    return parse_gathered(conn, result.stdout, result.stderr)


def parse_facts(host: str, output: str) -> HostFacts:
    """The facts document in a facts script's output (it names the facts it gathered)."""
    return {"host": host, **REGISTRY.parse(output)}


def parse_gathered(conn: HostConnection, output: str, stderr: str) -> HostFacts:
    """Parse the facts script's output; a cut-off run is an error naming the host."""
    facts = parse_facts(conn.host.name, output)
    if not facts["complete"]:
        raise GpuprovError("the facts script did not finish", host=conn.host.name, step="facts",
                           command="sh -s <gpuprov facts script>", output=stderr or output,
                           hint="check that /bin/sh works for this user on the host")
    return facts
