"""Container engine: `container_engine: docker` installs and starts Docker where facts show none. The engine op's
own cases (install, enable, nothing without the variable, bad input) are data: tests/unit/operations/engine/*.json."""

from __future__ import annotations

from helpers.ops import bare_facts, ctx_for, make_stack

from gpuprov.provision.ops import COMPONENTS, plan_changes

DOCKER = {"container_engine": "docker"}
APT = ("DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef "
       "-o Dpkg::Options::=--force-confold")


def test_engine_comes_before_the_container_toolkit_and_shares_the_index_refresh():
    assert COMPONENTS.index("engine") == COMPONENTS.index("container_toolkit") - 1
    changes = plan_changes(ctx_for(bare_facts(), make_stack(), host_vars=DOCKER))
    order = [c.component for c in changes]
    assert order.index("engine") < order.index("container_toolkit")
    refresh = f"{APT} -q update"
    assert sum(command == refresh for c in changes for command in c.commands) == 1
    [docker] = [c for c in changes if c.component == "engine"]
    assert docker.commands == (f"{APT} -y -q install --no-install-recommends docker.io",
                               "systemctl enable --now docker")
