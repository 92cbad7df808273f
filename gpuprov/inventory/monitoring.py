"""The monitoring variables `invoke monitoring.*` reads, checked where they are written like the other validated
variables (`schema.VariableSchema` mixes this in).

    monitoring_address: 10.20.0.11     # where Prometheus reaches the host (default: its inventory address);
                                       # the exporters listen on this address only
    monitoring:
      dcgm_exporter: auto              # auto (where DCGM is installed: a container where Docker runs, else the
                                       # package's service) | container | service | none
      dcgm_exporter_image: nvcr.io/nvidia/k8s/dcgm-exporter   # the repository (a registry mirror of NVIDIA's)
      dcgm_exporter_digests:           # the container is pulled and run by digest only: image tag -> its digest
        4.4.1-4.6.0-ubuntu22.04: sha256:<64 hex digits>   # (the tag paired with the host's DCGM, see the plan)
      drift_interval_min: 5            # how often the drift timer writes its metrics (1-15: GpuprovDriftStale
                                       # fires after 20 minutes without a report)
      validate_schedule: weekly        # systemd OnCalendar of the idle-GPU validation, or never
      scrape_interval_s: 15            # on the Prometheus host: how often it scrapes and evaluates the rules
    cost: {per_hour: 98.32, currency: USD}   # what the host costs per hour (targets label, idle cost)
"""

from __future__ import annotations

import re
from typing import Any

from gpuprov.inventory.diagnostics import show, suggest
from gpuprov.inventory.levels import INVALID
from gpuprov.inventory.located import Located
from gpuprov.inventory.model import is_valid_address

DCGM_EXPORTER_MODES = ("auto", "container", "service", "none")
# an image repository: registry host[:port]/path, lower-case path components (the OCI distribution spec's names)
IMAGE_REPOSITORY = re.compile(r"[a-z0-9.-]+(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)+")
# systemd.time(7) calendar events: names (weekly, Mon), numbers, '*', ranges and lists; no shell characters
CALENDAR = re.compile(r"[A-Za-z0-9*:.,/~ -]{1,64}")
CURRENCY = re.compile(r"[A-Z]{3}")
# the OCI distribution spec's tag grammar, and a sha256 image digest
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class MonitoringVariables:
    """Checks of the monitoring variables; mixed into VariableSchema (uses its doc and struct, and `bounded` of
    HardeningVariables)."""

    doc: Located

    def monitoring_checker(self, key: str):
        return {"monitoring_address": self.monitoring_address, "monitoring": self.monitoring,
                "cost": self.cost}.get(key)

    def monitoring_address(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and is_valid_address(value, zone=False):
            return value
        self.doc.error(path, f"bad monitoring_address {show(value)}: give the IP address (no IPv6 zone) or DNS "
                             "name Prometheus reaches this host at")
        return INVALID

    def monitoring(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "monitoring", {
            "dcgm_exporter": self.dcgm_exporter_mode, "dcgm_exporter_image": self.image_repository,
            "dcgm_exporter_digests": self.image_digests,
            "drift_interval_min": self.bounded(1, 15), "validate_schedule": self.calendar,
            "scrape_interval_s": self.bounded(1, 3600),
        })

    def cost(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "cost", {"per_hour": self.price, "currency": self.currency},
                           required=("per_hour",))

    def dcgm_exporter_mode(self, value: Any, path: tuple) -> Any:
        if value in DCGM_EXPORTER_MODES:
            return value
        self.doc.error(path, f"bad dcgm_exporter {show(value)}: give {', '.join(DCGM_EXPORTER_MODES)}"
                             f"{suggest(value, DCGM_EXPORTER_MODES)}")
        return INVALID

    def image_repository(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and IMAGE_REPOSITORY.fullmatch(value):
            return value
        self.doc.error(path, f"bad image repository {show(value)}: give REGISTRY/PATH without a tag, like "
                             "nvcr.io/nvidia/k8s/dcgm-exporter (the tag comes from the installed DCGM)")
        return INVALID

    def image_digests(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, dict):
            self.doc.error(path, f"bad dcgm_exporter_digests {show(value)}: give a mapping of image tag to its "
                                 "digest, like {4.4.1-4.6.0-ubuntu22.04: sha256:<64 hex digits>}")
            return INVALID
        ok = True
        for tag, digest in value.items():
            if not (isinstance(tag, str) and IMAGE_TAG.fullmatch(tag)):
                self.doc.error((*path, tag), f"bad image tag {show(tag)}: give the dcgm-exporter tag the plan names, "
                                             "like 4.4.1-4.6.0-ubuntu22.04")
                ok = False
            elif not (isinstance(digest, str) and IMAGE_DIGEST.fullmatch(digest)):
                self.doc.error((*path, tag), f"bad image digest {show(digest)}: give sha256: and 64 lower-case hex "
                                             "digits (docker buildx imagetools inspect IMAGE:TAG shows it)")
                ok = False
        return dict(value) if ok else INVALID

    def calendar(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and CALENDAR.fullmatch(value) and value.strip() == value:
            return value
        self.doc.error(path, f"bad validate_schedule {show(value)}: give a systemd OnCalendar expression such as "
                             "weekly or 'Sun *-*-* 03:00', or never")
        return INVALID

    def price(self, value: Any, path: tuple) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e6 and value == value:
            return float(value)
        self.doc.error(path, f"bad per_hour {show(value)}: give what the host costs per hour as a number >= 0")
        return INVALID

    def currency(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and CURRENCY.fullmatch(value):
            return value
        self.doc.error(path, f"bad currency {show(value)}: give an ISO 4217 code such as USD or EUR")
        return INVALID
