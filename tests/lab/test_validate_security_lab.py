"""`invoke validate` against a hostile SSH user and a hostile neighbour, over real SSH on lab hosts.

(a) A non-root SSH user (sudo rights, its own key) with a hostile `python3` first on its PATH and a tampered
    wheel in the upload folder it may write: the run is refused before anything is installed, and nothing the
    user planted runs as root; once the tampered wheel is gone, the same user gets a venv made from root's own
    python3 and the controller's wheels.
(b) A two-node all-reduce: while torchrun runs, the rendezvous port answers the joined host and drops a third lab
    host (a dropped SYN times out, where a port nobody firewalls is refused at once); the workers run as the
    unprivileged gpuprov-validate; the rendezvous table is gone afterwards.

The judges are the hosts' own kernels and file systems (docker exec), never gpuprov's view.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labutil import ROOT, copy_inventory, invoke, on_host

pytestmark = pytest.mark.lab
USER = "gpuprov-ssh"
RAN = "/tmp/gpuprov-hostile-ran-by-"   # + the uid the hostile python3 ran as
PORT = 29400                          # validate.rdzv_port's default
# From a host: connect to ADDR:PORT within 3 s; prints connected, refused or timeout.
PROBE = "\n".join([
    "import socket, sys", "s = socket.socket(); s.settimeout(3)", "try:",
    "    s.connect((sys.argv[1], int(sys.argv[2]))); print('connected')",
    "except ConnectionRefusedError:", "    print('refused')", "except OSError:", "    print('timeout')"])


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("validate-security")
    return {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}


def validate(env: dict, *args: str, inventory=None) -> tuple[int, dict]:
    extra = ("--inventory", str(inventory)) if inventory else ()
    proc = invoke("validate", *extra, *args, "--no-textfile", "--json", check_code=None, env=env)
    return proc.returncode, json.loads(proc.stdout)


def entry(run: dict, name: str) -> dict:
    return next(h for h in run["hosts"] if h["host"] == name)


# ------------------------------------------------------------------------------------------- (a) the SSH user

@pytest.fixture
def hostile_user(lab):
    """The third lab host with USER: key login, password-less sudo, a python3 of its own first on its PATH
    (marks the uid it ran as, then runs the real one under its own name), and the upload folder gpuprov gives
    it."""
    name = lab.hosts[2].name
    on_host(lab, name, "\n".join([
        "set -e",
        f"useradd --create-home --shell /bin/bash {USER}",
        f"install -d -m 0700 -o {USER} -g {USER} /home/{USER}/.ssh /home/{USER}/bin",
        f"install -m 0600 -o {USER} -g {USER} /root/.ssh/authorized_keys /home/{USER}/.ssh/authorized_keys",
        f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER}; chmod 0440 /etc/sudoers.d/{USER}",
        # it passes itself off as the interpreter (sys.executable), as a hostile copy of python would
        f"printf '#!/bin/bash\\ntouch {RAN}$(id -u)\\nexec -a \"$0\" /usr/bin/python3 \"$@\"\\n' "
        f"> /home/{USER}/bin/python3",
        f"chmod 0755 /home/{USER}/bin/python3; chown {USER}: /home/{USER}/bin/python3",
        f"sed -i '1i export PATH=$HOME/bin:$PATH' /home/{USER}/.bashrc",
        f"rm -f {RAN}*",
        f"install -d -m 0755 /opt/gpuprov && install -d -m 0700 -o {USER} /opt/gpuprov/incoming",
    ]))
    yield name
    on_host(lab, name, f"userdel -r {USER} 2>/dev/null; rm -rf /etc/sudoers.d/{USER} {RAN}* /opt/gpuprov", check=False)


def ssh_as(lab, name: str, user: str, command: str) -> str:
    host = lab.host(name)
    proc = subprocess.run(["ssh", "-i", str(lab.key), "-p", str(host.port), "-o", "BatchMode=yes",
                           "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                           f"{user}@{host.address}", command], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_hostile_ssh_user_steers_nothing_root_runs(lab, env, hostile_user, tmp_path):
    name = hostile_user
    assert ssh_as(lab, name, USER, "command -v python3") == f"/home/{USER}/bin/python3"   # first on its PATH
    on_host(lab, name, f"rm -f {RAN}*")

    def as_user(document):
        document["hosts"][name]["user"] = USER

    inventory = copy_inventory(lab, tmp_path, edit=as_user)
    # the controller's wheelhouse for the lab's hosts (made here on the first run, when this module runs alone)
    _, first = validate(env, "--host", name, "--only", "host.shm", inventory=inventory)
    assert entry(first, name)["error"] is None, first
    on_host(lab, name, "rm -rf /opt/gpuprov/venv /opt/gpuprov/wheelhouse")   # as a host that never had one
    folder = Path(ROOT, "build", "wheelhouse", entry(first, name)["env"]["request"])
    wheel = min(folder.glob("*.whl"), key=lambda p: p.stat().st_size)
    tampered = bytearray(wheel.read_bytes())
    tampered[len(tampered) // 2] ^= 0xFF                                # same name, same size, other bytes
    planted = tmp_path / wheel.name
    planted.write_bytes(bytes(tampered))
    container = lab.host(name).container_id
    subprocess.run(["docker", "cp", str(planted), f"{container}:/opt/gpuprov/incoming/{wheel.name}"], check=True)
    on_host(lab, name, f"chown {USER}: /opt/gpuprov/incoming/{wheel.name}")

    code, run = validate(env, "--host", name, "--only", "host.shm", inventory=inventory)
    error = entry(run, name)["error"]
    assert code == 1 and error["step"] == "python env", run
    assert error["error"] == f"wheels in the upload folder differ from the controller's: {wheel.name}"
    assert on_host(lab, name, "ls -A /opt/gpuprov/wheelhouse; ls -A /opt/gpuprov/incoming; "
                              "test -e /opt/gpuprov/venv && echo venv; true").strip() == ""
    assert on_host(lab, name, f"ls {RAN}0 2>/dev/null; true").strip() == ""      # nothing of it ran as root

    _, again = validate(env, "--host", name, "--only", "host.shm", inventory=inventory)
    assert entry(again, name)["error"] is None and entry(again, name)["env"]["installed"], again
    assert on_host(lab, name, "readlink -f /opt/gpuprov/venv/bin/python").strip() == \
        on_host(lab, name, "readlink -f /usr/bin/python3").strip()
    assert on_host(lab, name, "stat -c '%U %a' /opt/gpuprov/wheelhouse").strip() == "root 700"
    assert on_host(lab, name, f"ls {RAN}0 2>/dev/null; true").strip() == ""


# --------------------------------------------------------------------------------------- (b) the rendezvous

def probe(lab, source: str, address: str) -> str:
    return on_host(lab, source, f"python3 -c {shlex.quote(PROBE)} {address} {PORT}").strip()


def table_on(lab, name: str) -> bool:
    return f"gpuprov_rdzv_{PORT}" in on_host(lab, name, "nft list tables 2>/dev/null; true")


def test_the_rendezvous_port_is_closed_to_a_third_host_during_a_two_node_run(lab, env):
    first, second, third = (h.name for h in lab.hosts[:3])
    rendezvous = lab.host(first).internal_ip
    _, built = validate(env, "--host", f"{first},{second}", "--only", "host.shm")   # both venvs in place
    assert all(h["error"] is None for h in built["hosts"]), built

    proc = subprocess.Popen([sys.executable, "-m", "invoke", "validate", "--host", f"{first},{second}",
                             "--multi-node", "--only", "host.shm", "--no-textfile", "--json"], cwd=ROOT,
                            env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    seen = []
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and not seen:
        if table_on(lab, first):
            answer = probe(lab, third, rendezvous)
            if table_on(lab, first):     # the table stood before and after the probe: it answered the firewall
                seen.append(answer)
        else:
            time.sleep(0.2)
    stdout, stderr = proc.communicate(timeout=900)
    assert seen == ["timeout"], (seen, stderr[-2000:])
    run = json.loads(stdout)
    summary = run["multi_node"]
    assert summary["status"] == "pass", summary
    assert summary["firewall"]["allowed"] == [lab.host(second).internal_ip]
    uid = int(on_host(lab, first, "id -u gpuprov-validate"))
    assert summary["worker_uids"] == [uid] and uid != 0
    assert not table_on(lab, first)
    assert probe(lab, third, rendezvous) == "refused"   # unfirewalled again: nothing listens, and it says so

