"""User-given stack pins and GPU names (gpuprov.stack.inputs): accepted forms, the exact error for each bad
value, the same refusal (exit 2, nothing written) through `invoke stack.resolve` and `stack.lock`, and a property
over any text: a value that is in gpuprov's data, or a PinError, never another exception.

Expected texts are written out here; the accepted lists are those of gpuprov/data/*.yaml."""

from __future__ import annotations

import re
import textwrap

import pytest
from helpers.pins import BAD_IDS, BAD_PINS, FOREIGN_GPU, MODELS, UNKNOWN_GPU
from helpers.tasks import exit_code, locks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Config, Context

from gpuprov.stack.data import table
from gpuprov.stack.inputs import PinError, gpu_model, stack_pin
from gpuprov.tasks import stack as stack_tasks

# ----------------------------------------------------------------------------------------------- inputs.py

@pytest.mark.parametrize(("key", "text", "normalized"), [
    ("cuda", "12.8", "12.8"), ("cuda", " 12.8.1 ", "12.8.1"), ("driver", "570", "570"), ("driver", "R570", "570"),
    ("driver", "r580", "580"), ("driver", "570.148.08", "570.148.08"), ("driver", "R570.133.20", "570.133.20"),
    ("driver", "580.178.04", "580.178.04"), ("nccl", "2.26", "2.26"), ("nccl", "2.26.5", "2.26.5"),
    ("ngc", "25.04", "25.04"), ("ngc", "25.04-py3", "25.04"), ("pytorch", "2.7", "2.7"),
])
def test_accepted_pins_are_normalized(key, text, normalized):
    assert stack_pin(key, text) == normalized


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
    from helpers.tasks import invoke

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
