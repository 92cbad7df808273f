"""The host's Python environment: the controller's wheelhouse (pip download commands, manifest, reuse) and the
venv on the host, built from pushed wheels and left alone when its marker matches.

The host side runs for real in a temporary folder: a connection that runs each command with `sh -c` here and
"uploads" by copying, recording both; the wheels are pip's own (from ensurepip) and a small wheel made here. The
judges of what root may run are the file system (real owners and modes) and pip's own --require-hashes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.local_host import LocalConn, make_wheel, tiny_wheelhouse

from gpuprov.core.connection import Result
from gpuprov.core.errors import GpuprovError
from gpuprov.validation import Layout
from gpuprov.validation.env import (
    MANIFEST,
    CompilerPlan,
    HostPython,
    Toolchain,
    Wheelhouse,
    compiler_plan,
    compiler_wanted,
    ensure_compiler,
    ensure_env,
    env_plan,
    install_script,
    load_wheelhouse,
    pip_download_commands,
    plan_lines,
    probe_host,
    request_for,
    wheel_pin,
    wheelhouse_for,
)
from gpuprov.validation.remote import SECURE, Remote

SYSTEM_PYTHON = os.path.realpath("/usr/bin/python3")


def probe_value(layout: Layout) -> str:
    return subprocess.run([layout.python, "-c", "import gpuprov_probe; print(gpuprov_probe.VALUE)"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.root
def test_second_run_uploads_and_installs_nothing(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    wheelhouse = tiny_wheelhouse(tmp_path / "controller" / "set")
    conn = LocalConn()
    remote = Remote(conn)

    python = probe_host(remote, layout)
    assert python.marker is None and python.version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    first = ensure_env(remote, python, wheelhouse, layout)
    assert first["installed"] is True and sorted(first["uploaded"]) == sorted(wheelhouse.files)
    assert probe_value(layout) == "42"
    assert Path(layout.marker).read_text().strip() == wheelhouse.digest(python)

    conn.commands.clear()
    conn.uploads.clear()
    again = probe_host(remote, layout)
    assert again.marker == wheelhouse.digest(again)
    second = ensure_env(remote, again, wheelhouse, layout)
    assert (second["installed"], second["uploaded"]) == (False, [])
    assert len(conn.commands) == 1 and "command -v python3" in conn.commands[0]   # the probe, nothing else
    assert conn.uploads == []
    assert python.path == SYSTEM_PYTHON and all(conn.sudo)   # root's python3, probed as root


@pytest.mark.root
def test_a_new_wheel_set_replaces_the_venv_and_drops_old_wheels(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    remote = Remote(LocalConn())
    ensure_env(remote, probe_host(remote, layout), tiny_wheelhouse(tmp_path / "a", "1.0", 1), layout)
    newer = tiny_wheelhouse(tmp_path / "b", "2.0", 2)
    conn = LocalConn()
    remote = Remote(conn)
    done = ensure_env(remote, probe_host(remote, layout), newer, layout)
    # pip's wheel is on the host already: only the new wheel travels
    assert done["installed"] and done["uploaded"] == ["gpuprov_probe-2.0-py3-none-any.whl"]
    assert sorted(os.listdir(layout.wheelhouse)) == sorted(newer.files)
    assert probe_value(layout) == "2"
    assert oct(os.stat(layout.wheelhouse).st_mode & 0o777) == "0o700" and os.stat(layout.wheelhouse).st_uid == 0
    assert os.listdir(layout.incoming) == []   # root took every upload


@pytest.mark.root
def test_a_wheel_that_arrives_damaged_is_removed_and_named(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    wheelhouse = tiny_wheelhouse(tmp_path / "set")
    name = "gpuprov_probe-1.0-py3-none-any.whl"
    damaged = Wheelhouse(wheelhouse.folder, {**wheelhouse.files, name: "0" * 64}, wheelhouse.requirements)
    remote = Remote(LocalConn())
    with pytest.raises(GpuprovError, match=f"wheels differ from the controller's after upload: {name}"):
        ensure_env(remote, probe_host(remote, layout), damaged, layout)
    assert name not in os.listdir(layout.wheelhouse) and name not in os.listdir(layout.incoming)
    assert not os.path.exists(layout.marker)


@pytest.mark.root
def test_a_hostile_python3_first_on_the_ssh_users_path_is_never_run(tmp_path):
    bin_dir, ran = tmp_path / "bin", tmp_path / "hostile-ran"
    bin_dir.mkdir()
    # it passes itself off as the interpreter (sys.executable), as a hostile copy of python would
    (bin_dir / "python3").write_text(f"#!/bin/bash\ntouch {ran}\nexec -a \"$0\" {SYSTEM_PYTHON} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    layout = Layout(root=str(tmp_path / "opt"))
    conn = LocalConn(env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    remote = Remote(conn)
    assert subprocess.run(["sh", "-c", "command -v python3"], env=conn.env, capture_output=True,
                          text=True).stdout.strip() == str(bin_dir / "python3")   # it is first on that PATH
    python = probe_host(remote, layout)
    ensure_env(remote, python, tiny_wheelhouse(tmp_path / "set"), layout)
    assert python.path == SYSTEM_PYTHON and os.path.realpath(layout.python) == SYSTEM_PYTHON
    assert not ran.exists()


def secure(path) -> tuple[int, str]:
    done = subprocess.run(["sh", "-c", SECURE + '\nsecure "$1"', "sh", str(path)], capture_output=True, text=True)
    return done.returncode, done.stdout.strip()


@pytest.mark.root
def test_only_paths_that_root_alone_can_change_are_secure(tmp_path):
    nobody = int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True, check=True).stdout)
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    (safe / "tool").write_text("")
    assert secure(safe / "tool") == (0, "")      # /tmp is sticky: it may be above, never last
    assert secure("/tmp")[0] == 1 and "writable by group or others (mode 1777)" in secure("/tmp")[1]
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o775)
    (open_dir / "tool").write_text("")
    assert secure(open_dir / "tool") == (1, f"{open_dir} is writable by group or others (mode 775)")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, nobody, -1)
    assert secure(theirs) == (1, f"{theirs} is owned by uid {nobody}, not root")
    link = safe / "link"
    link.symlink_to(theirs)
    assert secure(link) == (1, f"{theirs} is owned by uid {nobody}, not root")   # followed to its target
    assert secure(tmp_path / "missing")[1] == f"{tmp_path}/missing does not exist"


def test_an_opt_gpuprov_of_another_owner_is_refused(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    os.mkdir(layout.root)
    os.chown(layout.root, 65534, -1)
    remote = Remote(LocalConn())
    with pytest.raises(GpuprovError, match=f"root does not write into {layout.root}: {layout.root} is owned by "
                                           "uid 65534, not root") as caught:
        ensure_env(remote, probe_host(remote, layout), tiny_wheelhouse(tmp_path / "set"), layout)
    assert "chown root:root" in caught.value.hint and os.listdir(layout.root) == []


@pytest.mark.root
@pytest.mark.parametrize("plant", ["tampered", "symlink", "fifo"])
def test_a_wheel_the_ssh_user_planted_in_its_upload_folder_is_refused(tmp_path, plant):
    layout = Layout(root=str(tmp_path / "opt"))
    wheelhouse = tiny_wheelhouse(tmp_path / "set")
    name = "gpuprov_probe-1.0-py3-none-any.whl"
    remote = Remote(LocalConn())
    remote.user_folder(layout.incoming)
    planted = Path(layout.incoming) / name
    if plant == "tampered":
        make_wheel(tmp_path, "1.0", 666).rename(planted)
    elif plant == "symlink":
        planted.symlink_to(wheelhouse.folder / name)   # the right bytes, but through a link root must not follow
    else:
        os.mkfifo(planted)
    with pytest.raises(GpuprovError, match=f"wheels in the upload folder differ from the controller's: {name}"):
        ensure_env(remote, probe_host(remote, layout), wheelhouse, layout)
    assert not os.path.exists(layout.venv) and name not in os.listdir(layout.wheelhouse)
    assert not os.path.lexists(planted)


@pytest.mark.root
def test_every_wheel_is_installed_pinned_and_pip_checks_each_digest(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    wheelhouse = tiny_wheelhouse(tmp_path / "set")
    remote = Remote(LocalConn())
    python = probe_host(remote, layout)
    ensure_env(remote, python, wheelhouse, layout)
    assert wheelhouse.pins() == [f"gpuprov-probe==1.0 --hash=sha256:"
                                 f"{wheelhouse.files['gpuprov_probe-1.0-py3-none-any.whl']}"]
    # a newer wheel next to the pinned one is not taken, and a pinned wheel whose bytes changed is refused by pip
    make_wheel(Path(layout.wheelhouse), "9.0", 9)
    make_wheel(tmp_path, "1.0", 666).replace(Path(layout.wheelhouse) / "gpuprov_probe-1.0-py3-none-any.whl")
    done = remote.run("sh -s", stdin=install_script(python, wheelhouse, "x", layout), check=False)
    assert done.rc != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    Path(layout.wheelhouse, "gpuprov_probe-1.0-py3-none-any.whl").write_bytes(
        (wheelhouse.folder / "gpuprov_probe-1.0-py3-none-any.whl").read_bytes())
    remote.run("sh -s", stdin=install_script(python, wheelhouse, "x", layout))
    assert probe_value(layout) == "42"


def test_wheel_pins():
    assert wheel_pin("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.13.0+cpu")
    assert wheel_pin("typing_extensions-4.16.0-py3-none-any.whl") == ("typing-extensions", "4.16.0")
    two = Wheelhouse(Path("/w"), {"numpy-2.4.6-cp311-cp311-linux_x86_64.whl": "a",
                                  "numpy-2.3.0-cp311-cp311-linux_x86_64.whl": "b"}, [])
    with pytest.raises(GpuprovError, match="holds numpy in 2 versions"):
        two.pins()


def test_a_host_without_python3():
    class NoPython(LocalConn):
        def run(self, command, *, sudo=False, timeout=None, stdin=None):
            return Result(command, 127, "", "", 0.0)

    with pytest.raises(GpuprovError, match="the host has no python3") as caught:
        probe_host(Remote(NoPython()))
    assert "--image" in caught.value.hint


def test_request_of_the_resolvers_wheel():
    python = HostPython("/usr/bin/python3", "3.11", "x86_64", "2.36")
    request = request_for(python, "cu128", "2.7", None)
    assert request.requirements() == ["torch==2.7.*", "numpy", "onnx", "onnxruntime-gpu"]
    assert request.torch_index == "https://download.pytorch.org/whl/cu128"
    lab = request_for(python, "cpu", "latest", "")
    assert lab.requirements() == ["torch", "numpy", "onnx", "onnxruntime"] and lab.torch_index is None
    assert request_for(python, None, "2.7.1", None).torch_requirement() == "torch==2.7.1"
    assert request.key() != lab.key()


def test_pip_download_commands(tmp_path):
    python = HostPython("/usr/bin/python3", "3.11", "aarch64", "2.36")
    torch, rest = pip_download_commands(request_for(python, "cu128", "2.7", None), tmp_path)
    platforms = [torch[i + 1] for i, part in enumerate(torch) if part == "--platform"]
    # glibc 2.36 accepts manylinux_2_36 down to manylinux_2_17 (= manylinux2014): 20 + the legacy alias
    assert platforms[0] == "manylinux_2_36_aarch64" and platforms[-2:] == ["manylinux_2_17_aarch64",
                                                                         "manylinux2014_aarch64"]
    assert len(platforms) == 21
    assert torch[:4] == [sys.executable, "-m", "pip", "download"]
    assert torch[-1] == "torch==2.7.*" and "--index-url" not in torch
    assert {"--only-binary=:all:", "--python-version", "3.11", "--abi", "cp311"} <= set(torch)
    assert rest[-4:] == ["numpy", "onnx", "onnxruntime-gpu", "pip"] and "--index-url" not in rest


def test_wheelhouse_is_downloaded_once_and_reused(tmp_path):
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        dest = Path(command[command.index("--dest") + 1])
        for requirement in command[command.index("--disable-pip-version-check") + 1:]:
            if not requirement.startswith("-") and "://" not in requirement and "manylinux" not in requirement:
                name = requirement.split("=")[0].replace("-", "_")
                (dest / f"{name}-1.0-py3-none-any.whl").write_bytes(name.encode())
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    python = HostPython("/usr/bin/python3", "3.11", "x86_64", "2.36")
    request = request_for(python, "cpu", None, "")
    first = wheelhouse_for(request, tmp_path, run=fake_pip)
    assert len(calls) == 2
    assert sorted(first.files) == ["numpy-1.0-py3-none-any.whl", "onnx-1.0-py3-none-any.whl",
                                   "onnxruntime-1.0-py3-none-any.whl", "pip-1.0-py3-none-any.whl",
                                   "torch-1.0-py3-none-any.whl"]
    assert first.files["numpy-1.0-py3-none-any.whl"] == hashlib.sha256(b"numpy").hexdigest()
    assert (first.folder / MANIFEST).is_file() and first.folder.name == request.key()
    second = wheelhouse_for(request, tmp_path, run=fake_pip)
    assert len(calls) == 2 and second.files == first.files
    assert [p.name for p in tmp_path.iterdir()] == [request.key()]   # no temporary folder left


def test_a_failed_download_names_the_command_and_keeps_nothing(tmp_path):
    def failing(command, **kwargs):
        return SimpleNamespace(returncode=1, stdout="", stderr="ERROR: No matching distribution found for torch")

    python = HostPython("/usr/bin/python3", "3.11", "x86_64", "2.36")
    with pytest.raises(GpuprovError, match="pip download failed") as caught:
        wheelhouse_for(request_for(python, "cu128", "2.7", None), tmp_path, run=failing)
    assert "No matching distribution" in caught.value.output and "pip download" in caught.value.command
    assert list(tmp_path.iterdir()) == []


def test_index_credentials_reach_neither_a_command_line_nor_the_manifest(tmp_path):
    seen = []

    def fake_pip(command, env=None, **kwargs):
        seen.append((command, env))
        dest = Path(command[command.index("--dest") + 1])
        (dest / f"pkg{len(seen)}-1.0-py3-none-any.whl").write_bytes(b"x")
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    python = HostPython("/usr/bin/python3", "3.11", "x86_64", "2.36")
    index = "https://ci:s3cr%40t@pypi.example/simple"
    request = request_for(python, "cpu", None, index)
    wheelhouse = wheelhouse_for(request, tmp_path, run=fake_pip)
    assert seen[0][1]["PIP_INDEX_URL"] == index and "PIP_INDEX_URL" not in seen[1][1]
    assert not any("s3cr" in part or "ci:" in part for command, _ in seen for part in command)
    manifest = (wheelhouse.folder / MANIFEST).read_text()
    assert "s3cr" not in manifest and "ci@" not in manifest
    assert json.loads(manifest)["request"]["torch_index"] == "https://pypi.example/simple"
    assert "s3cr" not in wheelhouse.folder.name

    def failing(command, env=None, **kwargs):
        return SimpleNamespace(returncode=1, stdout="", stderr=f"ERROR: 401 from {env['PIP_INDEX_URL']} (s3cr@t)")

    with pytest.raises(GpuprovError) as caught:
        wheelhouse_for(request_for(python, "cu128", None, index), tmp_path, run=failing)
    text = str(caught.value.to_dict())
    assert "s3cr" not in text and "https://pypi.example/simple" in caught.value.command


def test_an_incomplete_wheelhouse_is_not_used(tmp_path):
    folder = tmp_path / "set"
    wheelhouse = tiny_wheelhouse(folder)
    (folder / MANIFEST).write_text('{"files": ' + str(wheelhouse.files).replace("'", '"') + ', "requirements": []}')
    assert load_wheelhouse(folder) is not None
    os.remove(folder / "gpuprov_probe-1.0-py3-none-any.whl")
    assert load_wheelhouse(folder) is None


# ------------------------------------------------------------------------------- torch.compile's toolchain

DEBIAN_12 = Toolchain(os_id="debian", managers=("apt-get",), include="/usr/include/python3.11")
UBUNTU_2204 = Toolchain(os_id="ubuntu", os_like="debian", managers=("apt-get",), include="/usr/include/python3.10",
                        cc="/usr/bin/gcc", cxx="/usr/bin/g++")
ROCKY_9 = Toolchain(os_id="rocky", os_like="rhel centos fedora", managers=("dnf", "yum"),
                    include="/usr/include/python3.9", rpm="python3")
RHEL_9_PY311 = Toolchain(os_id="rhel", os_like="fedora", managers=("dnf",), include="/usr/include/python3.11",
                         rpm="python3.11", cc="/usr/bin/gcc")


def host_python(version: str, toolchain: Toolchain) -> HostPython:
    return HostPython(f"/usr/bin/python{version}", version, "x86_64", "2.36", toolchain=toolchain)


# The packages each distribution names for g++, gcc and the headers of its interpreters (Debian's and Ubuntu's
# archives: g++, gcc, python3.X-dev holding /usr/include/python3.X/Python.h; RHEL 9 / Rocky 9 AppStream: gcc-c++,
# gcc, python3-devel for the platform python3 (3.9) and python3.11-devel for the python3.11 package).
@pytest.mark.parametrize("python,missing,packages,command", [
    (host_python("3.11", DEBIAN_12), ("g++", "gcc", "Python.h"), ("g++", "gcc", "python3.11-dev"),
     "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "
     "g++ gcc python3.11-dev"),
    (host_python("3.10", UBUNTU_2204), ("Python.h",), ("python3.10-dev",),
     "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "
     "python3.10-dev"),
    (host_python("3.9", ROCKY_9), ("g++", "gcc", "Python.h"), ("gcc-c++", "gcc", "python3-devel"),
     "dnf -q -y install --setopt=install_weak_deps=False gcc-c++ gcc python3-devel"),
    (host_python("3.11", RHEL_9_PY311), ("g++", "Python.h"), ("gcc-c++", "python3.11-devel"),
     "dnf -q -y install --setopt=install_weak_deps=False gcc-c++ python3.11-devel"),
], ids=["debian-12", "ubuntu-22.04", "rocky-9", "rhel-9-python3.11"])
def test_the_compiler_plan_names_each_distributions_packages(python, missing, packages, command):
    plan = compiler_plan(python)
    assert (plan.missing, plan.packages, plan.command, plan.refused) == (missing, packages, command, "")


def test_a_complete_toolchain_plans_nothing_and_yum_serves_older_rhel():
    complete = dataclasses.replace(UBUNTU_2204, headers=True)
    assert compiler_plan(host_python("3.10", complete)) == CompilerPlan()
    centos = dataclasses.replace(ROCKY_9, managers=("yum",))
    assert compiler_plan(host_python("3.9", centos)).command.startswith("yum -q -y install ")


@pytest.mark.parametrize("toolchain,why", [
    (Toolchain(os_id="alpine", include="/usr/include/python3.12"),
     "gpuprov installs compilers with apt-get on Debian/Ubuntu and dnf or yum on RHEL-like systems; this host is "
     "alpine with none of them"),
    (dataclasses.replace(ROCKY_9, rpm=None),
     "/usr/bin/python3.9 belongs to no rpm package, so no -devel package has its Python.h (wanted in "
     "/usr/include/python3.9)"),
    (dataclasses.replace(DEBIAN_12, os_id="arch", managers=()),
     "gpuprov installs compilers with apt-get on Debian/Ubuntu and dnf or yum on RHEL-like systems; this host is "
     "arch with none of them"),
])
def test_a_host_whose_package_manager_cannot_install_them_is_refused_with_the_reason(toolchain, why):
    plan = compiler_plan(host_python(toolchain.include.rsplit("python", 1)[1], toolchain))
    assert plan.refused == why and plan.packages == () and plan.command == ""


@pytest.mark.parametrize("only,wanted", [
    (None, True), (("train",), True), (("infer.parity",), True), (("host", "train.compile"), True),
    (("host",), False), (("train.cnn", "perf"), False), (("infer.latency",), False),
])
def test_the_compiler_is_wanted_only_when_a_compile_check_runs(only, wanted):
    assert compiler_wanted(only) is wanted


class ScriptedConn(LocalConn):
    """Commands matching a key of `answers` get its (rc, stderr) in turn; every other command runs for real."""

    def __init__(self, answers: dict[str, list[tuple[int, str]]]):
        super().__init__()
        self.answers = answers
        self.scripted: list[str] = []

    def run(self, command, *, sudo=False, timeout=None, stdin=None):
        for key, replies in self.answers.items():
            if key in command:
                self.scripted.append(command)
                rc, err = replies.pop(0)
                return Result(command, rc, "", err, 0.0)
        return super().run(command, sudo=sudo, timeout=timeout, stdin=stdin)


@pytest.mark.root
def test_the_compiler_is_installed_once_and_checked_where_torch_looks(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    os.makedirs(layout.root, mode=0o755)
    conn = ScriptedConn({"apt-get": [(0, "")]})
    done = ensure_compiler(Remote(conn), host_python("3.11", DEBIAN_12), layout)
    assert done["installed"] == ["g++", "gcc", "python3.11-dev"] and done["refused"] == ""
    [install] = conn.scripted
    # what is checked after the install is what TorchInductor uses: g++ and gcc on the system PATH, Python.h in the
    # interpreter's include folder
    assert "command -v g++" in install and "test -f /usr/include/python3.11/Python.h" in install
    cache = os.stat(f"{layout.root}/cache")
    assert (cache.st_uid, oct(cache.st_mode & 0o777)) == (0, "0o700")
    # the next run finds everything (probed again) and installs nothing
    conn = ScriptedConn({"apt-get": []})
    again = ensure_compiler(Remote(conn), host_python("3.11", dataclasses.replace(
        DEBIAN_12, cc="/usr/bin/gcc", cxx="/usr/bin/g++", headers=True)), layout)
    assert again["installed"] == [] and again["missing"] == [] and conn.scripted == []


@pytest.mark.root
def test_packages_no_source_offers_are_looked_for_once_more_then_refused_with_apts_words(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    os.makedirs(layout.root, mode=0o755)
    missing = "E: Unable to locate package python3.11-dev"
    conn = ScriptedConn({"apt-get -q -o DPkg::Lock::Timeout=300 update": [(0, "")],
                         "install --no-install-recommends": [(100, missing), (100, missing)]})
    said = []
    done = ensure_compiler(Remote(conn), host_python("3.11", DEBIAN_12), layout, say=said.append)
    assert [c.split("\n")[1] if "\n" in c else c for c in conn.scripted] == [
        "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "
        "g++ gcc python3.11-dev", "apt-get -q -o DPkg::Lock::Timeout=300 update",
        "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "
        "g++ gcc python3.11-dev"]
    assert done["installed"] == [] and done["refused"].endswith(f"failed (exit 100): {missing}")
    assert said[-1] == f"torch.compile's toolchain not installed: {done['refused']}"


@pytest.mark.root
def test_a_refused_plan_runs_no_package_manager(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    os.makedirs(layout.root, mode=0o755)
    conn = ScriptedConn({"apt-get": [], "dnf": [], "yum": []})
    done = ensure_compiler(Remote(conn), host_python("3.12", Toolchain(os_id="alpine")), layout)
    assert done["refused"].startswith("gpuprov installs compilers with apt-get") and done["installed"] == []
    assert conn.scripted == []


def test_the_probe_reports_this_machines_toolchain_as_its_own_tools_see_it(tmp_path):
    python = probe_host(Remote(LocalConn()), Layout(root=str(tmp_path / "opt")))
    tools = python.toolchain
    path = "/usr/sbin:/usr/bin:/sbin:/bin"
    assert tools.cxx == shutil.which("g++", path=path) and tools.cc == (shutil.which("gcc", path=path)
                                                                       or shutil.which("cc", path=path))
    config = shutil.which(f"python{python.version}-config", path=path)
    if config:   # the distribution's own answer to "where are this Python's headers"
        includes = subprocess.run([config, "--includes"], capture_output=True, text=True, check=True).stdout.split()
        assert f"-I{tools.include}" in includes
    assert tools.headers == os.path.isfile(os.path.join(tools.include, "Python.h"))
    release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    assert tools.os_id == release["ID"].strip('"')
    assert ("apt-get" in tools.managers) == bool(shutil.which("apt-get", path=path))


@pytest.mark.root
def test_the_venv_is_byte_compiled_and_its_phases_timed(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    remote = Remote(LocalConn())
    done = ensure_env(remote, probe_host(remote, layout), tiny_wheelhouse(tmp_path / "set"), layout)
    assert set(done["seconds"]) == {"stage", "upload", "install"} and all(v >= 0 for v in done["seconds"].values())
    compiled = list(Path(layout.venv).glob("lib/python*/site-packages/gpuprov_probe/__pycache__/__init__.*.pyc"))
    assert len(compiled) == 1   # imports with -B read it: nothing compiled again on every run


# ------------------------------------------------------------------ TorchInductor's cache, root's alone

@pytest.mark.root
def test_torchinductor_keeps_kernels_only_in_a_folder_this_user_alone_can_change(tmp_path, monkeypatch):
    import tempfile

    from gpuprov.smoke.torchutil import private_cache

    for name in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    root = tmp_path / "opt"
    (root / "cache").mkdir(parents=True, mode=0o700)
    root.chmod(0o755)
    with private_cache(str(root)) as folder:
        assert folder == os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(root / "cache" / "torchinductor")
        assert tempfile.gettempdir() == os.environ["TMPDIR"] == str(root / "cache")
    (root / "cache").chmod(0o777)            # another user could plant kernels there: not used
    with private_cache(str(root)) as folder:
        private = tempfile.gettempdir()
        assert not folder.startswith(str(root)) and folder == os.path.join(private, "torchinductor")
        assert os.stat(private).st_mode & 0o077 == 0 and os.stat(private).st_uid == os.geteuid()
    with private_cache(str(root)) as again:   # one folder per process: torch keeps its first header folder
        assert again == folder
    (root / "cache").chmod(0o700)
    os.chown(root / "cache", 65534, -1)      # nobody's
    with private_cache(str(root)) as folder:
        assert not folder.startswith(str(root))


def test_the_private_temporary_folder_is_gone_when_its_process_ends(tmp_path):
    script = "\n".join([
        "import os, sys, tempfile", "from gpuprov.smoke.torchutil import private_cache",
        "with private_cache('/nonexistent'):", "    private = tempfile.gettempdir()",
        "print(private, flush=True)", "pid = os.fork()",
        "if pid == 0:", "    raise SystemExit(0)",      # the child's exit runs the inherited exit handlers
        "os.waitpid(pid, 0)", "print(os.path.isdir(private))"])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")})
    private, kept_after_child = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert kept_after_child == "True"            # a forked child that ends leaves its parent's folder alone
    assert not os.path.exists(private)           # gone once the process that made it ended


@pytest.mark.tool
@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ here: torch.compile cannot run on the CPU")
def test_two_compiles_in_one_process_share_its_private_folder():
    """torch fixes its precompiled-header folder at its first compile: a second compile in the same process (two
    compile checks run in one interpreter) must find it (it failed with `-include ...: No such file`)."""
    pytest.importorskip("torch")
    script = ("import torch\nfrom gpuprov.smoke.torchutil import private_cache\n"
              "for n in (1, 2):\n    with private_cache('/nonexistent'):\n"
              "        print(float(torch.compile(lambda x: (x.sin() * n).relu().sum())(torch.ones(8))))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert [round(float(v), 4) for v in done.stdout.split()] == [round(8 * math.sin(1), 4), round(16 * math.sin(1), 4)]


@pytest.mark.tool
@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ here: torch.compile cannot run on the CPU")
def test_the_compile_checks_leave_nothing_in_the_shared_temporary_folder(tmp_path):
    """torch builds /tmp/torchinductor_<user> from tempfile's folder and loads compiled kernels from it; the compile
    checks must keep everything in a private folder: a shared temporary folder (here an empty TMPDIR) gets no file
    (the runner's import of torch._dynamo, before any check, makes the empty folder only)."""
    pytest.importorskip("torch")
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"host": "local", "level": "quick", "expect": {}, "datasheet": {},
                                  "gpus_visible": False}))
    environment = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"} | {"TMPDIR": str(shared)}
    done = subprocess.run([sys.executable, "-m", "gpuprov.smoke", "--config", str(config), "--only", "infer.parity"],
                          capture_output=True, text=True, timeout=900, env=environment,
                          cwd=Path(__file__).resolve().parents[2])
    [found] = json.loads(done.stdout)["results"]
    assert found["status"] == "pass" and found["figures"]["compared"] == ["compile", "onnx"], found["reason"]
    assert [str(path) for path in shared.rglob("*") if not path.is_dir()] == []


