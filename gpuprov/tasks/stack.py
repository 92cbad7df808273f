"""Stack tasks: resolve a matching driver/CUDA/NCCL/... stack, show the tables, write lock files, check hosts."""

from __future__ import annotations

import json
import sys

from invoke.exceptions import Exit

from gpuprov.core.config import path_setting
from gpuprov.core.errors import InputError, literal
from gpuprov.core.json_text import dump_json
from gpuprov.tasks._common import (
    check_output_files,
    current_shard,
    exits_cleanly,
    gather_all,
    host_task,
    parallel_setting,
    select_hosts,
    split_names,
    task,
    whole_number,
)

_RESOLVE_HELP = {
    "gpu": "GPU model (required): catalog name, alias or nvidia-smi name (e.g. H100-SXM)",
    "os": "OS key (required): ubuntu-22.04, ubuntu-24.04, debian-12, rhel-9 or rocky-9",
    "gpus": "number of GPUs, a whole number >= 1 (default 1)",
    "nvswitch": "the GPUs sit on an NVSwitch baseboard (adds fabric manager)",
    "cuda": "pin a CUDA release (12.8) or update (12.8.1)",
    "driver": "pin a driver branch (570) or version (570.148.08)",
    "pytorch": "pin a PyTorch release (2.7)",
    "ngc": "pin an NGC PyTorch tag (25.04)",
    "nccl": "pin an NCCL release (2.26 or 2.26.5)",
    "forward_compat": "allow CUDA forward compatibility (data center GPUs only)",
    "json": "print exactly one JSON object",
}


@task(help=_RESOLVE_HELP)
@exits_cleanly
def resolve(c, gpu=None, os=None, gpus=None, nvswitch=False, cuda=None, driver=None, pytorch=None, ngc=None,
            nccl=None, forward_compat=False, json_=False):
    """Resolve the newest stack that satisfies NVIDIA's compatibility rules for a GPU and OS."""
    from gpuprov.catalog import models
    from gpuprov.stack.data import OS_KEYS
    from gpuprov.stack.resolve import resolve as do_resolve

    gpu = _required("gpu", gpu, f"a GPU model such as H100-SXM (catalog models: {', '.join(models())}; "
                                "invoke stack.matrix --component gpus lists their aliases too)")
    os = _required("os", os, f"the OS of the hosts, one of {', '.join(OS_KEYS)}")
    count = 1 if gpus is None else whole_number("--gpus", gpus, 1)
    stack = do_resolve(gpu, os, gpus=count, nvswitch=nvswitch, cuda=cuda, driver=driver,
                       pytorch=pytorch, ngc=ngc, nccl=nccl, forward_compat=forward_compat)
    for warning in stack.warnings:
        print(f"warning: {literal(warning)}", file=sys.stderr)
    if json_:
        print(dump_json(stack.to_dict(), indent=None))
        return
    _print_stack(stack.to_dict())


def _required(option: str, value: str | None, accepted: str) -> str:
    """A required option of stack.resolve; InputError naming it and what it accepts when missing or empty."""
    if value is None or not str(value).strip():
        raise InputError(f"--{option} is required: give {accepted}")
    return value


def _print_stack(data: dict) -> None:
    from gpuprov.core.report import console, table

    gpu = data["gpu"]
    driver = data["driver"]
    rows = [("driver", f"{driver['version']} (R{driver['branch']}, {driver['kernel_modules']} modules)", driver),
            ("cuda", data["cuda"]["version"] + (" + forward compat" if data["forward_compat"] else ""), data["cuda"]),
            ("nccl", data["nccl"]["version"], data["nccl"]),
            ("container toolkit", data["container_toolkit"]["version"], data["container_toolkit"]),
            ("fabric manager", data["fabricmanager"]["version"] if data["fabricmanager"] else "-",
             data["fabricmanager"]),
            ("dcgm", data["dcgm"]["version"], data["dcgm"])]
    cells = [[name, version, "\n".join(f"{p['name']}={p['version']}" for p in (part or {}).get("packages", []))]
             for name, version, part in rows]
    cells.append(["ngc pytorch", f"nvcr.io/nvidia/pytorch:{data['ngc_pytorch']}" if data["ngc_pytorch"] else "-",
                  ""])
    torch = data["pytorch"]
    cells.append(["pytorch wheel", f"torch {torch['version']} ({torch['wheel']})" if torch else "-",
                  f"https://download.pytorch.org/whl/{torch['wheel']}" if torch else ""])
    console().print(table(["component", "version", "packages"], cells,
                          title=f"{gpu['model']} ({gpu['arch']}, sm_{gpu['compute_capability'].replace('.', '')}) "
                                f"on {data['os']}"))


_COMPONENTS = ("gpus", "cuda", "forward_compat", "drivers", "nccl", "container_toolkit", "dcgm", "ngc_pytorch",
               "pytorch_wheels")


