"""What the stack's operations share beyond the core's primitives: the driver's state and its packages.

Operations are pure: facts + stack + repository spec in, `Change`s out. Nothing here touches a host.
"""

from __future__ import annotations

from gpuprov.core.errors import InputError
from gpuprov.core.operations import Change, OpContext, at_version, service_change
from gpuprov.core.packages import Package

# True on the host when the installed driver answers: NVML works only when the loaded kernel module
# matches the installed library (on a host that had no driver, nvidia-smi loads the new module itself).
DRIVER_ANSWERS = "nvidia-smi -L >/dev/null 2>&1"


def driver_pending(ctx: OpContext) -> bool:
    """True while the loaded kernel module is not the stack's driver (a reboot is still to come)."""
    return ctx.facts.get("loaded_driver_version") != ctx.stack["driver"]["version"]


def driver_service(ctx: OpContext, component: str, service: str) -> Change | None:
    """Enable a driver-bound service; start it too unless the stack's driver is still to be loaded (then it starts
    now only if the new driver already answers, else with it after the reboot)."""
    if not driver_pending(ctx):
        return service_change(component, service, ctx.service(service))
    return service_change(component, service, ctx.service(service), when=DRIVER_ANSWERS,
                          summary=f"enable {service} (started now if the new driver already answers, else with it "
                                  "after the reboot)")


def stack_packages(ctx: OpContext, section: str) -> list[Package]:
    """The exact packages of one stack section (`[]` when the section is null)."""
    entry = ctx.stack.get(section)
    if entry is None:
        return []
    try:
        return [Package(str(p["name"]), str(p["version"])) for p in entry["packages"]]
    except (KeyError, TypeError) as exc:
        raise InputError(f"stack section {section!r} has no valid package list ({exc})", host=ctx.host,
                         step=section, hint="re-resolve the stack (invoke stack.resolve)") from None


def driver_moves(ctx: OpContext) -> bool:
    """Whether this plan installs driver packages (the set built from the driver is then known only later)."""
    return any(not at_version(ctx, pkg) for pkg in stack_packages(ctx, "driver"))
