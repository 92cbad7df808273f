"""What the hardening variables (declared by gpuprov.harden.variables, checked where they are written) must agree
on once merged: a service port open to `monitoring` or `cluster` needs that network variable on the same host."""

from __future__ import annotations

from gpuprov.inventory.located import Located


def check_references(doc: Located, variables: dict, paths: dict) -> None:
    """An error at each service port whose sources name a network variable the host has none of."""
    for i, entry in enumerate(variables.get("service_ports") or []):
        network = entry.get("sources")
        if isinstance(network, str) and not variables.get(f"{network}_cidrs"):
            doc.error((*paths["service_ports"], i, "sources"),
                      f"{entry['name']} is open to {network}, but {network}_cidrs is not set for this host: set "
                      f"{network}_cidrs (a list of CIDRs) where this host gets it")
