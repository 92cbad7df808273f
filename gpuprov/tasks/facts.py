"""`invoke facts`: what each host has, gathered in one SSH command per host."""

from __future__ import annotations

from invoke.exceptions import Exit

from gpuprov.tasks._common import gather_outcomes, host_task, select_hosts


@host_task(help={"json": "print the facts as JSON"})
def facts(c, host=None, group=None, all=False, inventory=None, json_=False, trust_new_hosts=False,
          parallel=None):
    """Gather facts from hosts: OS, kernel, GPUs, driver, packages, holds, services, Docker."""
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import facts_table

    inv, hosts = select_hosts(c, host, group, all, inventory)
    outcomes = gather_outcomes(c, inv, hosts, trust_new_hosts=trust_new_hosts, parallel=parallel, quiet=json_)
    if json_:
        print(dump_json({o.host.name: o.value if o.ok else {"error": str(o.error)} for o in outcomes},
                        sort_keys=True))
    else:
        facts_table(outcomes)
    if any(not o.ok for o in outcomes):
        raise Exit(code=1)
