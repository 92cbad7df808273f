"""User-given stack pins and GPU names (gpuprov.stack.inputs): accepted forms, the exact error for each bad
value, the same refusal (exit 2, nothing written) through `invoke stack.resolve` and `stack.lock`, and a property
over any text: a value that is in gpuprov's data, or a PinError, never another exception.

Expected texts are written out here; the accepted lists are those of gpuprov/data/*.yaml."""

from __future__ import annotations

import re
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Config, Context
from test_tasks_hosts import exit_code, locks

from gpuprov.stack.data import table
from gpuprov.stack.inputs import PinError, gpu_model, stack_pin
from gpuprov.tasks import stack as stack_tasks

CUDA = "11.8, 12.0, 12.1, 12.2, 12.3, 12.4, 12.5, 12.6, 12.8, 12.9, 13.0, 13.1, 13.2, 13.3"
BRANCHES = "470, 520, 525, 530, 535, 545, 550, 555, 560, 565, 570, 575, 580, 590, 595, 610"
NCCL = ("2.15.5, 2.16.5, 2.17.1, 2.19.3, 2.20.3, 2.21.5, 2.22.3, 2.23.4, 2.25.1, 2.26.2, 2.26.5, 2.27.3, 2.27.5, "
        "2.27.7, 2.28.7, 2.28.9, 2.30.4")
NGC = ("23.10, 23.11, 23.12, 24.01, 24.02, 24.03, 24.04, 24.05, 24.06, 24.07, 24.08, 24.09, 24.10, 24.11, 24.12, "
       "25.01, 25.02, 25.03, 25.04, 25.05, 25.06, 25.07, 25.08, 25.09, 25.10, 25.11, 25.12, 26.01, 26.02, 26.03, "
       "26.04, 26.05, 26.06, 26.07")
PYTORCH = "2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14"
MODELS = ("V100-SXM2-16GB, V100-SXM2-32GB, V100-PCIE-16GB, V100-PCIE-32GB, T4, A10, A100-PCIE-40GB, A100-SXM4-40GB, "
          "A100-PCIE-80GB, A100-SXM4-80GB, L4, L40S, H100-PCIE, H100-SXM, H200-SXM, B200, GB200, B300, RTX-4090, "
          "RTX-5090")
# NVIDIA GPU Operator component matrix (data center driver release notes) and CUDA 12.8.x installers.
R570 = "570.86.10, 570.86.15, 570.124.06, 570.133.20, 570.148.08, 570.158.01, 570.172.08, 570.195.03, 570.211.01"

BAD_PINS = [
    ("cuda", "12.7", f"unknown CUDA release '12.7'. Accepted: {CUDA}, or an update of one such as 12.8.1"),
    ("cuda", "12.8.5", "unknown CUDA update '12.8.5'. CUDA 12.8 updates: 12.8.0, 12.8.1"),
    ("cuda", "12.7.1", f"unknown CUDA release 12.7 (in '12.7.1'). Accepted: {CUDA}, or an update of one such as "
                       "12.8.1"),
    ("cuda", "twelve", "bad CUDA version 'twelve': give a release such as 12.8 or an update such as 12.8.1. "
                       f"Accepted: {CUDA}, or an update of one such as 12.8.1"),
    ("cuda", "12.８", "CUDA version '12.８' has digits that are not ASCII ('８'); write it with the digits 0-9"),
    ("driver", "999", f"unknown driver branch '999'. Accepted: {BRANCHES} (or R570, or a published version such "
                      "as 570.148.08)"),
    ("driver", "570.999", f"NVIDIA never published 570.999 as far as gpuprov's data knows; published 570 versions: "
                          f"{R570}; pin the branch (570) or add the version to gpuprov/data/drivers.yaml"),
    ("driver", "R570.148.8", f"NVIDIA never published 570.148.8 as far as gpuprov's data knows; published 570 "
                             f"versions: {R570}; pin the branch (570) or add the version to "
                             "gpuprov/data/drivers.yaml"),
    ("driver", "620", f"driver branch 620 has no published version in gpuprov's data, so it cannot be installed. "
                      f"Accepted: {BRANCHES}; or add 620's versions to gpuprov/data/drivers.yaml"),
    ("driver", "570-open", "bad driver version '570-open': give a branch such as 570 (or R570) or a published "
                           f"version such as 570.148.08. Accepted branches: {BRANCHES}"),
    ("driver", "５７０", "driver '５７０' has digits that are not ASCII ('５', '７', '０'); write it with the "
                      "digits 0-9"),
    ("driver", "57⁰", "driver '57⁰' has digits that are not ASCII ('⁰'); write it with the digits 0-9"),
    ("nccl", "9.9", f"unknown NCCL version '9.9'. Accepted: {NCCL}, or a release such as 2.26 (its newest build)"),
    ("nccl", "2", f"unknown NCCL version '2'. Accepted: {NCCL}, or a release such as 2.26 (its newest build)"),
    ("ngc", "19.01", f"unknown NGC PyTorch tag '19.01'. Accepted: {NGC} (with or without -py3)"),
    ("pytorch", "1.0", f"unknown PyTorch release '1.0'. Accepted: {PYTORCH}"),
    ("pytorch", "2.²", "PyTorch release '2.²' has digits that are not ASCII ('²'); write it with the digits 0-9"),
]
UNKNOWN_GPU = (f"unknown GPU model 'H1000' (did you mean 'H100', 'H100-80GB', 'V100'?). Accepted: a catalog model "
               f"({MODELS}), one of its aliases, or the name nvidia-smi prints for it; invoke stack.matrix "
               "--component gpus lists them all")
