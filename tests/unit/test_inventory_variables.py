"""The variable registry (gpuprov.inventory.variables): every variable a capability reads is declared once and
checked once, at load, where it is written (`FILE:LINE:COL: key: message`); the readers (validate_vars, run_vars,
the monitoring and harden policies) only read what the loader accepted. And the one checker of each kind of value
(gpuprov.inventory.checks) on open-ended input."""

from __future__ import annotations

import ast
import dataclasses
import math
import textwrap
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpuprov.inventory import Host, InventoryError, checks, load_inventory
from gpuprov.inventory.schema import KINDS, VariableSchema
from gpuprov.inventory.variables import CAPABILITIES, NO_DEFAULT, registry, spec

PACKAGE = Path(__file__).resolve().parents[2] / "gpuprov"


def load_errors(tmp_path: Path, text: str) -> tuple[Path, list[str]]:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.exit_code == 2
    return path, caught.value.errors


def one_variable(tmp_path: Path, line: str) -> tuple[Path, list[str]]:
    """The errors of an inventory whose host gpu01 has one variable line (on line 5, indented 6)."""
    return load_errors(tmp_path, f"hosts:\n  gpu01:\n    address: 192.0.2.1\n    vars:\n      {line}\n")


# ------------------------------------------------------------------------------------------------ the registry

def test_each_variable_is_declared_once_by_one_capability_with_a_kind_that_has_a_checker():
    specs = registry()
    assert {item.owner for item in specs.values()} == {"provision", "harden", "monitoring", "validation", "images",
                                                     "rollout"}
    assert len(CAPABILITIES) == 6
    for name, item in specs.items():
        assert item.name == name and item.kind in KINDS and item.description, name
        assert hasattr(VariableSchema, KINDS[item.kind]), item.kind
        if item.parent:
            assert specs[item.parent].kind in ("mapping", "list"), name


def test_a_list_item_or_a_free_key_matches_its_star_spec():
    assert spec("firewall.allow.3.port").name == "firewall.allow.*.port"
    assert spec("validate.threshold_pct").owner == "validation"
    assert spec("images.registry").owner == "images"
    assert spec("validate.nope") is None and spec("nope") is None


def _vars_reads(tree: ast.AST) -> list[tuple[str, int]]:
    """Each dotted variable a module reads: `host.var("a.b")`, `X.vars.get("a")`, `X.vars["a"]`, a parameter named
    `variables` (the merged variables) and chains of them (`(host.vars.get("a") or {}).get("b")`), also through a
    name assigned one of these in the same function."""
    found = []
    for scope in ast.walk(tree):
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            found += _function_reads(scope)
    return found


def _function_reads(scope: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, int]]:
    found = []
    roots = {arg.arg: "" for arg in scope.args.args if arg.arg == "variables"}

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and node.attr == "vars":
            return ""
        if isinstance(node, ast.Name):
            return roots.get(node.id)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            return dotted(node.values[0])
        key, base = None, None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant):
            key, base = node.args[0].value, node.func.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key, base = node.slice.value, node.value
        prefix = dotted(base) if isinstance(key, str) else None
        return None if prefix is None else f"{prefix}.{key}".lstrip(".")

    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted(node.value)
            if value is not None:
                roots[node.targets[0].id] = value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "var" \
                and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.args[0].value, node.lineno))
        if isinstance(node, ast.Call | ast.Subscript):
            name = dotted(node)
            if name:
                found.append((name, node.lineno))
    return found


def test_the_scan_finds_every_shape_of_read():
    source = textwrap.dedent("""\
        def f(host, variables):
            raw = host.vars.get("images") or {}
            raw.get("registry")
            (variables.get("monitoring") or {}).get("dcgm_exporter")
            host.var("stack.cuda")
            host.vars["workload"]
            facts.get("not_a_variable")
        """)
    assert sorted(name for name, _ in _vars_reads(ast.parse(source))) == [
        "images", "images.registry", "monitoring", "monitoring.dcgm_exporter", "stack.cuda", "workload"]


def test_every_variable_a_capability_reads_is_declared():
    """An AST scan of every module outside the loader (and the lab, which writes inventories): a variable read
    that no capability declares would never be checked, so it cannot slip in."""
    undeclared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if {"inventory", "lab"} & set(path.relative_to(PACKAGE).parts):
            continue
        for name, line in _vars_reads(ast.parse(path.read_text())):
            if spec(name) is None:
                undeclared.append(f"{path.relative_to(PACKAGE)}:{line}: {name}")
    assert undeclared == []


