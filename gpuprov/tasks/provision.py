"""`invoke provision` and `invoke preflight`: plan and apply a matching GPU stack over SSH."""

from __future__ import annotations

from gpuprov.tasks._common import (
    BATCH_HELP,
    HOST_HELP,
    current_shard,
    finish,
    host_task,
    only_components,
    open_fleet,
)

# gpuprov.provision.ops.COMPONENTS, written out so that `invoke --list` imports no operation module
ONLY_CHOICES = "sources,kernel,driver,cuda,nccl,engine,container_toolkit,fabricmanager,dcgm,pins"
RUN_HELP = {
    **HOST_HELP,
    "parallel": "hosts worked on at once (default: gpuprov.parallel)",
    "max_fail": "stop starting new hosts after this many failures: a count (3) or a share (10%)",
    "trust_new_hosts": "record unknown host keys (trust on first use)",
}


@host_task(help={
    **RUN_HELP,
    **BATCH_HELP,
    "dry_run": "show the plan and change nothing",
    "reboot": "never | if-needed (default: only for this run's changes or a driver swap gpuprov recorded) "
              "| always",
    "disrupt": "allow disruptive steps (driver change, reboot, fabric manager or Docker restart) even while "
               "GPU processes, containers or Slurm jobs run on the host",
    "only": "comma list of components: " + ONLY_CHOICES.replace(",", ", "),
    "skip_preflight": "provision even when a preflight check fails",
    "update_lock": "move the lock file to the newly resolved stack",
    "json": "print the run report as JSON on stdout",
})
def provision(c, host=None, group=None, all=False, inventory=None, dry_run=False, parallel=None, max_fail=None,
              reboot="if-needed", only=None, skip_preflight=False, update_lock=False, trust_new_hosts=False,
              disrupt=False, json_=False, serial=None, batch_window=None, max_fail_percentage=None):
    """Plan and apply the resolved driver/CUDA/NCCL/toolkit/fabric manager/DCGM stack on hosts."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError
    from gpuprov.core.report import check_folder
    from gpuprov.core.runtime import run_fleet
    from gpuprov.provision.run import REBOOT_POLICIES, Options, ProvisionJob
    from gpuprov.stack.lock import locks_for

    if reboot not in REBOOT_POLICIES:
        raise InputError(f"--reboot must be one of {', '.join(REBOOT_POLICIES)}, got {reboot!r}")
    if update_lock and current_shard() is not None:
        raise InputError(f"--update-lock with --shard {current_shard()}: a group's lock is resolved from all of its "
                         "hosts, and shards would each move it from part of them", step="provision",
                         hint="move the lock once (invoke stack.lock, or provision --update-lock without --shard), "
                              "then provision the shards against it")
    components = only_components(only)
    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       max_fail=max_fail, serial=serial, batch_window=batch_window,
                       max_fail_percentage=max_fail_percentage, json_=json_, kind="provision")
    locks = path_setting(c, "locks")
    check_folder("gpuprov.locks", locks, write=update_lock and locks.exists())
    locks_for(fleet.hosts, locks)  # a corrupt lock is bad input: found before any host is contacted
    options = Options(dry_run=dry_run, reboot=reboot, only=components, skip_preflight=skip_preflight,
                      update_lock=update_lock, disrupt=disrupt, locks_dir=locks)
    finish(run_fleet(fleet, ProvisionJob(options, fleet.inventory.path.parent)))


@host_task(help={**{k: v for k, v in RUN_HELP.items() if k != "max_fail"},
                 "json": "print the run report as JSON on stdout"})
def preflight(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False,
              json_=False):
    """Read-only checks that must pass before provisioning (Secure Boot, nouveau, headers, locks, disk, sources)."""
    from gpuprov.core.runtime import run_fleet
    from gpuprov.provision.run import PreflightJob

    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       json_=json_, kind="preflight")
    finish(run_fleet(fleet, PreflightJob(fleet.inventory.path.parent)))