FOREIGN_GPU = "GPU model 'H１00' has digits that are not ASCII ('１'); write it with the digits 0-9"


# ----------------------------------------------------------------------------------------------- inputs.py

@pytest.mark.parametrize(("key", "text", "normalized"), [
    ("cuda", "12.8", "12.8"), ("cuda", " 12.8.1 ", "12.8.1"), ("driver", "570", "570"), ("driver", "R570", "570"),
    ("driver", "r580", "580"), ("driver", "570.148.08", "570.148.08"), ("driver", "R570.133.20", "570.133.20"),
    ("driver", "580.178.04", "580.178.04"), ("nccl", "2.26", "2.26"), ("nccl", "2.26.5", "2.26.5"),
    ("ngc", "25.04", "25.04"), ("ngc", "25.04-py3", "25.04"), ("pytorch", "2.7", "2.7"),
])
def test_accepted_pins_are_normalized(key, text, normalized):
    assert stack_pin(key, text) == normalized


BAD_IDS = [f"{key}={text}" for key, text, _ in BAD_PINS]


@pytest.mark.parametrize(("key", "text", "message"), BAD_PINS, ids=BAD_IDS)
def test_bad_pins_say_what_is_accepted(key, text, message):
    with pytest.raises(PinError) as caught:
        stack_pin(key, text)
    assert str(caught.value) == message


@pytest.mark.parametrize(("key", "value", "message"), [
    ("cuda", 12.8, 'CUDA version must be text such as "12.8", not a number'),
    ("driver", None, 'driver must be text such as "570", not null'),
    ("ngc", ["25.04"], 'NGC PyTorch tag must be text such as "25.04", not a list'),
])
def test_a_pin_must_be_text(key, value, message):
    with pytest.raises(PinError) as caught:
        stack_pin(key, value)
    assert str(caught.value) == message


def test_a_gpu_model_must_be_text():
    with pytest.raises(PinError) as caught:
        gpu_model(True)
    assert str(caught.value) == "GPU model must be text such as H100-SXM, not a boolean"


def test_gpu_names_by_key_alias_and_nvidia_smi_name():
    assert [gpu_model(n) for n in ("H100-SXM", "h100", " NVIDIA H200 ", "Tesla T4")] == [
        "H100-SXM", "H100-SXM", "H200-SXM", "T4"]


@pytest.mark.parametrize(("name", "message"), [("H1000", UNKNOWN_GPU), ("H１00", FOREIGN_GPU)])
def test_unknown_gpu_names_get_a_did_you_mean(name, message):
    with pytest.raises(PinError) as caught:
        gpu_model(name)
    assert str(caught.value) == message


def test_published_driver_versions_hold_each_branchs_default():
    """Every branch's `latest` is one of its published versions, listed once and in order; Table 3 minimums that
    NVIDIA never shipped as a driver (570.26, 535.86.09) are not listed."""
    for branch, row in table("drivers")["branches"].items():
        versions = row["versions"]
        assert (row["latest"] is None) == (not versions)
        assert row["latest"] is None or row["latest"] in versions
        assert all(v.split(".")[0] == branch for v in versions)
        assert versions == sorted(set(versions), key=lambda v: tuple(int(p) for p in v.split(".")))
    assert "570.26" not in table("drivers")["branches"]["570"]["versions"]
    assert "535.86.09" not in table("drivers")["branches"]["535"]["versions"]


def _in_data(key: str, value: str) -> bool:
    """Whether gpuprov's data has `value` under `key` (the accepted normalized forms)."""
    if key == "cuda":
        releases = table("cuda")["releases"]
        return value in releases or any(value in row["updates"] for row in releases.values())
    if key == "driver":
        branches = table("drivers")["branches"]
        return any(value == b and row["versions"] or value in row["versions"] for b, row in branches.items())
    if key == "nccl":
        releases = table("nccl")["releases"]
        return value in releases or bool(re.fullmatch(r"[0-9]+\.[0-9]+", value)) and any(
            r.startswith(value + ".") for r in releases)
    if key == "ngc":
        return value in table("ngc_pytorch")["tags"]
    return value in table("pytorch_wheels")["releases"]


