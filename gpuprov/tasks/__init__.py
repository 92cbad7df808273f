"""Thin Invoke task modules, collected into one namespace for `invoke` and the `gpuprov` program."""

from __future__ import annotations

from invoke import Collection

from gpuprov.core.config import DEFAULTS


def namespace() -> Collection:
    """The root collection: host tasks at the top, tool groups as sub-collections."""
    from gpuprov.tasks import (
        facts,
        harden,
        health,
        images,
        inventory,
        lab,
        monitoring,
        provision,
        report,
        reports,
        rollout,
        stack,
        validate,
    )

    ns = Collection()
    ns.add_task(facts.facts)
    ns.add_task(provision.provision)
    ns.add_task(provision.preflight)
    checks = Collection("validate", bundle=validate.bundle)   # `invoke validate` and `invoke validate.bundle`
    checks.add_task(validate.validate, default=True)
    ns.add_collection(checks)
    ns.add_task(harden.harden)
    ns.add_task(rollout.rollout)
    ns.add_task(report.report)
    ns.add_collection(Collection.from_module(health, name="health"))
    ns.add_collection(Collection.from_module(images, name="images"))
    ns.add_collection(Collection.from_module(inventory, name="inventory"))
    ns.add_collection(Collection.from_module(lab, name="lab"))
    ns.add_collection(Collection.from_module(monitoring, name="monitoring"))
    ns.add_collection(Collection.from_module(reports, name="reports"))
    ns.add_collection(Collection.from_module(stack, name="stack"))
    ns.configure({"gpuprov": DEFAULTS})
    return ns