def _matrix_rows(component: str) -> tuple[list[str], list[list]]:
    from gpuprov.stack.data import table

    if component == "gpus":
        rows = [[k, ", ".join(r["names"]), ", ".join(r.get("aliases", [])), ", ".join(r["pci_ids"]), r["arch"],
                 r["compute_capability"], r["memory_gib"], "yes" if r["datacenter"] else "no", r["form_factor"],
                 r["bf16_tflops"], r["mem_bw_gbs"]] for k, r in table("gpus")["models"].items()]
        return ["model", "nvidia-smi name", "aliases", "pci ids", "arch", "cc", "GB", "dc", "form", "bf16 TF",
                "GB/s"], rows
    if component == "cuda":
        return ["cuda", "update", "min driver"], [[m, u, d] for m, r in table("cuda")["releases"].items()
                                                  for u, d in r["updates"].items()]
    if component == "forward_compat":
        return ["package", "driver branches"], [[f"cuda-compat-{m.replace('.', '-')}", ", ".join(b)]
                                                for m, b in table("cuda")["forward_compat"].items()]
    if component == "drivers":
        return ["branch", "kind", "eol", "latest", "published versions"], [
            [b, r["kind"], r["eol"], r["latest"], ", ".join(r["versions"]) or "none known (cannot be pinned)"]
            for b, r in table("drivers")["branches"].items()]
    if component == "nccl":
        return ["nccl", "cuda builds"], [[v, ", ".join(b)] for v, b in table("nccl")["releases"].items()]
    if component == "container_toolkit":
        return ["version"], [[v] for v in table("container_toolkit")["releases"]]
    if component == "dcgm":
        rows = [[v, ", ".join(r["cuda_majors"])] for v, r in table("dcgm")["releases"].items()]
        return ["version", "cuda majors"], rows
    if component == "ngc_pytorch":
        cols = ["cuda", "pytorch", "nccl", "cudnn", "ubuntu", "min_driver"]
        return ["tag", *cols, "dc branches"], [[f"{t}-py3", *[r[c] for c in cols],
                                                ", ".join(f"R{b} >= {v}" for b, v in r["dc_branches"].items())]
                                               for t, r in table("ngc_pytorch")["tags"].items()]
    return ["pytorch", "wheels"], [[v, ", ".join(w)] for v, w in table("pytorch_wheels")["releases"].items()]


@task(help={"component": "one table: " + ", ".join(_COMPONENTS)})
@exits_cleanly
def matrix(c, component=None):
    """Show the compatibility tables gpuprov resolves from."""
    from gpuprov.core.report import console, table

    if component and component not in _COMPONENTS:
        print(f"error: unknown component {component!r}. Accepted: {', '.join(_COMPONENTS)}", file=sys.stderr)
        raise Exit(code=2)
    out = console()
    for name in [component] if component else _COMPONENTS:
        columns, rows = _matrix_rows(name)
        out.print(table(columns, [["-" if v is None else str(v) for v in row] for row in rows], title=name))


@host_task(help={"os": "OS key of the hosts (default: gathered from the hosts over SSH)",
                 "image": "record this image's digest in the lock (an image id or a spec name, pushed to --registry "
                          "from this machine); repeat or give a comma list",
                 "registry": "the registry the --image images were pushed to",
                 "shard": "refused: a group's lock is resolved from all of its hosts, not a shard of them"})
def lock(c, host=None, group=None, all=False, inventory=None, os=None, parallel=None, trust_new_hosts=False,
         image=None, registry=None):
    """Write lock files resolved from inventory vars (hardware/stack): one per --group, --host, or host (--all).

    locks/GROUP.lock.yaml for each --group (all its hosts must resolve to one stack), locks/HOST.lock.yaml for
    each --host, one per host with --all. Nothing is written unless every lock resolves. --image records the
    digest and minimum driver of images the hosts run (images.run pulls that digest there, stack.check reports a
    driver that no longer fits).
    """
    from gpuprov.core.errors import GpuprovError
    from gpuprov.core.report import check_folder
    from gpuprov.stack.lock import lock_history, write_lock
    from gpuprov.stack.resolve import check_os, resolve_for_host

    if current_shard() is not None:
        raise InputError(f"--shard {current_shard()}: stack.lock is not split into shards: a group's lock is "
                         "resolved from all of its hosts (they must resolve to one stack), and shards would each "
                         "write it from part of them", step="stack.lock",
                         hint="lock from one controller; --os locks from the inventory alone, without contacting "
                              "the hosts")
    parallel_setting(c, parallel)
    inv, hosts = select_hosts(c, host, group, all, inventory, connects=os is None)
    by_host = [h.name for h in inv.select([str(value) for value in host or []], [], False)] if host else []
    targets = _lock_targets(inv, hosts, split_names(group, "--group"), by_host, all)
    new_folder = check_folder("gpuprov.locks", path_setting(c, "locks"), write=True)
    check_output_files("gpuprov.locks", [path_setting(c, "locks") / f"{name}.lock.yaml" for name in targets])
    images = _locked_images([image] if image is not None else None, registry)
    if os is not None:
        check_os(os)
        facts = {}
    else:
        facts = gather_all(c, inv, hosts, trust_new_hosts=trust_new_hosts, parallel=parallel)
    stacks = {}
    for h in hosts:
        host_facts = facts.get(h.name)
        if os is None and not (isinstance(host_facts, dict) and "os" in host_facts):
            raise GpuprovError(f"no facts: {(host_facts or {}).get('error')}", host=h.name, step="stack.lock",
                               hint="fix the connection, or give --os to lock from the inventory alone")
        stacks[h.name] = resolve_for_host(h.vars, os, host_facts)
    for name, members in targets.items():
        if len({json.dumps(stacks[m].to_dict(), sort_keys=True) for m in members}) > 1:
            raise InputError(f"hosts of {name} resolve to different stacks ({', '.join(members)}); lock them "
                             "per host or give them the same hardware/stack vars", step="stack.lock")
    for name, members in targets.items():
        stack = stacks[members[0]]
        path = path_setting(c, "locks") / f"{name}.lock.yaml"
        before = set(lock_history(path))
        write_lock(path, stack, stack.inputs, images)  # a lock with another stack is kept in history/
        print(f"wrote {literal(str(path))} (driver {stack.driver['version']}, CUDA {stack.cuda['version']}, "
              f"NCCL {stack.nccl['version']}" + "".join(f"; {i['name']} {i['digest']}" for i in images) + ")")
        for kept in [entry for entry in lock_history(path) if entry not in before]:
            print(f"kept the lock it replaced as {literal(str(kept))}", file=sys.stderr)
    if new_folder:
        print(f"created the folder {literal(str(path_setting(c, 'locks')))} (gpuprov.locks)", file=sys.stderr)


