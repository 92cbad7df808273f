"""Helpers for lab tests: run the CLI as an operator would, copy and edit the lab inventory, look at hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# What a dry run must leave exactly as it was: configuration, software, package state, boot files.
SNAPSHOT = ("(find /etc /usr /opt /boot /var/lib/dpkg /var/lib/apt -xdev -printf '%p %s %T@ %m %l\\n' "
            "2>/dev/null | sort; tar -cf - /etc /var/lib/dpkg /var/lib/apt 2>/dev/null) | sha256sum")


def invoke(*args: str, check_code: int | None = 0, env: dict | None = None,
           timeout: int = 900) -> subprocess.CompletedProcess:
    """Run `python -m invoke ARGS` from the repository root; assert its exit code unless None."""
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL,
                          timeout=timeout, env={**os.environ, **(env or {})})
    if check_code is not None:
        assert proc.returncode == check_code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def invoke_json(*args: str, check_code: int | None = 0, env: dict | None = None) -> dict:
    return json.loads(invoke(*args, "--json", check_code=check_code, env=env).stdout)


def copy_inventory(lab, tmp_path: Path, known_hosts: Path | None = None, edit=None) -> Path:
    """The lab inventory written elsewhere, with an absolute known_hosts; `edit(document)` may change it."""
    document = yaml.safe_load(lab.inventory.read_text())
    document["known_hosts"] = str(known_hosts or lab.known_hosts)
    if edit is not None:
        edit(document)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def on_host(lab, name: str, command: str, check: bool = True) -> str:
    """Run a shell command inside a lab host (the test's own view, not gpuprov's)."""
    proc = subprocess.run(["docker", "exec", lab.host(name).container_id, "sh", "-c", command],
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout


def snapshot(lab, name: str) -> str:
    return on_host(lab, name, SNAPSHOT).strip()


def docker_networks(network: str) -> tuple[str, str]:
    """(the default bridge's gateway: where the controller's SSH connections come from as lab hosts see them,
    the subnet of `network`), as a running lab host's own routing table shows them: the gateway of its default
    route, and its route into the lab's address plan (`gpuprov.lab.hosts.SUBNETS`, the subnets the lab creates
    `network` with). Docker's IPAM block is not read: some engines leave its Gateway out."""
    import docker

    from gpuprov.lab.hosts import SUBNETS
    from gpuprov.lab.labels import HOST_ROLE, LABEL_FILTER, ROLE_LABEL

    client = docker.from_env()
    running = client.containers.list(filters={"label": [LABEL_FILTER, f"{ROLE_LABEL}={HOST_ROLE}"],
                                              "network": [network], "status": "running"})
    assert running, f"no lab host runs on {network}"
    result = running[0].exec_run(["ip", "-json", "-4", "route", "show"])
    assert result.exit_code == 0, result.output
    routes = json.loads(result.output)
    gateways = [r["gateway"] for r in routes if r["dst"] == "default" and "gateway" in r]
    internal = [r["dst"] for r in routes if r["dst"] in SUBNETS]
    assert len(gateways) == 1 and len(internal) == 1, f"{running[0].name}'s routes: {routes}"
    return gateways[0], internal[0]


def wait_for(check, timeout: float, what: str, every: float = 1.0):
    """Poll `check` every `every` seconds until it answers something true, which is returned; AssertionError naming
    `what` and the last answer after `timeout` seconds (a deadline, never a measured time)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} within {timeout} s (last: {last!r})")


@contextmanager
def slurm_fleet(profiles: list[str]) -> Iterator:
    """A module's own fresh lab with `lab.up --slurm` (one GPU host per profile, then the controller); downed at the
    end unless GPUPROV_KEEP_LAB=1."""
    import gpuprov.lab
    from gpuprov.lab.state import LabPaths

    paths = LabPaths(ROOT)
    state = gpuprov.lab.up(len(profiles), profiles, paths=paths, progress=print, fresh=True, slurm=True)
    try:
        yield state
    finally:
        if os.environ.get("GPUPROV_KEEP_LAB") != "1":
            gpuprov.lab.down(paths=paths)