_KNOWN = [*table("cuda")["releases"], "12.8.1", "570", "570.148.08", "2.26", "2.26.5", "25.04", "2.7"]
_PIN_TEXT = st.one_of(
    st.text(max_size=24),
    st.text(alphabet="0123456789.Rr-py3 ５８²⁰٣", max_size=14),
    st.builds(lambda known, prefix, suffix: prefix + known + suffix, st.sampled_from(_KNOWN),
              st.sampled_from(["", " ", "R", "r", "v", "０"]), st.sampled_from(["", " ", ".0", "-py3", "-PY3", "x"])),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(["cuda", "driver", "nccl", "ngc", "pytorch"]), text=_PIN_TEXT)
def test_any_text_is_a_value_in_the_data_or_a_pin_error(key, text):
    try:
        value = stack_pin(key, text)
    except PinError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert _in_data(key, value)


# ----------------------------------------------------------------------------------------------- stack.resolve

def _resolve(capsys, **kwargs) -> tuple[int, str]:
    args = {"gpu": "H100-SXM", "os": "ubuntu-22.04", **kwargs}
    return exit_code(stack_tasks.resolve, Context(Config()), capsys, **args)


@pytest.mark.parametrize(("key", "text", "message"), BAD_PINS, ids=BAD_IDS)
def test_stack_resolve_refuses_each_bad_pin(capsys, key, text, message):
    assert _resolve(capsys, **{key: text}) == (2, f"error: {message}\n")


@pytest.mark.parametrize(("name", "message"), [("H1000", UNKNOWN_GPU), ("H１00", FOREIGN_GPU)])
def test_stack_resolve_refuses_an_unknown_gpu(capsys, name, message):
    assert _resolve(capsys, gpu=name) == (2, f"error: {message}\n")


@pytest.mark.parametrize("gpus", ["1.5", "x", "0", "-1", "²", "", " "])
def test_stack_resolve_gpus_is_a_whole_number(capsys, gpus):
    assert _resolve(capsys, gpus=gpus) == (2, f"error: --gpus must be a whole number >= 1, not {gpus!r}\n")


def test_stack_resolve_without_os_or_gpu_names_the_option(capsys):
    assert _resolve(capsys, os=None) == (2, "error: --os is required: give the OS of the hosts, one of "
                                            "ubuntu-22.04, ubuntu-24.04, debian-12, rhel-9, rocky-9\n")
    assert _resolve(capsys, gpu=None) == (2, "error: --gpu is required: give a GPU model such as H100-SXM "
                                             f"(catalog models: {MODELS}; invoke stack.matrix --component gpus "
                                             "lists their aliases too)\n")


def test_stack_resolve_with_good_pins_prints_the_stack(capsys):
    stack_tasks.resolve(Context(Config()), gpu="h100", os="debian-12", gpus="8", driver="R570.148.08",
                        ngc="25.04-py3", json_=True)
    out = capsys.readouterr().out
    assert '"version": "570.148.08"' in out and '"ngc_pytorch": "25.04-py3"' in out


def test_the_command_line_exits_2_without_os(tmp_path):
    from test_tasks_hosts import invoke

    proc = invoke("stack.resolve", "--gpu", "H100", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == ("error: --os is required: give the OS of the hosts, one of ubuntu-22.04, "
                           "ubuntu-24.04, debian-12, rhel-9, rocky-9\n")
    proc = invoke("stack.resolve", "--gpu", "H100", "--os", "debian-12", "--gpus", "1.5", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, "error: --gpus must be a whole number >= 1, not '1.5'\n")


# ----------------------------------------------------------------------------------------------- stack.lock

MESSAGE = {(key, text): message for key, text, message in BAD_PINS}
LOCK_CASES = [
    ("stack: {cuda: \"12.7\"}", MESSAGE["cuda", "12.7"]),
    ("stack: {driver: \"999\"}", MESSAGE["driver", "999"]),
    ("stack: {nccl: \"9.9\"}", MESSAGE["nccl", "9.9"]),
    ("stack: {ngc: \"19.01\"}", MESSAGE["ngc", "19.01"]),
    ("stack: {pytorch: \"1.0\"}", MESSAGE["pytorch", "1.0"]),
    ("stack: {driver: \"570.999\"}", MESSAGE["driver", "570.999"]),
    ("stack: {driver: \"５７０\"}", MESSAGE["driver", "５７０"]),
    ("hardware: {gpu: H1000}", UNKNOWN_GPU),
    ("hardware: {gpu: H１00}", FOREIGN_GPU),
]


@pytest.mark.parametrize(("variables", "message"), LOCK_CASES, ids=[v for v, _ in LOCK_CASES])
def test_stack_lock_with_a_bad_pin_writes_no_lock(tmp_path, capsys, variables, message):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(textwrap.dedent(f"""\
        groups:
          hgx:
            vars:
              hardware: {{gpu: H100-SXM, count: 8}}
        hosts:
          gpu01: {{address: 192.0.2.11, groups: [hgx], vars: {{{variables}}}}}
        """))
    c = Context(Config(overrides={"gpuprov": {"locks": str(tmp_path / "locks")}}))
    code, err = exit_code(stack_tasks.lock, c, capsys, host=["gpu01"], os="debian-12", inventory=str(inventory))
    assert code == 2 and message in err and "Traceback" not in err
    assert locks(tmp_path) == []
