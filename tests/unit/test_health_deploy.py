"""health.deploy's pure parts: gpuprov's block of slurm.conf (rendered, put in place, refused when an admin's line
would clash), the breaker's share, each node's settings from the inventory, the controller, bad input (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.health import deploy

ROOT = Path(__file__).resolve().parents[2]
# the start of a slurm.conf as Slurm's configurator and the lab write it
SLURM_CONF = """\
ClusterName=gpuprov-lab
SlurmctldHost=ctl(10.0.0.3)
AuthType=auth/munge
# Epilog=/etc/slurm/epilog.sh   (a comment: not a setting)
ReturnToService=2
NodeName=gpu01 NodeAddr=10.0.0.1 CPUs=4 Gres=gpu:h100-sxm:8 State=UNKNOWN
PartitionName=gpu Nodes=gpu01 Default=YES MaxTime=INFINITE State=UP
"""
BLOCK_300 = """\
# BEGIN gpuprov health (invoke health.deploy writes this block; edits inside it are replaced)
HealthCheckProgram=/usr/local/sbin/gpuprov-health
HealthCheckInterval=300
HealthCheckNodeState=ANY,CYCLE
Epilog=/usr/local/sbin/gpuprov-health-epilog
# END gpuprov health
"""


def test_block_sets_the_three_health_check_keys_and_the_epilog():
    assert deploy.render_block(300, epilog=True) == BLOCK_300
    assert "Epilog=" not in deploy.render_block(5, epilog=False)
    assert "HealthCheckInterval=5\n" in deploy.render_block(5, epilog=False)


def test_block_is_appended_once_and_a_second_merge_changes_nothing():
    merged = deploy.merge_block(SLURM_CONF, BLOCK_300, "gpu01:/etc/slurm/slurm.conf")
    assert merged == SLURM_CONF + BLOCK_300
    assert deploy.merge_block(merged, BLOCK_300, "x") == merged


def test_block_replaces_the_old_one_in_place_and_keeps_what_follows():
    old = SLURM_CONF + BLOCK_300 + "# an admin's line after the block\n"
    new_block = deploy.render_block(5, epilog=False)
    assert deploy.merge_block(old, new_block, "x") == SLURM_CONF + new_block + "# an admin's line after the block\n"


def test_file_without_a_final_newline_gets_one_before_the_block():
    assert deploy.merge_block("ClusterName=c", BLOCK_300, "x") == "ClusterName=c\n" + BLOCK_300


@pytest.mark.parametrize("line", ["Epilog=/etc/slurm/epilog.sh", "healthcheckprogram=/usr/sbin/nhc",
                                  "  HealthCheckInterval = 60  # every minute"])
def test_a_block_key_set_outside_the_block_is_refused_with_its_line(line):
    text = SLURM_CONF + line + "\n"
    with pytest.raises(GpuprovError) as caught:
        deploy.merge_block(text, BLOCK_300, "gpu01:/etc/slurm/slurm.conf")
    assert caught.value.message.startswith("gpu01:/etc/slurm/slurm.conf:8: ")
    assert "outside gpuprov's block" in str(caught.value)


def test_an_admins_epilog_is_fine_without_the_epilog_line():
    text = SLURM_CONF + "Epilog=/etc/slurm/epilog.sh\n"
    block = deploy.render_block(300, epilog=False)
    assert deploy.merge_block(text, block, "x") == text + block


@pytest.mark.parametrize("text", [SLURM_CONF + BLOCK_300.split("\n", 1)[1],             # END without BEGIN
                                  SLURM_CONF + BLOCK_300.rsplit("#", 1)[0],             # BEGIN without END
                                  SLURM_CONF + BLOCK_300 + BLOCK_300,                   # twice
                                  "# END gpuprov health\n" + BLOCK_300.split("# END")[0]])   # END before BEGIN
def test_broken_markers_are_refused(text):
    with pytest.raises(GpuprovError, match="marker lines are broken"):
        deploy.merge_block(text, BLOCK_300, "x")


@pytest.mark.parametrize(("value", "expected"), [(None, 10.0), ("10%", 10.0), ("10", 10.0), ("0%", 0.0),
                                                 ("100%", 100.0), (" 12.5 % ", 12.5)])
def test_max_drained_share(value, expected):
    assert deploy.parse_share(value) == expected


@pytest.mark.parametrize("value", ["150%", "-1", "ten", "nan", "", "%"])
def test_max_drained_out_of_range_is_bad_input(value):
    with pytest.raises(InputError, match="--max-drained"):
        deploy.parse_share(value)


@pytest.mark.parametrize("path", ["slurm.conf", "/etc/slurm/slurm.conf;reboot", "/etc/../tmp/x", "/etc/slurm conf"])
def test_slurm_conf_path_must_be_plain_and_absolute(path):
    with pytest.raises(InputError, match="--slurm-conf"):
        deploy.check_path("--slurm-conf", path)


def host(name: str = "gpu01", **variables) -> SimpleNamespace:
    return SimpleNamespace(name=name, address=name, vars=variables)


@pytest.mark.parametrize(("hardware", "expected_gpus", "nvlink"), [
    ({"gpu": "H100-SXM", "count": 8, "nvswitch": True}, 8, True),
    ({"gpu": "A100-SXM4-80GB", "count": 4, "nvswitch": False}, 4, True),   # SXM boards link their GPUs by NVLink
    ({"gpu": "L40S", "count": 4, "nvswitch": False}, 4, False),
    ({"gpu": "A100-PCIE-80GB", "count": 2}, 2, False),
    ({}, None, False),
])
def test_node_settings_from_the_inventorys_hardware(hardware, expected_gpus, nvlink):
    settings = deploy.host_settings(host(hardware=hardware), "/var/lib/prometheus/node-exporter", 10.0)
    assert settings.get("expected_gpus") == expected_gpus and settings["expect_nvlink"] is nvlink
    assert settings["slurm"] is True and settings["max_drained_pct"] == 10.0
    assert settings["textfile_dir"] == "/var/lib/prometheus/node-exporter"


def test_settings_file_keys_are_the_programs():
    from gpuprov.health import check

    settings = deploy.host_settings(host(hardware={"gpu": "H100-SXM", "count": 8, "nvswitch": True}), "/t", 5.0)
    assert set(settings) <= set(check.CONFIG_KEYS)


def test_the_nodes_controller_is_added_and_must_be_one():
    scheduler = {"kind": "slurm", "controller": "ctl"}
    nodes = [host("gpu01", scheduler=scheduler), host("gpu02", scheduler=scheduler)]
    assert deploy.controller_of(nodes) == "ctl"
    assert deploy.controller_of([*nodes, host("ctl")]) == "ctl"    # --all: the controller is no node
    with pytest.raises(InputError, match="no scheduler.controller for gpu03"):
        deploy.controller_of([*nodes, host("gpu03")])
    with pytest.raises(InputError, match="different controllers"):
        deploy.controller_of([*nodes, host("gpu03", scheduler={"controller": "ctl2"})])
    with pytest.raises(InputError, match="no Slurm node"):
        deploy.controller_of([host("ctl", scheduler={"controller": "ctl"})])


@pytest.mark.parametrize(("args", "message"), [
    (["--interval", "0"], "--interval must be a whole number"),
    (["--interval", "5s"], "--interval must be a whole number"),
    (["--max-drained", "200%"], "--max-drained '200%': expected a share of a partition from 0% to 100%"),
    (["--slurm-conf", "etc/slurm.conf"], "--slurm-conf 'etc/slurm.conf': expected an absolute path"),
])
def test_bad_options_exit_2_naming_the_option_before_any_host(args, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "invoke", "health.deploy", "--all", "--inventory",
                           str(tmp_path / "missing.yaml"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


# -- the textfile folder: root's, as monitoring.deploy keeps it -----------------------------------------------------

def node_plan(node, textfile_state: dict, family: str = "debian", conf: str = SLURM_CONF,
              record: deploy.HealthRecord | None = None) -> list:
    """The plan of health.deploy on `node` whose textfile folder is in `textfile_state` (stat's `%F %U:%G %a`)."""
    record = record or deploy.HealthRecord(node.name)
    record.facts_before = {"os": {"family": family}, "files": {"/etc/slurm/slurm.conf": conf},
                           "health_probe": {"python3": "3.11"}, "textfile_dir": textfile_state}
    job = deploy.HealthDeployJob(deploy.Options(), "ctl")
    return job.plan(SimpleNamespace(host=node), record)


def commands(changes: list) -> str:
    return "\n".join(command for change in changes for command in change.commands)


def test_a_textfile_folder_the_prometheus_user_owns_is_made_root_s_and_kept_so():
    """Debian's prometheus-node-exporter gives /var/lib/prometheus (and the folder below) to the prometheus user."""
    node = host("gpu01")
    planned = commands(node_plan(node, {"folder": "directory prometheus:prometheus 755",
                                        "package_dir": "directory prometheus:prometheus 755", "override": None}))
    assert "dpkg-statoverride --add root root 0755 /var/lib/prometheus" in planned
    assert "d=/var/lib/prometheus/node-exporter;" in planned
    assert 'chown root:root "$d" && chmod 0755 "$d"' in planned
    assert "mkdir -p -m 0755" not in planned


def test_a_root_owned_textfile_folder_is_left_alone():
    node = host("gpu01")
    planned = commands(node_plan(node, {"folder": "directory root:root 755", "package_dir": "directory root:root 755",
                                        "override": "root root 755 /var/lib/prometheus"}))
    assert "dpkg-statoverride" not in planned and "d=/var/lib/prometheus/node-exporter;" not in planned


def test_a_missing_textfile_folder_elsewhere_is_created_root_s():
    node = host("gpu01", validate={"textfile_dir": "/srv/metrics"})
    planned = commands(node_plan(node, {"folder": None, "package_dir": None, "override": None}, family="rhel"))
    assert "d=/srv/metrics;" in planned and 'chown root:root "$d"' in planned
    assert "dpkg-statoverride" not in planned


@pytest.mark.parametrize("state", ["symbolic link root:root 777", "regular file root:root 644",
                                   "directory root:root 1777"])
def test_a_textfile_folder_gpuprov_may_not_own_is_refused_naming_host_and_path(state):
    node = host("gpu01")
    with pytest.raises(GpuprovError) as caught:
        node_plan(node, {"folder": state, "package_dir": "directory root:root 755",
                         "override": "root root 755 /var/lib/prometheus"})
    assert caught.value.host == "gpu01"
    assert "/var/lib/prometheus/node-exporter" in caught.value.message and state in caught.value.message
    assert "validate.textfile_dir" in caught.value.hint


# -- configless Slurm, a controller that is a node too, scontrol reconfigure only after every host --------------------

ROOTS = {"folder": "directory root:root 755", "package_dir": "directory root:root 755",
         "override": "root root 755 /var/lib/prometheus"}


@pytest.mark.parametrize("line", ["SlurmctldParameters=enable_configless", "slurmctldparameters=idle_on_node_suspend,"
                                  "enable_configless  # nodes fetch this file"])
def test_configless_slurm_is_refused_on_the_controller(line):
    record = deploy.HealthRecord("ctl", role="controller")
    with pytest.raises(GpuprovError) as caught:
        node_plan(host("ctl"), ROOTS, conf=SLURM_CONF + line + "\n", record=record)
    assert caught.value.host == "ctl" and caught.value.step == "slurm.conf"
    assert "configless" in caught.value.message and "enable_configless" in caught.value.message


def test_a_commented_configless_setting_is_not_configless():
    assert not deploy.configless(SLURM_CONF + "# SlurmctldParameters=enable_configless\n")
    assert deploy.configless("SlurmctldParameters=enable_configless,reboot_from_controller\n")


@pytest.mark.parametrize(("controller", "conf"), [
    (host("ctl"), SLURM_CONF.replace("NodeName=gpu01 ", "NodeName=gpu01,ctl ")),
    (host("ctl"), SLURM_CONF + "NodeName=ctl NodeAddr=10.0.0.3 CPUs=4 Gres=gpu:l40s:2 State=UNKNOWN\n"),
    (host("ctl0"), SLURM_CONF.replace("NodeName=gpu01 ", "NodeName=gpu01,ctl[0-1] ")),
    (host("ctl", slurm_state="idle"), SLURM_CONF),            # the inventory's slurm: source lists it
])
def test_a_controller_that_is_also_a_node_gets_the_program(controller, conf):
    record = deploy.HealthRecord(controller.name, role="controller")
    text = commands(node_plan(controller, ROOTS, conf=conf, record=record))
    assert "/usr/local/sbin/gpuprov-health.gpuprov.tmp" in text
    assert "/usr/local/sbin/gpuprov-health-epilog.gpuprov.tmp" in text
    assert record.role == "controller+node"


def test_a_controller_that_is_no_node_gets_the_block_only():
    record = deploy.HealthRecord("ctl", role="controller")
    changes = node_plan(host("ctl"), ROOTS, record=record)
    assert [c.component for c in changes] == ["slurm.conf"] and record.role == "controller"


def finished(monkeypatch, statuses: dict[str, str]) -> tuple[dict, list]:
    """finish() after a run whose hosts ended in `statuses` (each changed its slurm.conf), and scontrol's calls."""
    calls: list = []

    class Runner:
        def __call__(self, argv, admin=False):
            calls.append(argv)
            return 0, "", ""

        def close(self):
            pass

    monkeypatch.setattr("gpuprov.core.controller.controller_runner", lambda fleet, name: Runner())
    job = deploy.HealthDeployJob(deploy.Options(), "ctl")
    records, entries = [], []
    for name, status in statuses.items():
        record = deploy.HealthRecord(name, status=status, role="controller" if name == "ctl" else "node",
                                     plan=[{"component": "slurm.conf"}])
        records.append(None if status == "failed" else record)
        entries.append(record.to_dict())
    return job.finish(None, records, entries), calls


def test_reconfigure_is_held_back_when_a_node_failed(monkeypatch):
    result, calls = finished(monkeypatch, {"gpu01": "changed", "gpu02": "failed", "ctl": "changed"})
    assert calls == []
    assert result["reconfigure"].startswith("held back: health.deploy did not finish on gpu02")
    job = deploy.HealthDeployJob(deploy.Options(), "ctl")
    assert job.failing({"host": "ctl", "reconfigure": result["reconfigure"]})


def test_reconfigure_runs_once_every_host_is_done(monkeypatch):
    result, calls = finished(monkeypatch, {"gpu01": "changed", "gpu02": "unchanged", "ctl": "changed"})
    assert calls == [["scontrol", "reconfigure"]] and result["reconfigure"] == "done"
