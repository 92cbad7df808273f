"""The validation suite as one file for a bare GPU machine: `invoke validate.bundle` writes build/gpuprov-smoke.pyz,
a zipapp (stdlib zipapp, `#!/usr/bin/env python3`) that runs with Python 3.9 or newer and no gpuprov, no PyYAML.

It holds the suite (gpuprov/smoke/*.py as the package `smoke`, what validate copies to hosts), its front end
(gpuprov/validation/standalone.py as `standalone.py`), a __main__.py that refuses a Python before 3.9 in words any
python can print, and catalog.json: for every GPU model of gpuprov/data/gpus.yaml the suite config the controller
sends (suite_config.build_config with the inventory's defaults) for 1 to MAX_GPUS GPUs with and without
NVSwitch, stored as the config of one GPU without NVSwitch and the blocks that differ per topology, with the
names and PCI ids that identify the model and the NVSwitch PCI ids.

The same inputs give the same bytes: entries in a fixed order, stored (not compressed: no zlib version in the
output) with a fixed date and mode; the JSON sorted.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipapp
import zipfile
from pathlib import Path

from gpuprov.core.errors import InputError

SUITE = Path(__file__).resolve().parents[1] / "smoke"
FRONT_END = Path(__file__).with_name("standalone.py")
DEFAULT_OUTPUT = Path("build/gpuprov-smoke.pyz")
INTERPRETER = "/usr/bin/env python3"
MAX_GPUS = 16
STAMP = (1980, 1, 1, 0, 0, 0)        # the earliest date a zip entry can hold
MODE = 0o644 << 16
# What the controller sets per host and per run, set by the front end (standalone.suite_config), not stored
HOST_KEYS = ("host", "level", "strict", "container", "gpus_visible", "burn_in_seconds")
# Any python3 can run this far: 2.7 to 3.8 are told in words, not with a SyntaxError from the front end
MAIN = b'''import sys
if sys.version_info < (3, 9):
    sys.stderr.write("gpuprov-smoke: Python %s is too old: the suite needs Python 3.9 or newer\\n"
                     % sys.version.split()[0])
    sys.exit(2)
from standalone import main
sys.exit(main())
'''


def _config(model: str | None, count: int, nvswitch: bool) -> dict:
    from gpuprov.inventory import Host
    from gpuprov.validation.suite_config import build_config, validate_vars

    hardware = {"count": count, "nvswitch": nvswitch, **({"gpu": model} if model else {})}
    host = Host(name="bundle", address="127.0.0.1", vars={"hardware": hardware})
    config = build_config(host, {}, None, validate_vars(host))
    return {key: value for key, value in config.items() if key not in HOST_KEYS}


def _entry(model: str | None) -> dict:
    """A model's config for one GPU without NVSwitch, and per other topology the values that differ from it."""
    base = _config(model, 1, False)
    topologies = {}
    for count in range(1, MAX_GPUS + 1):
        for nvswitch in (False, True):
            config = _config(model, count, nvswitch)
            blocks = {block: {key: value for key, value in config[block].items() if base[block].get(key) != value}
                      for block in ("expected", "expected_basis")}
            blocks = {block: values for block, values in blocks.items() if values}
            if blocks:
                topologies[f"{count}/{'nvswitch' if nvswitch else 'pcie'}"] = blocks
    return {"config": base, "topologies": topologies}


def catalog_payload() -> dict:
    """catalog.json: what the front end needs to write the controller's suite config on its own."""
    from gpuprov.catalog import FOURTH_GENERATION, models, nvswitch_generation
    from gpuprov.stack.data import table

    data = table("gpus")
    names: dict[str, str] = {}
    pci_ids: dict[str, str] = {}
    entries = {}
    for key, model in models().items():
        for name in (model.key, *model.names, *model.aliases):
            names.setdefault(name.casefold(), key)
        for pci_id in model.pci_ids:
            pci_ids.setdefault(pci_id, key)
        generation = nvswitch_generation(model.arch)
        entries[key] = {**_entry(key), "nvswitch_on_pci": generation is None or generation < FOURTH_GENERATION}
    source = Path(__file__).resolve().parents[1] / "data" / "gpus.yaml"
    return {"source": f"gpuprov/data/gpus.yaml sha256 {hashlib.sha256(source.read_bytes()).hexdigest()}",
            "max_gpus": MAX_GPUS, "names": names, "pci_ids": pci_ids,
            "nvswitch_pci_ids": sorted(str(k).lower() for k in data["nvswitch_pci_ids"]),
            "models": entries, "no_model": _entry(None)}


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, STAMP)
    info.external_attr = MODE
    info.create_system = 3    # unix, whatever builds it
    archive.writestr(info, data, compress_type=zipfile.ZIP_STORED)


def archive_bytes() -> bytes:
    """The zip archive (without the interpreter line): __main__.py, standalone.py, catalog.json, smoke/*.py."""
    files = sorted(p for p in SUITE.glob("*.py") if not p.name.startswith("."))   # the runner's module_names
    if not files:
        raise InputError(f"no suite files in {SUITE}", step="validate.bundle")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _add(archive, "__main__.py", MAIN)
        _add(archive, "standalone.py", FRONT_END.read_bytes())
        _add(archive, "catalog.json", json.dumps(catalog_payload(), indent=1, sort_keys=True).encode() + b"\n")
        for path in files:
            _add(archive, f"smoke/{path.name}", path.read_bytes())
    return buffer.getvalue()


def build(output: Path = DEFAULT_OUTPUT) -> Path:
    """Write the bundle to `output` (replaced atomically, mode 0755) and return its path."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial")
    zipapp.create_archive(io.BytesIO(archive_bytes()), partial, interpreter=INTERPRETER)
    os.chmod(partial, 0o755)
    os.replace(partial, output)
    return output
