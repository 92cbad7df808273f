"""Property: whatever the file holds, the loader returns an Inventory or raises a clean input error."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.errors import InputError
from gpuprov.inventory import Inventory, InventoryError, load_inventory

KEYS = ["hosts", "groups", "defaults", "all", "children", "vars", "address", "port", "user", "jump",
        "identity_file", "sudo", "password_env", "nopasswd", "hardware", "stack", "mirror", "firewall",
        "allow", "sources", "proto", "gpu", "count", "nvswitch", "cuda", "driver", "ngc", "nccl", "url",
        "ca_file", "fingerprint", "ansible_host", "ansible_port", "ansible_become_password", "gpuprov_jump",
        "h1", "h2", "g1", "g2", "bastion"]

TOKENS = [*(f"{k}:" for k in KEYS), *KEYS, "\n", "  ", "    ", "- ", ": ", "{", "}", "[", "]", ", ", "&a ",
          "*a", "<<: ", "!vault ", "!!int ", "!!binary ", "'", '"', "#", "|", ">", "---", "...", "? ",
          "10.0.0.1", "22", "0", "-1", "70000", "12.8", "yes", "null", "~", "$(id)", "; reboot", "\t",
          "\x00", "\ufeff", "2024-13-45", "0x1F", ".nan", "1e400", "%YAML 1.1\n", "[[[["]

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(KEYS),
                    st.sampled_from(["10.0.0.1", "12.8", "570", "10.0.0.0/8", "http://m/", "a@b:22"]))
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=10), st.integers(-5, 5), st.booleans(), st.none())
structures = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=30)


def check(tmp_dir, data: bytes) -> None:
    path = tmp_dir / "inv.yaml"
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
