"""Container toolkit: exact packages; Docker runtime merged (never overwritten) with a backup; CDI; /dev/char."""

from __future__ import annotations

import json
import shlex

import pytest
from test_ops_base import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.errors import GpuprovError
from gpuprov.ops import container_toolkit as ctk


def plan(facts, stack=None):
    return list(ctk.changes(ctx_for(facts, stack or make_stack(facts["os"]["family"]))))


def in_state():
    return provisioned_facts("debian", make_stack(), make_repo())


def with_docker(facts, daemon_json):
    facts["docker"] = {"version": "26.1.5", "active": True, "daemon_json": None, "runtimes": []}
    facts["files"][ctk.DAEMON_JSON] = daemon_json
    return facts


def test_bare_host_without_docker_installs_packages_and_the_udev_rule_only():
    changes = plan(bare_facts())
    assert shlex.split(changes[0].commands[-1])[-4:] == [
        "nvidia-container-toolkit=1.17.8-1", "nvidia-container-toolkit-base=1.17.8-1",
        "libnvidia-container-tools=1.17.8-1", "libnvidia-container1=1.17.8-1"]
    assert [c.summary.split(" ")[0] for c in changes] == ["install", "create", "generate"]
    assert "create-dev-char-symlinks --create-all" in changes[1].diff
    assert not any("runtime configure" in cmd for c in changes for cmd in c.commands)
    # the driver is installed in the same plan: the spec is made at once only if the new driver answers
    assert changes[2].commands == ("if nvidia-smi -L >/dev/null 2>&1; then nvidia-ctk system "
                                   "create-dev-char-symlinks --create-all && mkdir -p /etc/cdi && nvidia-ctk cdi "
                                   "generate --output=/etc/cdi/nvidia.yaml; fi",)


def test_docker_runtime_is_merged_with_a_backup_and_docker_restarted():
    existing = '{"log-driver": "json-file", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}\n'
    [change] = plan(with_docker(in_state(), existing))
    assert change.commands == (
        "if [ -e /etc/docker/daemon.json ] && [ ! -e /etc/docker/daemon.json.gpuprov-bak ]; then "
        "cp -a /etc/docker/daemon.json /etc/docker/daemon.json.gpuprov-bak; fi",
        "nvidia-ctk runtime configure --runtime=docker",
        "systemctl try-restart docker")
    new = "".join(line[1:] for line in change.diff.splitlines(keepends=True)[2:] if line[0] in " +")
    merged = json.loads(new)
    assert merged["log-driver"] == "json-file" and merged["runtimes"]["runsc"] == {"path": "/usr/bin/runsc"}
    assert merged["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}


def test_docker_without_daemon_json_is_configured_and_the_diff_shows_the_new_file():
    [change] = plan(with_docker(in_state(), None))
    assert change.diff.startswith("--- /dev/null")
    assert "nvidia-ctk runtime configure --runtime=docker" in change.commands


def test_docker_already_configured_changes_nothing():
    assert plan(with_docker(in_state(), json.dumps({"runtimes": {"nvidia": ctk.NVIDIA_RUNTIME}}))) == []


def test_broken_daemon_json_is_left_alone_with_a_clear_error():
    with pytest.raises(GpuprovError, match="not valid JSON") as info:
        plan(with_docker(in_state(), "{not json"))
    assert info.value.step == "container_toolkit" and "by hand" in info.value.hint


def test_cdi_spec_is_generated_when_missing_or_stale_once_the_driver_is_loaded():
    facts = in_state()
    facts["files"][ctk.CDI_SPEC] = None
    [change] = plan(facts)
    assert change.commands == ("nvidia-ctk system create-dev-char-symlinks --create-all && mkdir -p /etc/cdi && "
                               "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",)
    facts["files"][ctk.CDI_SPEC] = "hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.133.20\n"
    assert len(plan(facts)) == 1


def test_cdi_waits_for_the_reboot_while_a_driver_change_is_pending():
    facts = in_state()
    facts["files"][ctk.CDI_SPEC] = None
    facts["loaded_driver_version"] = "565.57.01"
    assert plan(facts) == []


def test_in_state_container_toolkit_changes_nothing():
    assert plan(in_state()) == []
