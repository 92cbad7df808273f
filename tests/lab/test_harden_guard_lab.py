"""The harden guard against a lab host over real SSH, under the faults its window meets: a guarded step slower than
the revert timer (the sshd reload held by a gate the test opens), a second run while the first is undecided, and a
reboot inside the window. One host, bare before and after; each scenario once.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labutil import ROOT, copy_inventory, invoke, on_host

pytestmark = pytest.mark.lab

GUARDS = "/var/lib/gpuprov/harden"
GATE_OPEN = "/run/lab-gate-open"
GATE = "/etc/systemd/system/ssh.service.d/lab-gate.conf"
# sshd's reload waits (at most 120 s) until the test opens the gate: a guarded step as slow as the test wants
GATE_UNIT = ("[Service]\nTimeoutStartSec=300\nExecReload=\n"
             f"ExecReload=/bin/sh -c 'i=0; while [ ! -e {GATE_OPEN} ] && [ $$i -lt 1200 ]; do sleep 0.1; "
             "i=$$((i+1)); done'\nExecReload=/bin/kill -HUP $MAINPID\n")
# no gpuprov batch runs on the host (the batch is `sh -s` fed on stdin, whether run as root, through sudo or not)
BATCH_OVER = "! pgrep -x -f '(/bin/|/usr/bin/)?sh -s' >/dev/null"
# what a harden run of ssh and firewall leaves on a bare host once it is reverted: nothing
OLD_CONFIGURATION = ("test ! -e /etc/ssh/sshd_config.d/10-gpuprov-hardening.conf && "
                     "test ! -e /etc/gpuprov/firewall.nft && ! nft list table inet gpuprov >/dev/null 2>&1 && "
                     "! systemctl is-enabled --quiet gpuprov-firewall.service && "
                     "test ! -e /etc/systemd/system/multi-user.target.wants/gpuprov-harden-boot-revert.service && "
                     f"! ls {GUARDS}/*/armed >/dev/null 2>&1 && echo old")


@pytest.fixture(scope="module")
def host(lab, tmp_path_factory):
    """A bare lab host, the environment of every CLI call, and its inventories: SSH open to all (no lockout), and a
    firewall that drops the controller's SSH (applied only with --i-have-console-access)."""
    name = lab.hosts[1].name
    folder = tmp_path_factory.mktemp("harden-guard")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    assert on_host(lab, name, OLD_CONFIGURATION).strip() == "old"

    def edit(document):
        document["hosts"][name]["vars"]["firewall"] = {
            "allow": [{"port": 22, "proto": "tcp", "sources": ["192.0.2.0/24"]}]}

    (folder / "open").mkdir()
    (folder / "lockout").mkdir()
    open_inventory = copy_inventory(lab, folder / "open")
    lockout = copy_inventory(lab, folder / "lockout", edit=edit)
    yield lab, name, env, open_inventory, lockout
    on_host(lab, name, f"rm -f {GATE} {GATE_OPEN} && systemctl daemon-reload", check=False)


def harden_args(name: str, inventory: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "invoke", "harden", "--host", name, "--inventory", str(inventory), "--json",
            "--only", "ssh,firewall", *extra]


def start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, **env})


