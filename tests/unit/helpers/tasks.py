"""Host tasks as the tests run them: a small TEST-NET inventory, a task's exit code, the invoke program, stand-in
hosts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from invoke import Config, Context
from invoke.exceptions import Exit

import gpuprov.provision.run

REPO = Path(__file__).resolve().parents[3]
INVENTORY = textwrap.dedent("""\
    defaults: {user: gpuadmin}
    groups:
      hgx:
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
          stack: {driver: "570"}
      ada:
        vars:
          hardware: {gpu: L40S, count: 4}
      fleet: {children: [hgx, ada]}
    hosts:
      gpu01: {address: 192.0.2.11, groups: [hgx]}
      gpu02: {address: 192.0.2.12, groups: [hgx]}
      gpu03: {address: 192.0.2.13, groups: [ada]}
    """)


def exit_code(task, c, capsys, **kwargs) -> tuple[int, str]:
    with pytest.raises(Exit) as caught:
        task(c, **kwargs)
    return caught.value.code, capsys.readouterr().err


def locks(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "locks").glob("*.lock.yaml"))


def invoke(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def config(tmp_path: Path, **paths) -> Context:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "known_hosts": str(tmp_path / "known_hosts"),
        "reports": str(paths.get("reports", tmp_path / "reports")),
        "locks": str(paths.get("locks", tmp_path / "locks"))}}))


def host_runs(monkeypatch, behave) -> None:
    """The provision job's work on a host replaced by `behave(host)`, which returns a ProvisionRecord or raises."""
    monkeypatch.setattr(gpuprov.provision.run.ProvisionJob, "run_host", lambda job, conn, say: behave(conn.host))

