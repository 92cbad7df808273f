"""The health tier's fault codes and repair actions (gpuprov/data/health_codes.yaml), and the single-file
`gpuprov-health` program with that table inlined as JSON, as it is copied to hosts (they need no PyYAML)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from gpuprov.core.errors import InputError

DATA = "health_codes.yaml"
MARKER = "CODES: dict = {}  # gpuprov:codes (filled in by gpuprov.health.codes.render_program)"
SEVERITIES = ("fatal", "warn")


def _check_entry(name: str, entry: object, actions: list[str]) -> dict:
    """One code's entry, checked: its action among `actions`, a known severity."""
    if not isinstance(entry, dict):
        raise InputError(f"{DATA}: {name}: expected a mapping")
    if entry.get("action") not in actions:
        raise InputError(f"{DATA}: {name}: action {entry.get('action')!r} is not one of {', '.join(actions)}")
    if entry.get("severity") not in SEVERITIES:
        raise InputError(f"{DATA}: {name}: severity {entry.get('severity')!r} is not one of {', '.join(SEVERITIES)}")
    if not isinstance(entry.get("confirmed"), bool):
        raise InputError(f"{DATA}: {name}: confirmed must be true or false")
    return entry


@cache
def table() -> dict:
    """{"codes": {CODE: entry}, "xids": {"<n>": entry}} from the YAML, every entry checked."""
    data = yaml.safe_load(resources.files("gpuprov.data").joinpath(DATA).read_text())
    actions = data["actions"]
    codes = {name: _check_entry(name, entry, actions) for name, entry in data["codes"].items()}
    xids = {str(int(n)): _check_entry(f"xids.{n}", entry, actions) for n, entry in data["xids"].items()}
    return {"codes": codes, "xids": xids}


def host_table() -> dict:
    """What the host program needs of each entry: action, severity and the short text."""
    full = table()
    keep = ("action", "severity", "text")
    return {part: {name: {k: v for k, v in entry.items() if k in keep} for name, entry in full[part].items()}
            for part in ("codes", "xids")}


def render_program() -> str:
    """check.py with the code table inlined: the file deployed as /usr/local/sbin/gpuprov-health."""
    source = resources.files("gpuprov.health").joinpath("check.py").read_text()
    if source.count(MARKER) != 1:
        raise InputError("gpuprov/health/check.py: the CODES marker line must appear exactly once")
    inlined = f"CODES: dict = json.loads({json.dumps(json.dumps(host_table(), sort_keys=True))})"
    return source.replace(MARKER, inlined)


def write_program(path: Path) -> Path:
    """Write the rendered program, executable."""
    path.write_text(render_program())
    path.chmod(0o755)
    return path
