"""Operation tests as data, as pyinfra's tests/operations/*/*.json are: tests/unit/operations/<operation>/<case>.json.

A case is a JSON object:
- "args": the operation's arguments (see OPERATIONS: the primitives' keyword arguments, or a component op's stack,
  repository and host variables);
- "facts": the host's facts the operation reads;
- "commands": every command the operation yields, in order, across its changes ([]: the host is in state);
- "changes" (optional): one object per change, each key compared with the change's (summary, reboot, disruptive,
  diff, component);
- "idempotent": true when the host, once the commands ran, needs nothing more: the runner feeds the operation the
  facts in which the change has happened (derived from the args for a primitive, the case's "after" for a
  component) and expects no change;
- "after" (optional): the facts the change leaves (merged into "facts", key by key), for a component op;
- "error" (optional, instead of "commands"): {"type": "InputError", "match": regex, and "host", "step", "hint" when
  the error must name them (hint: a regex)}.

The expected values are written out in the cases, never computed by the code under test.
"""

from __future__ import annotations

import builtins
import copy
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuprov.core import errors
from gpuprov.core.operations import (
    OpContext,
    RepoSpec,
    change_dict,
    file_change,
    install_change,
    package_change,
    service_change,
)
from gpuprov.core.packages import Package
from gpuprov.provision.ops import container_toolkit, dcgm, engine, fabricmanager, sources

FOLDER = Path(__file__).with_name("operations")
CASES = sorted(FOLDER.glob("*/*.json"))
KEYS = {"args", "facts", "commands", "changes", "idempotent", "after", "error", "description"}


def context(args: dict, facts: dict) -> OpContext:
    repo = RepoSpec(**args["repo"]) if "repo" in args else None
    return OpContext(host=args.get("host", "gpu01"), facts=facts, stack=args.get("stack") or {}, repo=repo,
                     lock_timeout=args.get("lock_timeout", 300), host_vars=args.get("host_vars") or {})


def merged(base: dict, patch: dict) -> dict:
    """`patch` laid over `base`, key by key (nested objects merged, anything else replaced)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# --- each operation: how it is built from args + facts, and the facts once its change happened ------------------

def build_file(args: dict, facts: dict) -> list:
    options = {key: tuple(value) if key == "then" else value for key, value in args.items()
               if key not in ("component", "path", "content", "what")}
    change = file_change(context(args, facts), args.get("component", "test"), args["path"], args["content"],
                         args.get("what", "test"), **options)
    return [change] if change else []


def settle_file(args: dict, facts: dict, case: dict) -> tuple[dict, dict]:
    return {**args, "always": False}, merged(facts, {"files": {args["path"]: args["content"]}})


def build_service(args: dict, facts: dict) -> list:
    options = {key: value for key, value in args.items() if key not in ("component", "unit")}
    change = service_change(args.get("component", "test"), args["unit"],
                            (facts.get("services") or {}).get(args["unit"]), **options)
    return [change] if change else []


def settle_service(args: dict, facts: dict, case: dict) -> tuple[dict, dict]:
    """The unit enabled and running (or stopped and disabled); the restart or reload it took is not asked again."""
    wanted = args.get("enabled", True)
    state = dict((facts.get("services") or {}).get(args["unit"]) or {})
    if wanted is not None:
        state.update(exists=True, enabled=wanted, active=wanted)
    elif args.get("restart"):
        state.update(active=True)
    return ({**args, "restart": False, "reload": False},
            merged(facts, {"services": {args["unit"]: state}}))


def build_package(args: dict, facts: dict) -> list:
    wanted = [Package(name, version) for name, version in args["wanted"].items()]
    options = {key: tuple(args[key]) for key in ("remove", "unhold", "first") if key in args}
    change = package_change(context(args, facts), args.get("component", "test"), wanted,
                            reboot=args.get("reboot", False), **options)
    return [change] if change else []


def settle_package(args: dict, facts: dict, case: dict) -> tuple[dict, dict]:
    packages = {name: version for name, version in (facts.get("packages") or {}).items()
                if name not in args.get("remove", ())}
    return args, {**facts, "packages": {**packages, **args["wanted"]}}


def build_install(args: dict, facts: dict) -> list:
    ctx = context(args, facts)
    change = install_change(args.get("component", "test"), ctx.pm, args["names"], facts.get("packages") or {},
                            args.get("why", ""))
    return [change] if change else []


def settle_install(args: dict, facts: dict, case: dict) -> tuple[dict, dict]:
    return args, merged(facts, {"packages": dict.fromkeys(args["names"], "installed")})


def component(module) -> Callable[[dict, dict], list]:
    return lambda args, facts: list(module.changes(context(args, facts)))


def docker(args: dict, facts: dict) -> list:
    return list(container_toolkit.docker_changes(context(args, facts)))


def settle_after(args: dict, facts: dict, case: dict) -> tuple[dict, dict]:
    return args, merged(facts, case.get("after") or {})


OPERATIONS: dict[str, tuple[Callable, Callable]] = {
    "file": (build_file, settle_file),
    "service": (build_service, settle_service),
    "package": (build_package, settle_package),
    "install": (build_install, settle_install),
    "sources": (component(sources), settle_after),
    "engine": (component(engine), settle_after),
    "dcgm": (component(dcgm), settle_after),
    "fabricmanager": (component(fabricmanager), settle_after),
    "docker": (docker, settle_after),
}


def load(path: Path) -> dict:
    case = json.loads(path.read_text())
    assert set(case) <= KEYS, f"{path}: unknown keys {sorted(set(case) - KEYS)}"
    assert ("error" in case) != ("commands" in case), f"{path}: a case expects either commands or an error"
    return case


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_operation_case(path):
    case = load(path)
    build, settle = OPERATIONS[path.parent.name]
    args, facts = case.get("args") or {}, case.get("facts") or {}
    if "error" in case:
        expected = case["error"]
        kind = getattr(errors, expected["type"], None) or getattr(builtins, expected["type"])
        with pytest.raises(kind, match=expected["match"]) as info:
            build(args, facts)
        for key in ("host", "step"):
            if key in expected:
                assert getattr(info.value, key) == expected[key]
        if "hint" in expected:
            assert re.search(expected["hint"], info.value.hint)
        return
    changes = build(args, facts)
    assert [command for change in changes for command in change.commands] == case["commands"]
    if "changes" in case:
        assert len(changes) == len(case["changes"])
        for change, wanted in zip(changes, case["changes"], strict=True):
            shown = change_dict(change)
            assert {key: shown[key] for key in wanted} == wanted
    if case.get("idempotent"):
        again_args, again_facts = settle(args, facts, case)
        assert build(again_args, again_facts) == [], "the operation changes a host already changed"


def test_every_operation_has_cases_and_every_folder_an_operation():
    folders = {path.name for path in FOLDER.iterdir() if path.is_dir()}
    assert folders == set(OPERATIONS)


def test_the_runner_fails_a_case_whose_commands_differ(tmp_path):
    """The runner judges: a case expecting other commands fails."""
    folder = tmp_path / "service"
    folder.mkdir()
    case = folder / "wrong.json"
    case.write_text(json.dumps({"args": {"unit": "x"}, "facts": {}, "commands": ["systemctl start x"]}))
    with pytest.raises(AssertionError):
        test_operation_case(case)
