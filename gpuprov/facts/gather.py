"""Gather facts from hosts: the providers a job asks for, composed into one script, run over the host's one
connection (one SSH command), parsed here. See gpuprov.facts.providers for the model, gpuprov.facts.base for the
facts themselves and gpuprov.facts.schema for their types."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable

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


def affected(changes: Iterable) -> tuple[str, ...] | None:
    """The facts a batch of changes can alter (each change's `affects`; a step that marks a reboot alters the
    reboot marks), with the facts derived from them; None when one change may alter anything."""
    names: list[str] = []
    for change in changes:
        if change.affects is None:
            return None
        names += change.affects
        if change.reboot:
            names += ["gpuprov_reboot_pending", "reboot_required"]
    return tuple(REGISTRY.with_dependents(names))


def regather(known: HostFacts, names: tuple[str, ...], managed_files: tuple[str, ...] = ()) -> tuple[str, Callable]:
    """(command, parse) that gathers `names` again and carries the rest of `known` over: after a batch that can
    alter only those facts (`affected`), a full gather would read the same values at several times the cost."""

    def parse(conn: HostConnection, output: str, stderr: str) -> HostFacts:
        fresh = parse_gathered(conn, output, stderr)
        kept = [notice for notice in known.get("notices", []) if notice.split(":", 1)[0] not in names]
        return {**known, **fresh, "notices": kept + fresh.get("notices", [])}

    return facts_command(managed_files, names), parse


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
