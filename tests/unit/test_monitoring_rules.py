"""gpuprov's Prometheus alert rules (gpuprov/monitoring/prometheus/gpuprov.rules.yml): the alerts the monitoring
contract names, each with a severity and a summary and description naming the host; promtool (Debian's prometheus
package, installed by the test as root when missing) accepts the file, runs its unit tests (tests/promtool/) and rejects
a broken file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import gpuprov.monitoring.promtool as promtool_module
from gpuprov.core.errors import GpuprovError
from gpuprov.monitoring.promtool import promtool_path

PROJECT = Path(__file__).resolve().parents[2]
RULES = PROJECT / "gpuprov" / "monitoring" / "prometheus" / "gpuprov.rules.yml"
RULE_TESTS = PROJECT / "tests" / "promtool" / "gpuprov.rules.test.yml"
# the alert names of the monitoring contract
ALERTS = {"GpuprovExporterDown", "GpuprovGpuMissing", "GpuprovXidError", "GpuprovEccUncorrectable",
          "GpuprovRowRemapPending", "GpuprovRowRemapFailure", "GpuprovThermalThrottle", "GpuprovPowerThrottle",
          "GpuprovDriverLibraryMismatch", "GpuprovRebootRequired", "GpuprovValidationFailed",
          "GpuprovValidationStale", "GpuprovDriftStale", "GpuprovGpuIdle", "GpuprovHealthDrainHeldBack"}
PER_GPU = {"GpuprovXidError", "GpuprovEccUncorrectable", "GpuprovRowRemapPending", "GpuprovRowRemapFailure",
           "GpuprovThermalThrottle", "GpuprovPowerThrottle", "GpuprovGpuIdle"}


@pytest.fixture(scope="module")
def promtool() -> str:
    if not shutil.which("promtool") and os.geteuid() != 0:
        pytest.skip("promtool is not on PATH and installing Debian's prometheus package needs root")
    return promtool_path(install=True)


def promtool_run(promtool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300, check=False)


def rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert [group["name"] for group in groups] == ["gpuprov"]
    return {rule["alert"]: rule for rule in groups[0]["rules"]}


def test_the_rules_are_the_contracts_alerts_each_with_severity_summary_and_description():
    found = rules()
    assert set(found) == ALERTS
    for name, rule in found.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        for text in rule["annotations"].values():
            assert "{{ $labels.host }}" in text, name
        if name in PER_GPU:
            assert all("{{ $labels.gpu }}" in text for text in rule["annotations"].values()), name
    assert "for" not in found["GpuprovDriverLibraryMismatch"]
    assert found["GpuprovRebootRequired"]["labels"]["severity"] == "info"
    assert found["GpuprovGpuIdle"]["expr"] == ('max_over_time(DCGM_FI_DEV_GPU_UTIL{job="gpuprov-dcgm"}[6h]) < 5 '
                                               'and present_over_time(DCGM_FI_DEV_GPU_UTIL{job="gpuprov-dcgm"}[5m] '
                                               'offset 6h)')


def test_every_alert_has_a_unit_test_where_it_fires():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert firing == ALERTS


class FakeApt:
    """apt-cache and apt-get as seen by promtool_path: records each command with the policy-rc.d in force while it
    ran, and puts a promtool on PATH when apt-get installs the package."""

    def __init__(self, bin_dir: Path, policy: Path, known: bool = True, install_rc: int = 0):
        self.bin_dir, self.policy, self.known, self.install_rc = bin_dir, policy, known, install_rc
        self.calls: list[tuple[list[str], str | None, str | None]] = []

    def __call__(self, command, **kwargs):
        policy = self.policy.read_text() if self.policy.exists() else None
        self.calls.append((command, policy, kwargs["env"].get("DEBIAN_FRONTEND")))
        rc = 0
        if command[:2] == ["apt-cache", "show"]:
            rc = 0 if self.known else 100
        elif command[:2] == ["apt-get", "install"]:
            rc = self.install_rc
            if rc == 0:
                tool = self.bin_dir / "promtool"
                tool.write_text("#!/bin/sh\n")
                tool.chmod(0o755)
        return subprocess.CompletedProcess(command, rc, "", "E: no such package\n" if rc else "")


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    """A machine with apt-get and no promtool on PATH, seen as root, with its policy-rc.d in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text("#!/bin/sh\n")
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(promtool_module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(promtool_module, "POLICY_RC_D", tmp_path / "policy-rc.d")
    return bin_dir


def test_promtool_on_path_is_used_as_it_is(fake_root):
    (fake_root / "promtool").write_text("#!/bin/sh\n")
    (fake_root / "promtool").chmod(0o755)
    assert promtool_path(install=True) == str(fake_root / "promtool")


def test_installing_promtool_keeps_the_server_from_starting_and_removes_the_policy_after(fake_root, monkeypatch):
    policy = fake_root.parent / "policy-rc.d"
    apt = FakeApt(fake_root, policy, known=False)
    monkeypatch.setattr(promtool_module.subprocess, "run", apt)
    assert promtool_path(install=True) == str(fake_root / "promtool")
    assert apt.calls == [
        (["apt-cache", "show", "prometheus"], None, "noninteractive"),
        (["apt-get", "update"], None, "noninteractive"),
        (["apt-get", "install", "-y", "--no-install-recommends", "prometheus"], "#!/bin/sh\nexit 101\n",
         "noninteractive"),
    ]
    assert not policy.exists()


def test_an_existing_policy_rc_d_is_left_alone_and_a_failed_install_is_an_error(fake_root, monkeypatch):
    policy = fake_root.parent / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 0\n")
    monkeypatch.setattr(promtool_module.subprocess, "run", FakeApt(fake_root, policy, install_rc=100))
    with pytest.raises(GpuprovError) as failed:
        promtool_path(install=True)
    assert failed.value.step == "promtool"
    assert failed.value.command == "apt-get install -y --no-install-recommends prometheus"
    assert "no such package" in failed.value.output
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_without_install_or_root_a_missing_promtool_is_an_error_with_a_hint(fake_root, monkeypatch):
    with pytest.raises(GpuprovError, match="promtool is not on PATH") as missing:
        promtool_path(install=False)
    assert "apt-get install --no-install-recommends prometheus" in missing.value.hint
    monkeypatch.setattr(promtool_module.os, "geteuid", lambda: 1000)
    with pytest.raises(GpuprovError, match="installing it needs root"):
        promtool_path(install=True)


@pytest.mark.tool
@pytest.mark.lab
def test_promtool_accepts_the_rules(promtool):
    done = promtool_run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 15 rules found" in done.stdout


@pytest.mark.tool
@pytest.mark.lab
def test_the_rules_unit_tests_pass(promtool):
    done = promtool_run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.tool
@pytest.mark.lab
def test_promtool_rejects_a_broken_rules_file(promtool, tmp_path):
    broken = tmp_path / "broken.rules.yml"
    broken.write_text('groups:\n  - name: gpuprov\n    rules:\n      - alert: GpuprovExporterDown\n'
                      '        expr: up{job="gpuprov-node" == 0\n        for: 5m\n')
    done = promtool_run(promtool, "check", "rules", str(broken))
    assert done.returncode == 1
    assert "could not parse expression" in done.stderr
    assert "GpuprovExporterDown" in done.stderr
