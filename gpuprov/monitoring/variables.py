"""The monitoring variables `invoke monitoring.*` reads, declared once (gpuprov.inventory.variables) and checked
at load; gpuprov.monitoring.policy reads them (and validate.textfile_dir, validation's) with their defaults.

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

from gpuprov.inventory.variables import Spec, declare

DCGM_EXPORTER_MODES = ("auto", "container", "service", "none")
# an image repository: registry host[:port]/path, lower-case path components (the OCI distribution spec's names)
IMAGE_REPOSITORY = re.compile(r"[a-z0-9.-]+(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)+")
# systemd.time(7) calendar events: names (weekly, Mon), numbers, '*', ranges and lists; no shell characters, no
# space at either end
CALENDAR = re.compile(r"(?! )[A-Za-z0-9*:.,/~ -]{1,64}(?<! )")
CURRENCY = re.compile(r"[A-Z]{3}")
# the OCI distribution spec's tag grammar
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")

VARIABLES = declare(
    "monitoring",
    Spec("monitoring_address", "address", "where Prometheus reaches the host (default: its address)",
         message="bad monitoring_address {value}: give the IP address (no IPv6 zone) or DNS name Prometheus "
                 "reaches this host at"),
    Spec("monitoring", "mapping", "how the host is monitored"),
    Spec("monitoring.dcgm_exporter", "choice", "how dcgm-exporter runs (auto: a container where Docker runs, "
         "else the package's service)", choices=DCGM_EXPORTER_MODES,
         message="bad dcgm_exporter {value}: give " + ", ".join(DCGM_EXPORTER_MODES)),
    Spec("monitoring.dcgm_exporter_image", "pattern", "the dcgm-exporter image repository, without a tag",
         pattern=IMAGE_REPOSITORY,
         message="bad image repository {value}: give REGISTRY/PATH without a tag, like "
                 "nvcr.io/nvidia/k8s/dcgm-exporter (the tag comes from the installed DCGM)"),
    Spec("monitoring.dcgm_exporter_digests", "image_digests", "image tag -> its sha256 digest (run by digest only)",
         pattern=IMAGE_TAG,
         message="bad dcgm_exporter_digests {value}: give a mapping of image tag to its digest, like "
                 "{{4.4.1-4.6.0-ubuntu22.04: sha256:<64 hex digits>}}"),
    Spec("monitoring.drift_interval_min", "integer", "minutes between drift reports (GpuprovDriftStale: 20)",
         low=1, high=15),
    Spec("monitoring.validate_schedule", "pattern", "systemd OnCalendar of the idle-GPU validation, or never",
         pattern=CALENDAR,
         message="bad validate_schedule {value}: give a systemd OnCalendar expression such as weekly or "
                 "'Sun *-*-* 03:00', or never"),
    Spec("monitoring.scrape_interval_s", "integer", "seconds between scrapes (on the Prometheus host)",
         low=1, high=3600),
    Spec("cost", "mapping", "what the host costs (targets label, idle cost)"),
    Spec("cost.per_hour", "number", "the host's cost per hour", required=True, low=0, high=1e6,
         message="bad per_hour {value}: give what the host costs per hour as a number >= 0"),
    Spec("cost.currency", "pattern", "an ISO 4217 code (default USD)", pattern=CURRENCY,
         message="bad currency {value}: give an ISO 4217 code such as USD or EUR"),
)
