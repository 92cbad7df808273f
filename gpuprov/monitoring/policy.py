"""A host's monitoring settings: its inventory variables (declared by gpuprov.monitoring.variables and checked when
the inventory is loaded) with their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400
PROMETHEUS_PORT = 9090
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"     # Debian's prometheus-node-exporter default
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"
EXPORTER_PORTS = {"node-exporter": NODE_EXPORTER_PORT, "dcgm-exporter": DCGM_EXPORTER_PORT}


@dataclass(frozen=True)
class MonitoringPolicy:
    """What monitoring makes of one host."""

    host: str
    address: str                      # where Prometheus reaches the host; the exporters listen here
    dcgm_exporter: str = "auto"       # auto | container | service | none
    dcgm_exporter_image: str = DCGM_EXPORTER_IMAGE
    dcgm_exporter_digests: dict[str, str] = field(default_factory=dict)   # image tag -> sha256:..., the pins
    drift_interval_min: int = 5
    validate_schedule: str = "weekly"
    scrape_interval_s: int = 15
    gpu_count: int = 0                # the inventory's hardware.count
    textfile_dir: str = TEXTFILE_DIR  # node_exporter's textfile folder (validate.textfile_dir, as validate writes)
    cost_per_hour: float | None = None
    currency: str = "USD"

    @property
    def expects_dcgm_exporter(self) -> bool:
        """Whether Prometheus should find a dcgm-exporter here: a mode that names one, or `auto` on a host the
        inventory gives GPUs (hardware.count; deploy runs it where DCGM is installed)."""
        return self.dcgm_exporter in ("container", "service") or (self.dcgm_exporter == "auto" and self.gpu_count > 0)

    @property
    def node_exporter_listen(self) -> str:
        return f"{_bracketed(self.address)}:{NODE_EXPORTER_PORT}"

    @property
    def dcgm_exporter_listen(self) -> str:
        return f"{_bracketed(self.address)}:{DCGM_EXPORTER_PORT}"

    @property
    def prometheus_listen(self) -> str:
        """Where Prometheus listens on a monitoring host (its monitoring address only, never every interface)."""
        return f"{_bracketed(self.address)}:{PROMETHEUS_PORT}"


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def build_policy(host) -> MonitoringPolicy:
    """The policy of an inventory host (gpuprov.inventory.model.Host) from its merged, checked variables."""
    variables = host.vars
    settings = variables.get("monitoring") or {}
    cost = variables.get("cost") or {}
    return MonitoringPolicy(
        host=host.name,
        address=variables.get("monitoring_address") or host.address,
        gpu_count=(variables.get("hardware") or {}).get("count") or 0,
        textfile_dir=(variables.get("validate") or {}).get("textfile_dir") or TEXTFILE_DIR,
        cost_per_hour=cost.get("per_hour"),
        currency=cost.get("currency", "USD"),
        **{key: value for key, value in settings.items() if key in _SETTINGS},
    )


_SETTINGS = ("dcgm_exporter", "dcgm_exporter_image", "dcgm_exporter_digests", "drift_interval_min", "validate_schedule",
             "scrape_interval_s")
