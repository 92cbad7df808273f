"""The suite on the oldest and newest Python a Debian release ships: lab hosts debootstrapped from Debian bullseye
(python3 3.9) and trixie (python3 3.13), beside a bookworm host (3.11) as the reference.

Each host is reached as `invoke validate` reaches it, with gpuprov's own code over real SSH: facts, the root
probe of the host's python3, the suite's venv made by root with that python3 from a wheel set `pip download`ed for
its version (checked and installed by hash), the suite pushed and its config written, then the quick suite run by
validate's own command. Only the stack is left out: validate resolves one from gpuprov's stack tables, which have no
Debian 11 or 13 (`invoke validate` stops such a host at stack.resolve), so the config carries no stack's versions.

The judges are outside the code: the interpreter the probe and the suite's report name must be the one the host's
/usr/bin/python3 says it is (asked through `docker exec`) and the one Debian's package database installed
(`dpkg-query`), of the release's series (3.9 on bullseye, 3.13 on trixie: Debian's own versions); and every check
must end exactly as on the bookworm host in the same state (same checks, same verdicts: a check that crashes on
one Python and not on another, an AttributeError such as `datetime.UTC` on 3.9, shows as a difference).

gpuprov provisions bookworm only, so each host gets the lab's simulated
driver as a provisioned lab host has it, the same files on every host: the stand-in nvidia-smi (itself run by the
host's python3) and its data for driver 590.48.01. The wheel set is validate's without torch (numpy, onnx,
onnxruntime, pip): a CPU torch for cp39/cp313 is not on this machine's package sources (PyPI's Linux x86_64 torch
wheels are CUDA builds of several GB), so the torch checks skip on every host alike with their reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from labutil import on_host

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts
PROFILES = ["l40s", "l40s@bullseye", "l40s@trixie"]
SERIES = {"bookworm": "3.11", "bullseye": "3.9", "trixie": "3.13"}    # python3 of Debian 12, 11 and 13
DRIVER = "590.48.01"
# What a host with the simulated driver passes on bookworm (the rest: skips with their reason, no torch, no DCGM).
MUST_PASS = {"host.gpus", "host.ecc", "host.persistence", "host.shm"}
CRASHES = re.compile(r"Traceback|AttributeError|SyntaxError|NameError|TypeError|ImportError: cannot import")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """Where the module's wheel sets are downloaded (pip's own cache keeps a second run off the network)."""
    return tmp_path_factory.mktemp("wheels")


@pytest.fixture(scope="module")
def fleet(lab):
    """A bookworm, a bullseye and a trixie host (the same hardware profile), bare but for the simulated driver."""
    import gpuprov.lab

    started = time.monotonic()
    state = gpuprov.lab.up(len(PROFILES), PROFILES, paths=lab.paths, progress=print, fresh=True)
    print(f"lab of bookworm, bullseye and trixie hosts: {time.monotonic() - started:.1f} s")
    for host in state.hosts:
        simulate_driver(host.container_id)
    return state


def simulate_driver(container: str) -> None:
    """The lab's simulated driver on a host, as its stand-in packages install it (tests/unit/
    test_host_python_versions.py lays out the same files): nvidia-smi, the driver's version, the GPU table of
    the lab profiles, the loaded module and persistence mode."""
    from gpuprov.lab.smi_answers import gpu_profiles_table
    from gpuprov.lab.standins import FILES

    files = {"/usr/bin/nvidia-smi": (FILES / "nvidia-smi").read_text(encoding="utf-8"),
             "/usr/lib/gpuprov-lab/driver-version": f"{DRIVER}\n", "/usr/lib/gpuprov-lab/driver-cuda-version": "13.1\n",
             "/usr/lib/gpuprov-lab/gpu-profiles.json": json.dumps(gpu_profiles_table()),
             "/run/gpuprov-lab/loaded-driver": f"{DRIVER}\n", "/run/gpuprov-lab/persistenced": ""}
    write = 'mkdir -p "${1%/*}" && cat > "$1"'
    for path, text in files.items():
        subprocess.run(["docker", "exec", "-i", container, "sh", "-c", write, "-", path], input=text, text=True,
                       check=True, timeout=60)
    subprocess.run(["docker", "exec", container, "chmod", "0755", "/usr/bin/nvidia-smi"], check=True, timeout=60)


def wheel_set(python, root: Path):
    """Validate's wheel set for the host's Python without torch, downloaded with validate's own `pip download`
    command (once per Python)."""
    from gpuprov.validation.env import Wheelhouse, pip_download_commands, request_for

    request = request_for(python, "cpu", None, "")
    folder = root / request.key()
    if not folder.is_dir():
        started = time.monotonic()
        subprocess.run(pip_download_commands(request, folder)[1], check=True, capture_output=True, timeout=600)
        print(f"wheels for Python {python.version}: {time.monotonic() - started:.1f} s")
    files = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.glob("*.whl")}
    return Wheelhouse(folder, files, request.requirements()[1:])


def suite_run(fleet, lab_host, wheels: Path, only: str | None = None):
    """(the probe's HostPython, the suite's document) of one host, reached as validate reaches it: facts, the root
    probe of its python3, the venv from the wheel set, the suite pushed, its config written, the quick suite run by
    validate's command."""
    from gpuprov.core.connection import HostConnection
    from gpuprov.core.known_hosts import read_known_hosts
    from gpuprov.facts.gather import gather
    from gpuprov.inventory import load_inventory
    from gpuprov.provision.ops import MANAGED_FILES
    from gpuprov.validation.env import ensure_env, probe_host
    from gpuprov.validation.remote import Remote
    from gpuprov.validation.suite import push_suite, run_suite, suite_command, write_config
    from gpuprov.validation.suite_config import build_config, validate_vars

    inventory = load_inventory(fleet.inventory)
    host = inventory.host(lab_host.name)
    with HostConnection(host, known_hosts=read_known_hosts(Path(inventory.known_hosts))) as conn:
        facts = gather(conn, MANAGED_FILES)
        remote = Remote(conn)
        python = probe_host(remote)
        ensure_env(remote, python, wheel_set(python, wheels))
        config = build_config(host, facts, None, validate_vars(host), level="quick", strict=False, image=None)
        push_suite(remote, python.smoke_digest)
        write_config(remote, config)
        command = suite_command(level="quick", strict=False, only=[only] if only else None)
        return python, run_suite(remote, command, "quick", config.get("datasheet"))