def finish(proc: subprocess.Popen, code: int, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == code, f"exit {proc.returncode}\n{out}\n{err}"
    (run,) = json.loads(out)["hosts"]
    return run


def poll(lab, name: str, command: str, seconds: float = 120) -> str:
    """The output of `command` on the host once it prints something (bounded)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out = on_host(lab, name, command, check=False).strip()
        if out:
            return out
        time.sleep(0.5)
    raise AssertionError(f"{name}: nothing from {command!r} within {seconds}s")


def armed_run(lab, name: str, proc: subprocess.Popen) -> str:
    """The id of the run `proc` armed on the host (its output when it ends or times out first)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        path = on_host(lab, name, f"ls {GUARDS}/*/armed 2>/dev/null", check=False).strip()
        if path:
            return path.split("/")[-2]
        time.sleep(0.5)
    proc.kill()
    out, err = proc.communicate()
    raise AssertionError(f"{name}: no guard armed (exit {proc.returncode})\n{out}\n{err}")


def test_a_step_slower_than_the_timer_is_undone_and_a_second_run_is_refused_meanwhile(host):
    lab, name, env, inventory, _ = host
    content = base64.b64encode(GATE_UNIT.encode()).decode()
    on_host(lab, name, f"rm -f {GATE_OPEN} && mkdir -p {GATE.rsplit('/', 1)[0]} && echo {content} | base64 -d > {GATE} "
                       "&& systemctl daemon-reload")
    first = start(harden_args(name, inventory, "--confirm-timeout", "15"), env)
    try:
        run_id = armed_run(lab, name, first)
        owner = on_host(lab, name, f"cat {GUARDS}/{run_id}/owner").strip()
        second = invoke(*harden_args(name, inventory)[3:], check_code=1, env=env)
        (refused,) = json.loads(second.stdout)["hosts"]
        assert refused["status"] == "failed" and refused["error"]["step"] == "guard" and refused["steps"] == []
        assert refused["error"]["error"] == f"another harden run's guard is still undecided on this host: {owner}"
        assert re.fullmatch(rf"run {run_id} from controller \S+ \(\S+@\S+\), started \d{{4}}-\d\d-\d\dT[\d:]+Z", owner)
        # the host's timer fires while the sshd step still waits at the gate: its revert waits for the step
        poll(lab, name, f"systemctl is-active gpuprov-harden-revert-{run_id}.service | grep -x active")
    finally:
        on_host(lab, name, f"touch {GATE_OPEN}")
    run = finish(first, code=1)
    assert run["guard"]["result"] == "rolled back by the host", run
    assert "revert timer ran first" in run["guard"]["detail"] and run["guard"]["run_id"] == run_id
    assert f"from controller {run['controller']['address']} (" in owner
    assert on_host(lab, name, OLD_CONFIGURATION).strip() == "old"
    assert on_host(lab, name, f"cut -d' ' -f2 {GUARDS}/{run_id}/reverted").strip() == "timer"
    on_host(lab, name, f"rm -f {GATE} && systemctl daemon-reload")
    invoke("facts", "--host", name, "--inventory", str(inventory), env=env)   # SSH works


def test_a_reboot_inside_the_window_brings_the_old_configuration_back(host):
    lab, name, env, _, lockout = host
    started = on_host(lab, name, "cut -d' ' -f22 /proc/1/stat").strip()
    run = start(harden_args(name, lockout, "--i-have-console-access", "--confirm-timeout", "300"), env)
    try:
        run_id = armed_run(lab, name, run)
        # the new configuration is in place and enabled at boot, and the batch (`sh -s`) has ended: the reboot falls
        # in the confirm window, not inside a step; the controller is locked out and cannot confirm
        poll(lab, name, "test -f /etc/ssh/sshd_config.d/10-gpuprov-hardening.conf && "
                        "systemctl is-enabled --quiet gpuprov-firewall.service && "
                        f"{BATCH_OVER} && echo in-window")
        assert "192.0.2.0/24" in on_host(lab, name, "nft list table inet gpuprov")
        on_host(lab, name, "systemctl reboot", check=False)
        poll(lab, name, f"[ \"$(cut -d' ' -f22 /proc/1/stat)\" != {started} ] && systemctl is-system-running "
                        "| grep -E -x 'running|degraded'", seconds=300)
    except BaseException:
        run.kill()
        raise
    assert on_host(lab, name, OLD_CONFIGURATION).strip() == "old"
    assert on_host(lab, name, f"cut -d' ' -f2 {GUARDS}/{run_id}/reverted").strip() == "boot"
    assert on_host(lab, name, "systemctl is-active gpuprov-firewall.service", check=False).strip() == "inactive"
    reverted = finish(run, code=1)
    assert reverted["status"] == "rolled back" and reverted["guard"]["result"] == "rolled back by the host", reverted
    assert "rebooted inside the confirm window" in reverted["guard"]["detail"]
    assert "restored /etc/gpuprov/firewall.nft" in reverted["guard"]["log"]
