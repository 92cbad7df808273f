"""The plan of one host: what will change and why, from its facts, its inventory variables and its stack."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuprov.core.errors import InputError
from gpuprov.core.operations import change_dict


@dataclass
class HostPlan:
    """A host's resolved stack and the ordered changes that bring it there ([] when in state)."""

    host: object
    facts: dict
    stack: dict
    changes: list

    @property
    def reboot_needed(self) -> bool:
        return any(change.reboot for change in self.changes)

    def to_dict(self) -> dict:
        return {"host": self.host.name, "stack": self.stack, "reboot_needed": self.reboot_needed,
                "changes": [change_dict(c) for c in self.changes]}


# a package change of the fabric manager itself (not of libnvidia-nscq or nvlsm alone, nor a service start)
_FABRIC_MANAGER = re.compile(r"(install|remove) nvidia-fabric-?manager")


def mark_disruptive(change):
    """The change with `disruptive` set when it would interrupt running work: any driver package change
    (NVML answers "Driver/library version mismatch" to new processes until the reboot), and a fabric
    manager package change (its package scripts restart the service, which resets the NVLink fabric)."""
    from dataclasses import replace

    if change.disruptive:
        return change
    if change.component == "driver":
        return replace(change, disruptive="driver change")
    if change.component == "fabricmanager" and _FABRIC_MANAGER.search(change.summary):
        return replace(change, disruptive="fabric manager restart")
    return change


def _read_local(path: str | None, inventory_dir: Path, what: str, host: str) -> str | None:
    if not path:
        return None
    file = Path(path).expanduser()
    if not file.is_absolute():
        file = inventory_dir / file
    try:
        return file.read_text()
    except OSError as exc:
        raise InputError(f"cannot read the mirror {what} {file}: {exc.strerror}", host=host, step="plan",
                         hint=f"fix mirror.{what} in the inventory") from None


def repo_spec(host, facts: dict, inventory_dir: Path):
    """Where packages come from: the inventory's mirror, or NVIDIA's repository for the host's OS and CPU
    architecture. apt pins the repository by its Release label (NVIDIA's, unless the mirror names its own)."""
    from gpuprov.provision.ops import RepoSpec
    from gpuprov.provision.ops.repo import repo_label, repo_url
    from gpuprov.stack.data import table

    os_key = facts["os"]["key"]
    mirror = host.vars.get("mirror") or {}
    proxy = mirror.get("proxy")
    label = mirror.get("label") or repo_label(os_key)
    ca_pem = _read_local(mirror.get("ca_file"), inventory_dir, "ca_file", host.name)
    if mirror.get("url"):
        return RepoSpec(url=mirror["url"], key_url=None if mirror.get("key_file") else mirror.get("key_url"),
                        key_data=_read_local(mirror.get("key_file"), inventory_dir, "key_file", host.name),
                        fingerprint=mirror.get("fingerprint"), proxy=proxy, ca_pem=ca_pem, label=label)
    url, key_url = repo_url(os_key, facts.get("arch") or "x86_64")
    return RepoSpec(url=url, key_url=key_url, key_data=None,
                    fingerprint=table("packages")["os"][os_key]["key_fingerprint"], proxy=proxy, ca_pem=ca_pem,
                    label=label)


def prepare_changes(facts: dict) -> list:
    """What must happen before any package work: finish an interrupted dpkg, let cloud-init finish."""
    from gpuprov.provision.ops import Change

    changes = []
    if facts.get("cloud_init") == "running":
        changes.append(Change("prepare", "wait for cloud-init to finish first boot",
                              ("cloud-init status --wait >/dev/null || true",)))
    if facts.get("dpkg_interrupted"):
        changes.append(Change("prepare", "finish the interrupted dpkg run (dpkg --configure -a)",
                              ("DEBIAN_FRONTEND=noninteractive dpkg --configure -a",)))
    return changes


def require_supported_os(host_name: str, facts: dict) -> None:
    if facts["os"]["key"] is None:
        raise InputError(f"unsupported OS {facts['os'].get('pretty_name')!r}", host=host_name, step="facts",
                         hint="gpuprov supports ubuntu-22.04, ubuntu-24.04, debian-12, rhel-9 and rocky-9")


def plan_host(host, facts: dict, stack: dict, inventory_dir: Path, only: set[str] | None = None) -> HostPlan:
    """The plan for one host from its facts and resolved stack."""
    from gpuprov.provision.ops import OpContext, plan_changes

    require_supported_os(host.name, facts)
    ctx = OpContext(host=host.name, facts=facts, stack=stack, repo=repo_spec(host, facts, inventory_dir),
                    host_vars=dict(host.vars))
    changes = prepare_changes(facts) if only is None else []
    return HostPlan(host, facts, stack, [mark_disruptive(c) for c in changes + plan_changes(ctx, only)])
