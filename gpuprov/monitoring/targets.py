"""Prometheus targets from the inventory: file_sd JSON per exporter and the scrape configuration that reads them.

Each host is a target at its monitoring address (the `monitoring_address` variable, else its inventory address),
labelled with what the inventory and its lock know:

    host, groups (",hgx,training,": comma-wrapped, so groups=~".*,hgx,.*" selects a group), gpu_model, gpu_count,
    driver, cuda, nccl (the lock's stack, else the inventory's pins), cost_per_hour (where cost.per_hour is set)

Prometheus re-reads file_sd files when they change, so a host added to the inventory is scraped after
`invoke monitoring.targets` without a restart.
"""

from __future__ import annotations

import json

from gpuprov.monitoring.policy import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT, build_policy

SERVER_DIR = "/etc/prometheus/gpuprov"
TARGET_FILES = {"gpuprov-node": "node.json", "gpuprov-dcgm": "dcgm.json"}


def _version(stack: dict, key: str) -> str | None:
    value = stack.get(key)
    if isinstance(value, dict):
        value = value.get("version")
    return str(value) if value not in (None, "") else None


def target_labels(host, groups: list[str], lock_stack: dict | None) -> dict[str, str]:
    """A host's target labels (strings, as file_sd requires; a label the inventory does not know is left out);
    `groups`: every group the host is in, through child groups too."""
    variables = host.vars
    hardware = variables.get("hardware") or {}
    stack = lock_stack or variables.get("stack") or {}
    labels = {"host": host.name, "groups": "," + ",".join(sorted(groups)) + ","}
    optional = {"gpu_model": hardware.get("gpu"), "gpu_count": hardware.get("count"),
                "driver": _version(stack, "driver"), "cuda": _version(stack, "cuda"), "nccl": _version(stack, "nccl"),
                "cost_per_hour": (variables.get("cost") or {}).get("per_hour")}
    labels.update({key: str(value) for key, value in optional.items() if value is not None})
    return labels


def file_sd(inventory, hosts, lock_stacks: dict[str, dict]) -> dict[str, list[dict]]:
    """{job: its file_sd document}: every host's node_exporter, and its dcgm-exporter where one is expected (a host
    with GPUs in the inventory, or a dcgm_exporter mode that names one)."""
    jobs: dict[str, list[dict]] = {job: [] for job in TARGET_FILES}
    for host in sorted(hosts, key=lambda h: h.name):
        policy = build_policy(host)
        groups = [group.name for group in inventory.groups.values() if host.name in group.hosts]
        labels = target_labels(host, groups, lock_stacks.get(host.name))
        address = f"[{policy.address}]" if ":" in policy.address else policy.address
        jobs["gpuprov-node"].append({"targets": [f"{address}:{NODE_EXPORTER_PORT}"], "labels": labels})
        if policy.expects_dcgm_exporter:
            jobs["gpuprov-dcgm"].append({"targets": [f"{address}:{DCGM_EXPORTER_PORT}"], "labels": labels})
    return jobs


def file_sd_text(document: list[dict]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


# The labels of drift.sh's gpuprov_stack_info that are the host's own report (its installed stack), where the
# target's labels of the same names are the inventory's or the lock's.
STACK_INFO_LABELS = ("driver", "cuda", "nccl")


def metric_relabel_configs() -> list[dict]:
    """What a host's exporters may not say about themselves. Without honor_labels the target's labels (host, job,
    instance, groups, ...) win over a scraped series' labels of the same names, which Prometheus renames
    exported_<name>: so a host's textfile cannot claim another host's `host`. Only gpuprov_stack_info keeps the
    host's own driver, cuda and nccl; every other exported_* label is dropped."""
    return [*({"source_labels": ["__name__", f"exported_{label}"], "regex": "gpuprov_stack_info;(.+)",
               "target_label": label, "replacement": "$1"} for label in STACK_INFO_LABELS),
            {"action": "labeldrop", "regex": "exported_.+"}]


def scrape_configs(refresh_s: int = 30, directory: str = SERVER_DIR) -> list[dict]:
    """The scrape jobs that read the file_sd files; `host` and the other target labels come from the file_sd
    labels, never from what a host serves (see metric_relabel_configs)."""
    return [{"job_name": job,
             "file_sd_configs": [{"files": [f"{directory}/targets/{name}"], "refresh_interval": f"{refresh_s}s"}],
             "metric_relabel_configs": metric_relabel_configs()}
            for job, name in TARGET_FILES.items()]


def prometheus_config(scrape_interval_s: int, listen: str, directory: str = SERVER_DIR) -> dict:
    """Prometheus's whole configuration on the monitoring host: itself (at `listen`, its monitoring address: it
    listens nowhere else), the gpuprov jobs and the rules."""
    interval = f"{scrape_interval_s}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [f"{directory}/*.rules.yml"],
        "scrape_configs": [{"job_name": "prometheus", "static_configs": [{"targets": [listen]}]},
                           *scrape_configs(max(5, 2 * scrape_interval_s), directory)],
    }
