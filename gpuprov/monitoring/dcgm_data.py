"""dcgm-exporter's releases and packaging (gpuprov/data/dcgm_exporter.yaml): the exporter paired with an
installed DCGM, its container tag and NVIDIA's package, unit and binary."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from gpuprov.core.errors import GpuprovError
from gpuprov.core.packages import Package

DCGM_PACKAGE = "datacenter-gpu-manager-4-core"


@dataclass(frozen=True)
class ExporterRelease:
    """The dcgm-exporter release paired with one DCGM release."""

    dcgm: str
    exporter: str
    image_tag: str
    package: str
    package_release: str
    unit: str
    binary: str
    image_digest: str | None = None     # a confirmed digest of image_tag (data/dcgm_exporter.yaml), else None

    def package_for(self, family: str) -> Package:
        """NVIDIA's package at this release (no epoch; `-1` release) for apt or dnf."""
        return Package(self.package, f"{self.exporter}-{self.package_release}")

    @property
    def dropin(self) -> str:
        """gpuprov's systemd drop-in for NVIDIA's unit (which takes no arguments from an environment file)."""
        return f"/etc/systemd/system/{self.unit}.service.d/gpuprov.conf"


@cache
def _data() -> dict:
    return yaml.safe_load(resources.files("gpuprov.data").joinpath("dcgm_exporter.yaml").read_text())


def releases() -> list[ExporterRelease]:
    data = _data()
    return [ExporterRelease(dcgm, entry["exporter"], entry["image_tag"], data["package"], data["package_release"],
                            data["unit"].removesuffix(".service"), data["binary"],
                            _confirmed_digest(data["image_digests"].get(entry["image_tag"])))
            for dcgm, entry in data["releases"].items()]


def _confirmed_digest(entry: dict | None) -> str | None:
    """A digest the data records as confirmed from NVIDIA's own sources; an unconfirmed one is never used."""
    return entry["digest"] if entry and entry.get("status") == "confirmed" else None


def release_for(dcgm: str, host: str) -> ExporterRelease:
    """The exporter paired with the installed DCGM; an error naming the releases gpuprov knows otherwise."""
    for release in releases():
        if release.dcgm == dcgm:
            return release
    known = ", ".join(r.dcgm for r in releases())
    raise GpuprovError(f"gpuprov knows no dcgm-exporter paired with DCGM {dcgm} (it knows DCGM {known})",
                       host=host, step="dcgm-exporter",
                       hint="provision the host's stack (invoke provision), or add the pair to "
                            "gpuprov/data/dcgm_exporter.yaml from NVIDIA's dcgm-exporter releases")
