"""`invoke provision` against bare lab hosts over real SSH, through the lab mirror.

The tests run in file order and share the hosts: bare -> dry run -> provisioned -> faults -> upgrade.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from labutil import ROOT, copy_inventory, invoke, invoke_json, on_host, snapshot

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts
PROFILES = ["hgx-h100", "l40s", "a100-pcie"]


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """Bare lab hosts (recreated from the image) and the environment every CLI call of this module uses."""
    import gpuprov.lab

    state = gpuprov.lab.up(len(PROFILES), PROFILES, paths=lab.paths, fresh=True)
    folder = tmp_path_factory.mktemp("provision")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    return state, env


def hgx(state) -> str:
    return next(h.name for h in state.hosts if h.profile == "hgx-h100")


def provision(env, *args, check_code=0, inventory=None) -> dict:
    from gpuprov.lab.state import LabPaths

    return invoke_json("provision", "--inventory", str(inventory or LabPaths(ROOT).inventory), *args,
                       check_code=check_code, env=env)


def by_host(report: dict) -> dict:
    return {run["host"]: run for run in report["hosts"]}


def test_dry_run_changes_nothing(fleet):
    state, env = fleet
    before = {h.name: snapshot(state, h.name) for h in state.hosts}
    runs = by_host(provision(env, "--all", "--dry-run"))
    assert all(run["status"] == "planned" and run["plan"]["changes"] for run in runs.values())
    assert {h.name: snapshot(state, h.name) for h in state.hosts} == before


def test_provision_from_bare_installs_the_resolved_stack_and_holds_it(fleet):
    state, env = fleet
    runs = by_host(provision(env, "--all"))
    for name, run in runs.items():
        assert run["status"] == "changed", run.get("error")
        assert run["reboot"] == "done" and run["mismatches"] == []
        after = run["facts_after"]
        wanted = [p for key in ("driver", "cuda", "nccl", "container_toolkit", "fabricmanager", "dcgm")
                  for p in (run["stack"][key] or {"packages": []})["packages"]]
        installed = {p["name"]: after["packages"].get(p["name"]) for p in wanted}
        assert installed == {p["name"]: p["version"] for p in wanted}
        assert {p["name"] for p in wanted} <= set(after["held"])
        assert after["nvidia_smi"]["driver_version"] == run["stack"]["driver"]["version"]
        assert (run["stack"]["fabricmanager"] is not None) == (name == hgx(state))
    assert runs[hgx(state)]["facts_after"]["services"]["nvidia-fabricmanager"]["active"] is True
    held = on_host(state, hgx(state), "apt-mark showhold")
    assert "nvidia-fabricmanager" in held


def test_second_run_changes_nothing(fleet):
    _, env = fleet
    runs = by_host(provision(env, "--all"))
    assert {name: (run["status"], len(run["plan"]["changes"])) for name, run in runs.items()} == {
        name: ("unchanged", 0) for name in runs}


def test_stack_check_finds_planted_mismatches_and_provision_mends_them(fleet):
    state, env = fleet
    name = hgx(state)
    invoke("stack.check", "--host", name, env=env)
    on_host(state, name, "apt-mark unhold libnccl2 >/dev/null && systemctl stop nvidia-fabricmanager")
    found = invoke_json("stack.check", "--host", name, check_code=1, env=env)[name]["mismatches"]
    text = " ".join(f"{m['what']} {m['remedy']}" for m in found).lower()
    assert "libnccl2" in text and "fabric" in text
    provision(env, "--host", name)
    invoke("stack.check", "--host", name, env=env)


DPKG_LOCK = "/var/lib/dpkg/lock-frontend"


def remove_nccl_dev_and_hold_the_lock(state, name: str) -> None:
    """Leave work for provision (a removed package) and hold dpkg's lock as unattended-upgrades would, until the
    test lets go (`pkill -f fcntl.lockf`); returns once the lock is held."""
    on_host(state, name, "apt-mark unhold libnccl-dev >/dev/null && dpkg -r libnccl-dev >/dev/null")
    hold = (f"import fcntl, time; f = open('{DPKG_LOCK}', 'a'); "
            "fcntl.lockf(f, fcntl.LOCK_EX); time.sleep(3600)")
    subprocess.run(["docker", "exec", "-d", state.host(name).container_id, "python3", "-c", hold], check=True)
    # held: another process cannot take it (the probe's own lock, when it gets one, ends with it)
    probe = (f"python3 -c \"import fcntl; fcntl.lockf(open('{DPKG_LOCK}', 'a'), fcntl.LOCK_EX | fcntl.LOCK_NB)\" "
             "2>/dev/null; echo rc=$?")
    deadline = time.monotonic() + 60
    while on_host(state, name, probe).strip() == "rc=0":
        assert time.monotonic() < deadline, f"the lock holder never took {DPKG_LOCK}"
        time.sleep(0.2)


def start_provision(env: dict, name: str) -> subprocess.Popen:
    """`invoke provision --host NAME --json` in the background."""
    from gpuprov.lab.state import LabPaths

    return subprocess.Popen([sys.executable, "-m", "invoke", "provision", "--host", name, "--inventory",
                             str(LabPaths(ROOT).inventory), "--json"], cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_apt_install(state, name: str, proc: subprocess.Popen) -> None:
    """Until the host runs `apt-get ... install` (bounded; the run must still be going)."""
    deadline = time.monotonic() + 120
    while not re.search(r"^apt-get .* install ", on_host(state, name, "ps -eo args", check=False), re.M):
        assert time.monotonic() < deadline and proc.poll() is None, "provision never reached apt-get install"
        time.sleep(0.3)


def test_held_apt_lock_is_waited_out(fleet):
    """Provision reaches `apt-get install` while another process holds dpkg's lock and waits there (nothing
    installed, the run going on), then completes once the lock is let go."""
    state, env = fleet
    name = state.hosts[1].name
    remove_nccl_dev_and_hold_the_lock(state, name)
    proc = start_provision(env, name)
    try:
        wait_for_apt_install(state, name, proc)
        status = on_host(state, name, "dpkg-query -W -f='${db:Status-Abbrev}' libnccl-dev", check=False)
        assert not status.startswith("ii") and proc.poll() is None
        on_host(state, name, "pkill -f '[f]cntl.lockf'")   # the other process lets go
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
        on_host(state, name, "pkill -f fcntl.lockf", check=False)
    assert proc.returncode == 0, out + err
    run = by_host(json.loads(out))[name]
    assert run["status"] == "changed" and run["facts_after"]["packages"].get("libnccl-dev")


def test_killed_connection_mid_apply_then_rerun_converges(fleet):
    """The lock is held until the test lets go, so the batch is certainly inside `apt-get install` (waiting
    for the lock) when its connection is cut: no race with a fast host."""
    state, env = fleet
    name = state.hosts[2].name
    remove_nccl_dev_and_hold_the_lock(state, name)
    proc = start_provision(env, name)
    try:
        wait_for_apt_install(state, name, proc)
        on_host(state, name, "pkill -f '^sshd: root@notty'")  # the connection drops mid-apply
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        on_host(state, name, "pkill -f fcntl.lockf", check=False)
    assert proc.returncode == 1, out + err
    provision(env, "--host", name)
    again = by_host(provision(env, "--host", name))[name]
    assert again["status"] == "unchanged"


def test_mirror_down_is_a_clear_error_naming_the_url(fleet, tmp_path):
    state, env = fleet
    name = state.hosts[1].name
    on_host(state, name, "apt-mark unhold libnccl-dev >/dev/null && dpkg -r libnccl-dev >/dev/null")
    down_url = {}

    def mirror_down(document):
        mirror = dict(document["groups"]["lab"]["vars"]["mirror"])
        mirror["url"] = down_url["url"] = mirror["url"].rstrip("/") + ":81/"  # nothing listens there
        document["hosts"][name]["vars"]["mirror"] = mirror

    inventory = copy_inventory(state, tmp_path, edit=mirror_down)
    run = by_host(provision(env, "--host", name, inventory=inventory, check_code=1))[name]
    assert run["status"] == "failed" and run["error"]["step"] == "preflight"
    assert down_url["url"] in run["error"]["error"] and "unreachable" in run["error"]["error"]
    assert "libnccl-dev" not in run["facts_before"]["packages"]
    provision(env, "--host", name)  # the mirror as it is: converges


def test_one_host_down_others_go_on(fleet):
    import gpuprov.lab

    state, env = fleet
    down = state.hosts[-1].name
    gpuprov.lab.stop_host(down)
    try:
        runs = by_host(provision(env, "--all", check_code=1))
    finally:
        gpuprov.lab.start_host(down, paths=state.paths)
    assert runs[down]["status"] == "failed" and "cannot reach" in runs[down]["error"]["error"]
    assert all(run["status"] == "unchanged" for name, run in runs.items() if name != down)


def test_inventory_value_with_metacharacters_arrives_as_data(fleet, tmp_path):
    state, env = fleet
    name = state.hosts[0].name

    def hostile_proxy(document):
        mirror = dict(document["groups"]["lab"]["vars"]["mirror"])
        mirror["proxy"] = "http://127.0.0.1:9/$(touch${IFS}/tmp/owned-proxy);reboot"
        document["hosts"][name]["vars"]["mirror"] = mirror

    inventory = copy_inventory(state, tmp_path, edit=hostile_proxy)
    boot = on_host(state, name, "cut -d' ' -f22 /proc/1/stat")
    proc = invoke("preflight", "--host", name, "--inventory", str(inventory), check_code=1, env=env)
    assert "unreachable" in proc.stdout
    assert on_host(state, name, "ls /tmp/owned-* 2>/dev/null | wc -l").strip() == "0"
    assert on_host(state, name, "cut -d' ' -f22 /proc/1/stat") == boot  # and it did not reboot


def test_driver_upgrade_needs_a_reboot_until_done(fleet, tmp_path):
    state, env = fleet
    name = hgx(state)

    def pin(branch):
        def edit(document):
            document["hosts"][name]["vars"]["stack"] = {"driver": branch}
        return edit

    older = copy_inventory(state, tmp_path, edit=pin("580"))
    run = by_host(provision(env, "--host", name, inventory=older))[name]
    assert run["stack"]["driver"]["branch"] == "580" and run["reboot"] == "done"

    run = by_host(provision(env, "--host", name, "--reboot", "never"))[name]
    new = run["stack"]["driver"]["version"]
    assert run["status"] == "changed" and run["reboot"] == "required" and not new.startswith("580")
    packages = run["facts_after"]["packages"]
    assert all(packages.get(p["name"]) == p["version"] for p in run["stack"]["fabricmanager"]["packages"])
    mismatches = invoke_json("stack.check", "--host", name, check_code=1, env=env)[name]["mismatches"]
    assert any("reboot" in m["remedy"].lower() for m in mismatches)

    subprocess.run(["docker", "restart", state.host(name).container_id], check=True, capture_output=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if invoke("stack.check", "--host", name, check_code=None, env=env).returncode == 0:
            break
        time.sleep(2)
    else:
        pytest.fail("stack.check still reports a mismatch after the reboot")