def test_the_dry_run_says_what_the_environment_step_would_do(tmp_path):
    wheelhouse = tiny_wheelhouse(tmp_path / "set")
    python = host_python("3.11", DEBIAN_12)
    plan = env_plan(python, wheelhouse, None, Layout(root="/opt/gpuprov"))
    assert plan["build"] is True and plan["wheels"] == 2
    assert plan["compiler"]["packages"] == ["g++", "gcc", "python3.11-dev"]
    assert plan_lines("gpu01", {"mode": "venv", "request": "cp311-x86_64", **plan}) == [
        "gpu01: /opt/gpuprov/venv: build from 2 wheels (cp311-x86_64; root's wheelhouse takes the ones it lacks over "
        "SFTP)",
        "gpu01: torch.compile: install g++ gcc python3.11-dev: DEBIAN_FRONTEND=noninteractive apt-get -q -y -o "
        "DPkg::Lock::Timeout=300 install --no-install-recommends g++ gcc python3.11-dev"]
    built = dataclasses.replace(python, marker=wheelhouse.digest(python), toolchain=dataclasses.replace(
        DEBIAN_12, cc="/usr/bin/gcc", cxx="/usr/bin/g++", headers=True))
    again = env_plan(built, wheelhouse, ("train",))
    assert plan_lines("gpu01", {"mode": "venv", "request": "k", **again}) == [
        f"gpu01: /opt/gpuprov/venv: kept (built from this wheel set, {wheelhouse.digest(built)[:12]})",
        "gpu01: torch.compile: g++, gcc and Python.h are there"]
    assert "compiler" not in env_plan(python, wheelhouse, ("host",))   # no compile check selected: not asked
    alpine = env_plan(host_python("3.12", Toolchain(os_id="alpine")), wheelhouse, None)
    assert plan_lines("gpu02", {"mode": "venv", "request": "k", **alpine})[1] == (
        "gpu02: torch.compile: cannot install g++, gcc, Python.h: gpuprov installs compilers with apt-get on "
        "Debian/Ubuntu and dnf or yum on RHEL-like systems; this host is alpine with none of them")