def test_the_readers_fields_are_declared_variables():
    """validate_vars and the monitoring policy read their mappings whole (`**values`): each field they fill is a
    declared key."""
    from gpuprov.images.run import RunVars
    from gpuprov.monitoring.policy import _SETTINGS
    from gpuprov.validation.suite_config import ValidateVars

    own = {"workload", "data_dir", "cluster_address", "sources"}
    validate = [f.name for f in dataclasses.fields(ValidateVars) if f.name not in own]
    assert validate and [name for name in validate if spec(f"validate.{name}") is None] == []
    images = [f.name for f in dataclasses.fields(RunVars) if f.name != "data_dir"]
    assert images and [name for name in images if spec(f"images.{name}") is None] == []
    assert [key for key in _SETTINGS if spec(f"monitoring.{key}") is None] == []


def test_the_loader_fills_in_only_the_defaults_the_port_rules_rely_on():
    filled = {name: item.default for name, item in registry().items() if item.default is not NO_DEFAULT}
    assert filled == {"service_ports.*.proto": "tcp", "service_ports.*.sources": None,
                      "firewall.allow.*.proto": "tcp"}


# ----------------------------------------------------------------------------- checked once, at load, located

@pytest.mark.parametrize(("line", "key", "marker", "message"), [
    ("workload: gaming", "workload", "gaming", "must be one of llm-finetune, cv, recsys, inference, not 'gaming'"),
    ("data_dir: rel/data", "data_dir", "rel", "must be an absolute path other than / (letters, digits, _ . + @ / -), "
                                           "not 'rel/data'"),
    ("data_dir: /", "data_dir", "/", "must be an absolute path other than /"),
    ("cluster_address: 10.0.0.1; reboot", "cluster_address", "10.0", "must be an IP address or host name (with no "
                                                                     "IPv6 zone: other hosts reach it)"),
    ("cluster_address: 'fe80::1%eth0'", "cluster_address", "'fe80", "must be an IP address or host name (with no "
                                                                    "IPv6 zone"),
    ("validate: {outlier: 5}", "validate.outlier", "outlier", "unknown validate key 'outlier' (did you mean "
                                                              "'outlier_pct'?)"),
    ("validate: [80]", "validate", "[80]", "validate must be a mapping, not a list"),
    ("validate: {threshold_pct: 120}", "validate.threshold_pct", "120", "must be a number above 0 and at most 100, "
                                                                        "not 120"),
    ("validate: {threshold_pct: {H1000: 80}}", "validate.threshold_pct.H1000", "80", "unknown GPU model 'H1000'"),
    ("validate: {threshold_pct: {H100-SXM: .nan}}", "validate.threshold_pct.H100-SXM", ".nan",
     "(NaN and infinity are not numbers here)"),
    ("validate: {textfile_dir: /var/lib/../etc}", "validate.textfile_dir", "/var", "must be an absolute path "
                                                                                   "(letters, digits, _ . + @ / -)"),
    ("validate: {textfile_dir: /tmp/prom}", "validate.textfile_dir", "/tmp", "/tmp/prom is under /tmp, which every "
     "user may write into; give a folder only root writes, like /var/lib/prometheus/node-exporter"),
    ("validate: {torch_wheel: cuda12}", "validate.torch_wheel", "cuda12", "must be cpu or a CUDA variant like cu128"),
    ("validate: {torch_version: two}", "validate.torch_version", "two", "must be a release like \"2.7\" or latest"),
    ("validate: {torch_index: 'ftp://x'}", "validate.torch_index", "'ftp", "must be an http:// or https:// URL, "
                                                                          "or \"\", not 'ftp://x'"),
    ("validate: {rdzv_port: 80}", "validate.rdzv_port", "80", "bad port 80: give an integer from 1024 to 65535"),
    ("validate: {image: 'img; rm -rf /'}", "validate.image", "'img", "must be an image reference like repo/name:tag"),
    ("validate: {sizing: {cores: 8}}", "validate.sizing.cores", "cores", "unknown sizing key 'cores'"),
    ("validate: {dcgm_level: 5}", "validate.dcgm_level", "5", "must be 1, 2, 3 or 4 (dcgmi diag -r), not 5"),
    ("validate: {dcgm_level: true}", "validate.dcgm_level", "true", "must be 1, 2, 3 or 4 (dcgmi diag -r), not True"),
    ("validate: {image_ulimits: [memlock]}", "validate.image_ulimits", "[memlock]", "must be a mapping of ulimit "
                                                                                    "names"),
    ("validate: {image_ulimits: {memlock: unlimited}}", "validate.image_ulimits.memlock", "unlimited",
     "must be a whole number (-1: unlimited) or null"),
    ("validate: {nccl_tests: all_reduce_perf}", "validate.nccl_tests", "all_reduce", "must be an absolute path"),
    ("validate: {burn_in_seconds: 1.0e+300}", "validate.burn_in_seconds", "1.0e", "must be a number at least 1 and "
                                                                                "at most 31622400"),
])
def test_a_bad_validation_variable_is_refused_at_load_where_it_is_written(tmp_path, line, key, marker, message):
    path, errors = one_variable(tmp_path, line)
    col = 7 + line.index(marker)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{path}:5:{col}: hosts.gpu01.vars.{key}: "), errors
    assert message in errors[0]


