"""Container engine: `container_engine: docker` installs and starts Docker where facts show none."""

from __future__ import annotations

import shlex

import pytest
from helpers.ops import bare_facts, ctx_for, make_stack

from gpuprov.errors import InputError
from gpuprov.ops import COMPONENTS, engine, plan_changes

DOCKER = {"container_engine": "docker"}
APT = ("DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef "
       "-o Dpkg::Options::=--force-confold")


def plan(facts, host_vars=None):
    return list(engine.changes(ctx_for(facts, make_stack(facts["os"]["family"]), host_vars=host_vars or {})))


def with_docker(facts, *, active=True, enabled=True):
    facts["docker"] = {"version": "20.10.24", "active": active, "daemon_json": None, "runtimes": []}
    facts["packages"]["docker.io"] = "20.10.24+dfsg1-1+deb12u1+b6"
    facts["services"]["docker"] = {"exists": True, "enabled": enabled, "active": active}
    return facts


def test_bare_debian_host_installs_docker_io_and_starts_it():
    [change] = plan(bare_facts(), DOCKER)
    assert change.component == "engine"
    assert change.commands == (f"{APT} -q update", f"{APT} -y -q install --no-install-recommends docker.io",
                               "systemctl enable --now docker")
    assert "docker.io" in change.summary and not change.reboot


def test_rhel_installs_docker_ce_from_dockers_repository():
    [change] = plan(bare_facts("rhel"), DOCKER)
    assert shlex.split(change.commands[1]) == ["dnf", "-y", "--setopt=install_weak_deps=False", "install",
                                               "docker-ce"]
    assert change.commands[-1] == "systemctl enable --now docker"
    assert "docker-ce repository" in change.summary


def test_without_container_engine_nothing_is_planned():
    assert plan(bare_facts()) == []
    assert plan(bare_facts(), {"container_engine": None, "site": "dc1"}) == []


def test_running_docker_is_left_alone():
    assert plan(with_docker(bare_facts()), DOCKER) == []


def test_installed_package_without_dockerd_answering_is_not_installed_again():
    facts = bare_facts()
    facts["packages"]["docker-ce"] = "5:27.3.1-1~debian.12~bookworm"
    facts["services"]["docker"] = {"exists": True, "enabled": True, "active": True}
    assert plan(facts, DOCKER) == []


@pytest.mark.parametrize("active,enabled", [(False, True), (True, False), (False, False)])
def test_stopped_or_disabled_docker_is_enabled_and_started(active, enabled):
    [change] = plan(with_docker(bare_facts(), active=active, enabled=enabled), DOCKER)
    assert change.commands == ("systemctl enable --now docker",)


def test_unknown_engine_is_bad_input_naming_the_host_and_choices():
    with pytest.raises(InputError, match="unknown container_engine 'podman'") as info:
        plan(bare_facts(), {"container_engine": "podman"})
    assert info.value.host == "gpu01" and info.value.step == "engine" and "docker" in info.value.hint


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
