"""`invoke facts`: what each host has, gathered in one SSH command per host."""

from __future__ import annotations

import json

from invoke import task
from invoke.exceptions import Exit

from gpuprov.tasks._common import HOST_HELP, exits_cleanly, run_settings, select_hosts


@task(iterable=["host", "group"], help={**HOST_HELP, "json": "print the facts as JSON",
                                        "trust_new_hosts": "record unknown host keys (trust on first use)",
                                        "parallel": "hosts gathered at once"})
@exits_cleanly
def facts(c, host=None, group=None, all=False, inventory=None, json_=False, trust_new_hosts=False,
          parallel=None):
    """Gather facts from hosts: OS, kernel, GPUs, driver, packages, holds, services, Docker."""
    from gpuprov.executor import run_on_hosts
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.report import facts_table, progress_printer

    inv, hosts = select_hosts(c, host, group, all, inventory)
    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel)
    outcomes = run_on_hosts(hosts, lambda conn: gather(conn, MANAGED_FILES), settings,
                            jump_of=inv.jump_host, on_event=progress_printer(quiet=json_))
    if json_:
        print(json.dumps({o.host.name: o.value if o.ok else {"error": str(o.error)} for o in outcomes},
                         indent=2, sort_keys=True))
    else:
        facts_table(outcomes)
    if any(not o.ok for o in outcomes):
        raise Exit(code=1)