def test_the_validation_variables_are_read_as_the_loader_left_them(tmp_path):
    from gpuprov.validation.suite_config import validate_vars

    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu01:\n    address: 'fe80::1%eth0'\n    vars:\n      data_dir: /data/\n"
                    "      validate: {threshold_pct: {H100-SXM: 85, default: 70}, outlier_pct: 5, torch_version: 2.10,"
                    " textfile_dir: /srv/prom/, sizing: {cpu_cores_per_gpu: 8}, image: null, rdzv_port: 29500}\n")
    settings = validate_vars(load_inventory(path).host("gpu01"))
    assert settings.threshold_pct == {"H100-SXM": 85.0, "default": 70.0} and settings.threshold_for("L40S") == 70.0
    assert (settings.outlier_pct, settings.torch_version, settings.textfile_dir) == (5.0, "2.10", "/srv/prom")
    assert (settings.data_dir, settings.sizing, settings.image, settings.rdzv_port) == (
        "/data", {"cpu_cores_per_gpu": 8.0}, None, 29500)
    assert settings.cluster_address == "fe80::1%eth0"       # the SSH address, with its interface, by default


def test_the_readers_are_views_that_check_nothing():
    """A Host built by hand (not loaded) is read as it is: the checks are the loader's, once."""
    from gpuprov.images.run import run_vars
    from gpuprov.monitoring.policy import build_policy
    from gpuprov.validation.suite_config import validate_vars

    host = Host(name="h", address="10.0.0.1", vars={"validate": {"outlier_pct": 7, "textfile_dir": "/srv/t"},
                                                    "images": {"memlock": None, "shm_size": "1g"}})
    assert validate_vars(host).outlier_pct == 7.0 and build_policy(host).textfile_dir == "/srv/t"
    assert (run_vars(host).memlock, run_vars(host).shm_size) == (None, "1g")
    assert run_vars(Host(name="h", address="10.0.0.1")).memlock == -1
    assert build_policy(Host(name="h", address="10.0.0.1")).textfile_dir == "/var/lib/prometheus/node-exporter"


def test_every_problem_of_every_capability_is_told_at_once(tmp_path):
    path, errors = load_errors(tmp_path, """\
        groups:
          g:
            vars:
              images: {memlock: 0}
              monitoring: {drift_interval_min: 99}
        hosts:
          gpu01:
            address: 192.0.2.1
            groups: [g]
            vars: {validate: {outlier_pct: -1}, service_ports: [{name: x, port: 0}]}
        """)
    assert [error.split(": ", 2)[1] for error in errors] == [
        "groups.g.vars.images.memlock", "groups.g.vars.monitoring.drift_interval_min",
        "hosts.gpu01.vars.validate.outlier_pct", "hosts.gpu01.vars.service_ports[0].port"]
    last = path.read_text().splitlines()[9]
    assert errors[0].startswith(f"{path}:4:25: ")
    assert errors[-1].startswith(f"{path}:10:{last.index('port: 0') + len('port: ') + 1}: ")


