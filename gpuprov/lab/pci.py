#!/usr/bin/python3
"""Simulated PCI devices of a lab host: rendering in real `lspci` formats.

This module is also the lab hosts' stand-in `lspci` (copied into the host image as
/usr/bin/lspci), so it uses the standard library only. At run time it reads the devices the
host's profile gives from /etc/gpuprov-lab/devices.json, written when the container is created.
Supported options: -n, -nn, -D, -d [vendor]:[device][:class]; any other option is refused.
"""

from __future__ import annotations

import json
import sys

DEVICES_FILE = "/etc/gpuprov-lab/devices.json"


def _slot_key(device: dict) -> tuple:
    domain, bus, rest = device["slot"].split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def render_line(device: dict, numeric: int = 0, domains: bool = False) -> str:
    """One `lspci` line; numeric 0 = names, 1 = `-n`, 2 = `-nn`."""
    slot = device["slot"]
    if not domains and slot.startswith("0000:"):
        slot = slot[5:]
    rev = f" (rev {device['rev']})" if device.get("rev") else ""
    if numeric == 1:
        return f"{slot} {device['class']}: {device['vendor']}:{device['device']}{rev}"
    if numeric >= 2:
        return (f"{slot} {device['class_name']} [{device['class']}]: {device['vendor_name']} "
                f"{device['name']} [{device['vendor']}:{device['device']}]{rev}")
    return f"{slot} {device['class_name']}: {device['vendor_name']} {device['name']}{rev}"


def matches(device: dict, selector: str) -> bool:
    """`-d [vendor]:[device][:class]` filter; empty parts match anything."""
    parts = selector.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"-d: invalid ID selector {selector!r}, expected [<vendor>]:[<device>][:<class>]")
    wanted = dict(zip(("vendor", "device", "class"), parts))
    return all(not value or device[key].lower() == value.lower().zfill(4)
               for key, value in wanted.items())


def render(devices: list[dict], numeric: int = 0, domains: bool = False, selector: str | None = None) -> str:
    """The whole listing, sorted by slot as `lspci` sorts it."""
    chosen = [d for d in devices if selector is None or matches(d, selector)]
    lines = [render_line(d, numeric, domains) for d in sorted(chosen, key=_slot_key)]
    return "".join(line + "\n" for line in lines)


def parse_args(argv: list[str]) -> dict:
    """Parse lspci options (combined short flags allowed: `-Dnn`, `-d10de:`)."""
    opts = {"numeric": 0, "domains": False, "selector": None}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg == "-":
            raise ValueError(f"unexpected argument {arg!r}")
        flags = arg[1:]
        while flags:
            flag, flags = flags[0], flags[1:]
            if flag == "n":
                opts["numeric"] += 1
            elif flag == "D":
                opts["domains"] = True
            elif flag == "d":
                if not flags and not args:
                    raise ValueError("option -d needs an argument")
                opts["selector"] = flags or args.pop(0)
                flags = ""
            else:
                raise ValueError(f"option -{flag} is not simulated by the gpuprov lab's lspci stand-in")
    return opts


def main(argv: list[str]) -> int:
    try:
        opts = parse_args(argv)
        if opts["selector"] is not None:
            matches({"vendor": "0000", "device": "0000", "class": "0000"}, opts["selector"])
    except ValueError as exc:
        print(f"lspci: {exc}", file=sys.stderr)
        return 2
    try:
        with open(DEVICES_FILE, encoding="utf-8") as handle:
            devices = json.load(handle)
    except OSError as exc:
        print(f"lspci: cannot read the lab host's devices ({exc})", file=sys.stderr)
        return 1
    sys.stdout.write(render(devices, **opts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