@pytest.fixture(scope="module")
def runs(fleet, wheels):
    """{release: (host name, the probe's HostPython, the suite's document)}: the whole quick suite on each host."""
    out = {}
    for lab_host in fleet.hosts:
        started = time.monotonic()
        python, document = suite_run(fleet, lab_host, wheels)
        print(f"{lab_host.name} ({lab_host.release}, Python {python.version}): {time.monotonic() - started:.1f} s")
        out[lab_host.release] = (lab_host.name, python, document)
    return out


def test_the_hosts_run_the_release_they_were_built_from(fleet):
    releases = {h.release: h for h in fleet.hosts}
    assert sorted(releases) == ["bookworm", "bullseye", "trixie"]
    for release, host in releases.items():
        os_release = on_host(fleet, host.name, ". /etc/os-release && echo $VERSION_CODENAME")
        assert os_release.strip() == release
        assert on_host(fleet, host.name, "systemctl is-active ssh.service").strip() == "active"


@pytest.mark.parametrize("release", ["bullseye", "trixie", "bookworm"])
def test_the_report_names_the_hosts_own_python(runs, fleet, release):
    name, python, document = runs[release]
    said = on_host(fleet, name, "/usr/bin/python3 --version").strip()            # "Python 3.9.2"
    installed = on_host(fleet, name, f"dpkg-query -W -f='${{Version}}' python{SERIES[release]}").strip()
    version = said.removeprefix("Python ")
    assert said.startswith("Python ") and version.startswith(SERIES[release] + ".")
    assert installed.split("-")[0].split("+")[0] == version                       # Debian's upstream version
    assert python.version == SERIES[release]
    assert python.path == on_host(fleet, name, "readlink -f /usr/bin/python3").strip()
    assert document["versions"]["python"] == version


@pytest.mark.parametrize("release", ["bullseye", "trixie"])
def test_every_check_ends_as_on_bookworm(runs, release):
    reference = {r["check"]: r for r in runs["bookworm"][2]["results"]}
    results = {r["check"]: r for r in runs[release][2]["results"]}
    assert sorted(results) == sorted(reference)
    assert {c: r["status"] for c, r in results.items()} == {c: r["status"] for c, r in reference.items()}
    crashed = {(where, c): r["reason"] for where, found in ((release, results), ("bookworm", reference))
               for c, r in found.items() if CRASHES.search(str(r.get("reason") or ""))}
    assert not crashed, crashed
    # the checks did run: the host checks judged the simulated L40S host, the torch checks name why they skip
    assert {c for c, r in results.items() if r["status"] == "pass"} >= MUST_PASS
    assert "torch is not importable" in results["train.cnn"]["reason"]


@pytest.mark.parametrize("fault, check", [("ecc-uncorrectable 2", "host.ecc"), ("gpu-missing", "host.gpus")])
def test_a_fault_fails_its_check_on_every_python_alike(fleet, runs, wheels, fault, check):
    """The simulated fault on every host: its check fails with the same reason on 3.9, 3.11 and 3.13."""
    from gpuprov.lab.faults import injected

    verdicts = {}
    for lab_host in fleet.hosts:
        with injected(lab_host.container_id, fault):
            _, document = suite_run(fleet, lab_host, wheels, only=check)
        verdicts[lab_host.release] = [(r["check"], r["status"], r["reason"]) for r in document["results"]]
    assert verdicts["bookworm"][0][:2] == (check, "fail") and len(verdicts["bookworm"]) == 1
    assert verdicts["bullseye"] == verdicts["bookworm"] == verdicts["trixie"]


@pytest.mark.parametrize("release", ["bullseye", "trixie", "bookworm"])
def test_the_venv_is_the_hosts_python_with_the_wheels_pip_chose_for_it(runs, fleet, wheels, release):
    name, python, document = runs[release]
    venv = on_host(fleet, name, "readlink -f /opt/gpuprov/venv/bin/python").strip()
    assert venv == on_host(fleet, name, "readlink -f /usr/bin/python3").strip()
    chosen = {path.name.split("-")[0]: path.name.split("-")[1]
              for path in wheels.glob(f"cp{SERIES[release].replace('.', '')}-*/*.whl")}
    assert {key: document["versions"][key] for key in ("numpy", "onnx", "onnxruntime")} == {
        key: chosen[key] for key in ("numpy", "onnx", "onnxruntime")}
