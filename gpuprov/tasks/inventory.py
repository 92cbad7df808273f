"""`invoke inventory.check` and `invoke inventory.show`: validate an inventory, show one host. An inventory with a
`slurm:` source is read whole, Slurm's nodes included (sinfo --json on its controller, once the file is valid)."""

from __future__ import annotations

import json
import sys

from invoke.exceptions import Exit

from gpuprov.core.config import path_setting
from gpuprov.core.errors import InputError, literal
from gpuprov.tasks._common import HOST_HELP, OUTPUT_HELP, exits_cleanly, read_inventory, task


def _inventory_path(c, inventory: str | None):
    if inventory is not None and not str(inventory).strip():
        raise InputError("--inventory needs the path of an inventory file, not ''", step="inventory")
    return inventory or path_setting(c, "inventory")


@task(help={"inventory": HOST_HELP["inventory"], "inventory_plugin": OUTPUT_HELP["inventory_plugin"]})
@exits_cleanly
def check(c, inventory=None, inventory_plugin=None):
    """Validate an inventory: every error as FILE:LINE:COL: key: message, exit 2 on any.

    With a slurm: source, then read Slurm's nodes on its controller (exit 1, naming it, when it cannot be read)."""
    from gpuprov.inventory import InventoryError

    path = _inventory_path(c, inventory)
    shown = literal(str(path))
    try:
        inv = read_inventory(c, path, inventory_plugin)
    except InventoryError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print(f"{len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''} in {shown}", file=sys.stderr)
        raise Exit(code=2) from None
    for warning in inv.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    hosts, groups = len(inv.hosts), len(inv.groups)
    print(f"{shown}: ok ({inv.format} format): {hosts} host{'s' if hosts != 1 else ''}, "
          f"{groups} group{'s' if groups != 1 else ''}")
    print(f"hosts: {', '.join(inv.hosts)}")
    if inv.groups:
        print(f"groups: {', '.join(inv.groups)}")


@task(help={"host": "host name from the inventory", "inventory": HOST_HELP["inventory"],
            "inventory_plugin": OUTPUT_HELP["inventory_plugin"], "json": "print the host as JSON"})
@exits_cleanly
def show(c, host, inventory=None, json_=False, inventory_plugin=None):
    """Show one host: connection settings and merged variables, with where each came from."""
    from gpuprov.core.json_text import dump_json

    inv = read_inventory(c, _inventory_path(c, inventory), inventory_plugin)
    entry = inv.host(host)
    data = entry.to_dict()
    jump = inv.jump_host(entry)
    data["jump_via"] = None if jump is None else {"name": jump.name, "address": jump.address,
                                                  "port": jump.port, "user": jump.user}
    data["inventory"] = str(inv.path)
    if json_:
        print(dump_json(data, sort_keys=True))
        return
    _print_host(data)


def _print_host(data: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    from gpuprov.core.errors import mask_credentials
    from gpuprov.core.report import console

    def cell(value) -> Text:
        """A table cell printed literally: no markup, control characters escaped, credentials masked."""
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        return Text(literal(mask_credentials(text)))

    setting_sources = data["setting_sources"]
    connection = Table(title=cell(f"{data['name']} ({data['inventory']})"), title_justify="left")
    for column in ("setting", "value", "from"):
        connection.add_column(column, overflow="fold")
    for key in ("address", "port", "user", "identity_file", "jump"):
        value = data[key]
        if key == "jump" and data["jump_via"] and data["jump_via"]["name"] != value:
            via = data["jump_via"]
            value = f"{value} ({via['user']}@{via['address']}:{via['port']})"
        source = setting_sources.get(key, "built-in")
        connection.add_row(key, cell("-" if value is None else value), cell(source))
    sudo = data["sudo"]
    if data["user"] == "root":
        sudo_text = "not needed (root)"
    elif sudo["nopasswd"]:
        sudo_text = "passwordless"
    elif sudo["password_env"]:
        sudo_text = f"password from ${sudo['password_env']}"
    else:
        sudo_text = "not set"
    connection.add_row("sudo", cell(sudo_text), cell(setting_sources.get("sudo", "built-in")))
    connection.add_row("groups", cell(", ".join(data["groups"]) or "-"), cell(""))

    variables = Table(title="variables", title_justify="left")
    for column in ("variable", "value", "from"):
        variables.add_column(column, overflow="fold")
    for key, value in data["vars"].items():
        variables.add_row(cell(key), cell(value), cell(data["sources"][key]))

    out = console()
    out.print(connection)
    out.print(variables)
