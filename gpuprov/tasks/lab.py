"""`invoke lab.up / lab.status / lab.down / lab.registry`: the local lab of SSH hosts that stand in for GPU servers,
and its image registry."""

from __future__ import annotations

from gpuprov.tasks._common import exits_cleanly, split_names, task, whole_number

# the lab network hands out addresses from the upper half of a /24, and each host has an SSH port on 127.0.0.1
MAX_LAB_HOSTS = 100


def _printer():
    from gpuprov.core.report import console, styled

    out = console()
    return lambda line: out.print(styled(line), soft_wrap=True)


@task(iterable=["profile"], help={
    "hosts": "number of hosts (containers gpuprov-lab-01 ...), default 3",
    "profile": "hardware profile(s), repeat or give a comma list; cycled over the hosts "
               "(default: a mix of hgx-h100, l40s, a100-pcie, rtx-4090, h200); NAME@RELEASE runs Debian "
               "bullseye or trixie instead of bookworm, e.g. l40s@trixie",
    "fresh": "recreate every host from the image: bare servers, nothing provisioned",
    "slurm": "also a Slurm cluster (Debian's slurm-wlm): slurmctld on one more host without GPUs, slurmd on every "
             "GPU host, all in partition gpu",
})
@exits_cleanly
def up(c, hosts=None, profile=None, fresh=False, slurm=False):
    """Start the lab (Docker engine, images, hosts) and write inventories/lab.yaml."""
    import gpuprov.lab

    count = 3 if hosts is None else whole_number("--hosts", hosts, 1, MAX_LAB_HOSTS - 1 if slurm else MAX_LAB_HOSTS)
    state = gpuprov.lab.up(count, split_names(profile, "--profile") or None, progress=_printer(), fresh=fresh,
                           slurm=slurm)
    _table(state.hosts)
    print(f"inventory: {state.inventory}\nknown_hosts: {state.known_hosts}\nkey: {state.key}")


@task
@exits_cleanly
def status(c):
    """Show the lab hosts: name, profile, Debian release, state, ssh port, internal IP."""
    import gpuprov.lab

    hosts = gpuprov.lab.status()
    if not hosts:
        print("no lab hosts (start them with `invoke lab.up`)")
        return
    _table(hosts)


@task(help={"images": "also remove the images the lab built (they are kept as a cache otherwise)"})
@exits_cleanly
def down(c, images=False):
    """Remove the lab's containers, network, inventory and known_hosts; nothing else on the engine."""
    import gpuprov.lab

    gpuprov.lab.down(images=images, progress=_printer())


@task
@exits_cleanly
def registry(c):
    """Start the lab registry (Debian's docker-registry) and make the lab hosts' Docker trust it as insecure."""
    import gpuprov.lab
    from gpuprov.lab.registry import ensure_registry, trust_registry

    info = ensure_registry(progress=_printer())
    trust_registry([host for host in gpuprov.lab.status() if host.state == "running"], info.pull)
    print(f"push from here: --registry {info.push}\npull on lab hosts: --registry {info.pull} (or images.registry)")


def _table(hosts) -> None:
    from gpuprov.core.report import console, table

    console().print(table(["host", "profile", "Debian", "state", "ssh", "internal IP"],
                          [[host.name, host.profile, host.release, host.state, f"127.0.0.1:{host.port}",
                            host.internal_ip or "-"] for host in hosts]))