def _locked_images(names: list[str] | None, registry: str | None) -> list[dict]:
    """The lock entries of the --image images (their digests as pushed to --registry from this machine)."""
    if not split_names(names, "--image"):
        if registry is not None:
            raise InputError("--registry names where the --image images were pushed: give --image too",
                             step="stack.lock")
        return []
    from gpuprov.images.build import engine_client
    from gpuprov.images.push import lock_entry
    from gpuprov.images.spec import load_specs
    from gpuprov.images.tags import check_registry
    from gpuprov.tasks.images import _selected

    registry = check_registry(registry)
    if not registry:
        raise InputError("--image needs --registry: the registry the images were pushed to", step="stack.lock")
    images = _selected(load_specs(), names)
    api = engine_client().api
    return [lock_entry(api, image, registry) for image in images]


def _lock_targets(inv, hosts, groups: list[str], names: list[str], all_: bool) -> dict[str, list[str]]:
    """{lock name: member host names}: one per group named, one per host named (every host with --all)."""
    targets: dict[str, list[str]] = {}
    for name in groups:
        targets[name] = [h.name for h in hosts if h.name in inv.groups[name].hosts]
        if not targets[name]:
            raise InputError(f"group {name} has no hosts to lock", step="stack.lock")
    for name in [h.name for h in hosts] if all_ else names:
        if name in targets:
            raise InputError(f"{name} names both a group and a host; both would write locks/{name}.lock.yaml",
                             step="stack.lock", hint="lock one of them at a time")
        targets[name] = [name]
    return targets


@host_task(help={"json": "print JSON"})
def check(c, host=None, group=None, all=False, inventory=None, json_=False, parallel=None, trust_new_hosts=False):
    """Compare hosts with their stack (lock file, else resolved) and print each mismatch with its remedy.

    A locked image whose minimum driver the host's driver no longer meets is a mismatch too."""
    from gpuprov.core.report import check_folder
    from gpuprov.stack.check import check_host, image_mismatches
    from gpuprov.stack.lock import locked_images, locks_for
    from gpuprov.stack.resolve import resolve_for_host

    parallel_setting(c, parallel)
    inv, hosts = select_hosts(c, host, group, all, inventory)
    check_folder("gpuprov.locks", path_setting(c, "locks"), write=False)
    locks = locks_for(hosts, path_setting(c, "locks"))  # a bad lock is bad input: found before any host
    images = locked_images(hosts, path_setting(c, "locks"))
    gathered = gather_all(c, inv, hosts, trust_new_hosts=trust_new_hosts, parallel=parallel, quiet=json_)
    report, failed = {}, False
    for h in hosts:
        facts = gathered.get(h.name)
        if not isinstance(facts, dict) or "error" in facts and "os" not in facts:
            report[h.name] = {"error": str(facts.get("error") if isinstance(facts, dict) else facts)}
            failed = True
            continue
        stack = locks.get(h.name) or resolve_for_host(h.vars, None, facts).to_dict()
        mismatches = check_host(facts, stack) + image_mismatches(facts, images.get(h.name, []),
                                                                 bool(stack.get("forward_compat")))
        failed = failed or bool(mismatches)
        report[h.name] = {"mismatches": [m.to_dict() for m in mismatches]}
    if json_:
        print(dump_json(report, indent=None))
    else:
        for name, result in report.items():
            if "error" in result:
                print(f"[{name}] facts failed: {result['error']}")
            elif not result["mismatches"]:
                print(f"[{name}] matches its stack")
            for m in result.get("mismatches", []):
                print(f"[{name}] {m['what']}: expected {m['expected']}, found {m['found']}\n    remedy: {m['remedy']}")
    if failed:
        raise Exit(code=1)