def test_a_torch_index_login_is_masked_from_the_load_on(tmp_path):
    from gpuprov.core.secrets import mask

    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu01:\n    address: 192.0.2.1\n    vars:\n"
                    "      validate: {torch_index: 'https://bot:Zq7-load-time-tok@pypi.internal/simple'}\n")
    assert "Zq7-load-time-tok" in mask("401 for Zq7-load-time-tok")
    load_inventory(path)
    assert "Zq7-load-time-tok" not in mask("401 for Zq7-load-time-tok")


# ------------------------------------------------------------------------------------ one checker per kind

@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30), st.booleans(),
                 st.text(max_size=8)))
@example(math.nan)
@example(100.0000001)
@example(True)
def test_a_percent_is_a_finite_number_above_0_and_at_most_100(value):
    good = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= 100)
    assert (checks.percent_problem(value) is None) == good


@given(st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.booleans(), st.text(max_size=6)),
       st.sampled_from([1, 1024]))
@example(0, 1)
@example(65536, 1)
@example(1023, 1024)
def test_a_port_is_a_whole_number_from_its_low_bound_to_65535(value, low):
    good = type(value) is int and low <= value <= 65535
    assert (checks.port_problem(value, low) is None) == good


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**40, 10**40)))
@example(checks.MAX_SECONDS + 1)
@example(math.inf)
def test_a_duration_is_what_python_and_systemd_timers_hold(value):
    good = math.isfinite(value) and 1 <= value <= checks.MAX_SECONDS
    assert (checks.duration_problem(value) is None) == good
    assert checks.MAX_SECONDS < __import__("threading").TIMEOUT_MAX


@given(st.text(max_size=40))
@example("/data/\n/etc")
@example("/srv/../etc")
@example("/")
@example("/data\x00")
def test_a_host_path_is_absolute_and_plain(text):
    plain = text.startswith("/") and all(ch.isascii() and (ch.isalnum() or ch in "_.+@/-") for ch in text)
    good = plain and "/../" not in f"{text}/"
    assert (checks.host_path_problem(text) is None) == good
    assert (checks.host_path_problem(text, root=False) is None) == (good and text.strip("/") != "")


@given(st.text(max_size=20), st.booleans())
@example("eth0", True)
@example("eth0\nx", True)
@example("a" * 16, True)
@example("", True)
def test_an_ipv6_zone_is_an_interface_name_and_only_where_allowed(zone, allowed):
    address = f"fe80::1%{zone}"
    good = allowed and len(zone) <= 15 and zone != "" and all(ch.isascii() and (ch.isalnum() or ch in "_.-")
                                                              for ch in zone)
    assert (checks.ip_address(address, zone=allowed) is not None) == good
    assert checks.network(f"fe80::%{zone}/64")[0] is None


@given(st.text(max_size=30))
@example("http://mirror.internal/x")
@example("http://h/\r\nX: y")
def test_a_url_is_http_or_https_with_a_host_and_nothing_forged(text):
    if checks.url_problem(text) is None:
        assert text.split("://")[0] in ("http", "https")
        assert not any(ch in text for ch in " \t\r\n\"'`\\<>") and all(ord(ch) >= 32 for ch in text)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://[fe80::1%25eth0]/", "https://h:99999/",
                                 "download.pytorch.org/whl/cu128", "http:///x", "http://h/\r\nX: y"])
def test_a_url_without_http_a_host_or_a_sound_port_is_refused(url):
    assert checks.url_problem(url) is not None


@given(st.integers(-10**6, 10**6), st.integers(0, 100), st.one_of(st.none(), st.integers(0, 200)))
def test_an_integer_has_its_bounds(value, low, high):
    good = value >= low and (high is None or value <= high)
    assert (checks.integer_problem(value, low, high) is None) == good
    assert checks.integer_problem(True, 0) is not None and checks.integer_problem(1.0, 0) is not None


@pytest.mark.parametrize(("registry", "good"), [
    ("10.0.0.5:5000", True), ("registry.local/team", True), ("h:65535", True),
    ("h:70000", False), ("http://r:5000", False), ("r:0", False), ("", False), (5000, False),
])
def test_a_registry_address_has_no_scheme_and_a_port_in_range(registry, good):
    assert (checks.registry_problem(registry) is None) == good


def test_cidrs_keep_their_normal_form(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  h: {address: 10.0.0.1, vars: {cluster_cidrs: ['10.1.0.0/16', 'FD00::/8']}}\n")
    assert load_inventory(path).host("h").vars["cluster_cidrs"] == ["10.1.0.0/16", "fd00::/8"]
