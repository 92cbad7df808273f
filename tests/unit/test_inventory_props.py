"""Property: whatever the file holds, the loader returns an Inventory or raises a clean input error."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.core.errors import InputError
from gpuprov.inventory import Inventory, InventoryError, load_inventory

KEYS = ["hosts", "groups", "defaults", "all", "children", "vars", "address", "port", "user", "jump",
        "identity_file", "sudo", "password_env", "nopasswd", "hardware", "stack", "mirror", "firewall",
        "allow", "sources", "proto", "gpu", "count", "nvswitch", "cuda", "driver", "ngc", "nccl", "url",
        "ca_file", "fingerprint", "ansible_host", "ansible_port", "ansible_become_password", "gpuprov_jump",
        "h1", "h2", "g1", "g2", "bastion", "validate", "threshold_pct", "textfile_dir", "torch_index", "images",
        "registry", "memlock", "workload", "data_dir", "cluster_address", "monitoring", "cost", "service_ports"]

TOKENS = [*(f"{k}:" for k in KEYS), *KEYS, "\n", "  ", "    ", "- ", ": ", "{", "}", "[", "]", ", ", "&a ",
          "*a", "<<: ", "!vault ", "!!int ", "!!binary ", "'", '"', "#", "|", ">", "---", "...", "? ",
          "10.0.0.1", "22", "0", "-1", "70000", "12.8", "yes", "null", "~", "$(id)", "; reboot", "\t",
          "\x00", "\ufeff", "2024-13-45", "0x1F", ".nan", "1e400", "%YAML 1.1\n", "[[[["]

INI_TOKENS = ["[", "]", ":vars", ":children", ":child", "g1", "g2", "all", "ungrouped", "h1", "h2", "gpu[01:03]",
              "h[a:c]", "[1:2:0]", "[0:999999]", "=", " ", "  ", "\n", "\n", "#", ";", "'", '"', "\\", "ansible_host",
              "ansible_port", "ansible_user", "ansible_become_password", "gpuprov_jump", "gpuprov_sudo", "10.0.0.1",
              "22", "22²", "２", ":2222", "[fd00::1]", "{'gpu': 'H100-SXM'}", "hardware", "stack", "{", "}", "(", ")",
              "None", "True", "12.10", "1e400", "b'x'", "1j", "...", "\t", "\x00", "\x0c", "\u2028", "---"]

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(KEYS),
                    st.sampled_from(["10.0.0.1", "12.8", "570", "10.0.0.0/8", "http://m/", "a@b:22"]))
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=10), st.integers(-5, 5), st.booleans(), st.none())
structures = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=30)


def check(tmp_dir, data: bytes, name: str = "inv.yaml") -> None:
    path = tmp_dir / name
    path.write_bytes(data)
    try:
        result = load_inventory(path)
    except InventoryError as exc:
        assert exc.errors and all(e.startswith(f"{path}:") for e in exc.errors)
        return
    except InputError:
        return
    assert isinstance(result, Inventory) and result.hosts


@SETTINGS
@given(text=st.lists(st.sampled_from(TOKENS), max_size=40).map("".join))
def test_yamlish_text_never_crashes_the_loader(tmp_path_factory, text):
    check(tmp_path_factory.getbasetemp(), text.encode("utf-8", "surrogatepass"))


@SETTINGS
@given(data=st.one_of(st.binary(max_size=200),
                      st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_arbitrary_bytes_never_crash_the_loader(tmp_path_factory, data):
    check(tmp_path_factory.getbasetemp(), data)


@SETTINGS
@given(doc=st.one_of(
    structures,
    st.fixed_dictionaries({}, optional={"hosts": structures, "groups": structures, "defaults": structures}),
    st.fixed_dictionaries({"all": structures}),
))
def test_random_structures_never_crash_the_loader(tmp_path_factory, doc):
    check(tmp_path_factory.getbasetemp(), yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass"))


@SETTINGS
@given(text=st.lists(st.sampled_from(INI_TOKENS), max_size=40).map("".join))
def test_ini_text_never_crashes_the_loader(tmp_path_factory, text):
    check(tmp_path_factory.getbasetemp(), text.encode("utf-8", "surrogatepass"), "hosts.ini")


@SETTINGS
@given(lines=st.lists(st.one_of(st.sampled_from(["[g1]", "[g2:vars]", "[g1:children]", "[all:vars]", "g2"]),
                                st.tuples(st.sampled_from(["h1", "gpu[1:3]", "h2:2222", "g2"]),
                                          st.dictionaries(st.sampled_from(KEYS + ["ansible_port", "rack"]),
                                                          scalars, max_size=3))
                                .map(lambda hv: " ".join([hv[0], *(f"{k}={v!r}" for k, v in hv[1].items())]))),
                      max_size=12))
def test_ini_structures_never_crash_the_loader(tmp_path_factory, lines):
    check(tmp_path_factory.getbasetemp(), "\n".join(lines).encode("utf-8", "surrogatepass"), "hosts.ini")
