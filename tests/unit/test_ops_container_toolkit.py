"""Container toolkit: exact packages; Docker runtime merged (never overwritten) with a backup; CDI; /dev/char."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.core.errors import GpuprovError
from gpuprov.provision.ops import container_toolkit as ctk


def plan(facts, stack=None):
    return list(ctk.changes(ctx_for(facts, stack or make_stack(facts["os"]["family"]))))


def in_state():
    return provisioned_facts("debian", make_stack(), make_repo())


def with_docker(facts, daemon_json, *, written=None, live=("runc",), active=True):
    """Docker as facts show it: daemon.json, what nvidia-ctk wrote into a temporary copy, the running daemon's
    runtimes (`docker info --format '{{json .Runtimes}}'`)."""
    facts["docker"] = {"version": "26.1.5", "active": active, "daemon_json": None, "runtimes": [],
                       "live_runtimes": list(live) if live is not None else None, "ctk_daemon_json": written}
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


# What the real nvidia-ctk 1.17 writes for `runtime configure --runtime=docker` (NVIDIA's install guide:
# "The nvidia-ctk command modifies the /etc/docker/daemon.json file on the host"), other keys kept.
EXISTING = '{"log-driver": "json-file", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}\n'
WRITTEN = ('{\n    "log-driver": "json-file",\n    "runtimes": {\n        "nvidia": {\n            "args": [],\n'
           '            "path": "nvidia-container-runtime"\n        },\n        "runsc": {\n'
           '            "path": "/usr/bin/runsc"\n        }\n    }\n}\n')


def test_docker_runtime_diff_is_the_file_nvidia_ctk_wrote_and_docker_restarts_when_idle():
    configure, restart = plan(with_docker(in_state(), EXISTING, written=WRITTEN))
    assert configure.diff.splitlines()[:2] == ["--- /etc/docker/daemon.json", "+++ /etc/docker/daemon.json"]
    assert '+            "path": "nvidia-container-runtime"' in configure.diff.splitlines()
    assert '-{"log-driver": "json-file", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}' in configure.diff
    script = configure.commands[0]
    assert 'nvidia-ctk runtime configure --runtime=docker --config="$t/daemon.json"' in script
    assert "cp -a /etc/docker/daemon.json /etc/docker/daemon.json.gpuprov-bak" in script
    assert restart.disruptive == "Docker restart" and "systemctl restart docker" in restart.commands[0]


def test_docker_without_daemon_json_is_configured_and_the_diff_shows_the_new_file():
    configure, _ = plan(with_docker(in_state(), None, written=WRITTEN))
    assert configure.diff.startswith("--- /dev/null")


def test_without_nvidia_ctk_yet_the_step_prints_the_real_diff():
    configure, _ = plan(with_docker(in_state(), EXISTING, written=None))
    assert configure.diff is None and "the step prints the diff" in configure.summary


def test_live_restore_makes_the_restart_safe_for_running_containers():
    existing = '{"live-restore": true}\n'
    _, restart = plan(with_docker(in_state(), existing, written=None))
    assert restart.disruptive is None and "live-restore" in restart.summary


def test_docker_not_running_is_configured_without_a_restart():
    [configure] = plan(with_docker(in_state(), EXISTING, written=WRITTEN, active=False))
    assert "restart" not in configure.commands[0]


def test_configured_file_but_daemon_without_the_runtime_is_restarted():
    configured = json.dumps({"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}})
    [restart] = plan(with_docker(in_state(), configured, live=["runc"]))
    assert restart.summary.startswith("restart Docker")


def test_docker_already_configured_changes_nothing():
    configured = json.dumps({"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}})
    assert plan(with_docker(in_state(), configured, live=["nvidia", "runc"])) == []
    assert plan(with_docker(in_state(), configured, live=None)) == []


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
