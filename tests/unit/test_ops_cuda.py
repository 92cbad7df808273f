"""CUDA toolkit at the exact version with every package of its release (resolved on the host, judged by a real
apt-cache over a repository like NVIDIA's); forward-compat package only when the stack asks for it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest
from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, pkgs, provisioned_facts

from gpuprov.core.errors import GpuprovError
from gpuprov.provision.ops import cuda
from gpuprov.stack import families


def plan(facts, stack):
    return list(cuda.changes(ctx_for(facts, stack)))


def test_rhel_bare_host_installs_the_toolkit():
    [change] = plan(bare_facts("rhel"), make_stack("rhel"))
    assert shlex.split(change.commands[-1])[-1] == "cuda-toolkit-12-8-12.8.1-1" and not change.reboot


# Two releases of one toolkit as NVIDIA's repository carries them: metapackages at the release's version
# depending on their parts by a minimum version (the parts' own versions: cuda-cudart 12.8.57 / 12.8.90, nvcc
# 12.8.61 / 12.8.93, libcublas 12.8.3.14 / 12.8.4.1, as NVIDIA's 12.8.0 / 12.8.1 images install them), config
# packages depended on without a version, a distribution package (libc6) outside the family.
def _stanza(name, version, depends=""):
    return (f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
            + (f"Depends: {depends}\n" if depends else "") + f"Filename: pool/{name}_{version}.deb\nSize: 1\n"
            f"Description: {name}\n")


RELEASES = {"12.8.0": {"cuda-cudart-12-8": "12.8.57", "cuda-nvcc-12-8": "12.8.61", "libcublas-12-8": "12.8.3.14"},
            "12.8.1": {"cuda-cudart-12-8": "12.8.90", "cuda-nvcc-12-8": "12.8.93", "libcublas-12-8": "12.8.4.1"}}


def nvidia_like_repository() -> str:
    stanzas = [_stanza("libc6", "2.36-9"), _stanza("cuda-toolkit-config-common", "12.8.57-1"),
               _stanza("cuda-toolkit-config-common", "12.8.90-1")]
    for release, parts in RELEASES.items():
        v = {name: f"{version}-1" for name, version in parts.items()}
        stanzas += [
            _stanza("cuda-toolkit-12-8", f"{release}-1", f"cuda-compiler-12-8 (>= {release}), cuda-libraries-12-8 "
                    f"(>= {release}), cuda-toolkit-config-common"),
            _stanza("cuda-compiler-12-8", f"{release}-1", f"cuda-nvcc-12-8 (>= {parts['cuda-nvcc-12-8']})"),
            _stanza("cuda-libraries-12-8", f"{release}-1", f"cuda-cudart-12-8 (>= {parts['cuda-cudart-12-8']}), "
                    f"libcublas-12-8 (>= {parts['libcublas-12-8']})"),
            _stanza("cuda-nvcc-12-8", v["cuda-nvcc-12-8"], "libc6 (>= 2.17)"),
            _stanza("cuda-cudart-12-8", v["cuda-cudart-12-8"]),
            _stanza("libcublas-12-8", v["libcublas-12-8"])]
    return "\n".join(stanzas)


def _tool(folder, name, script):
    (folder / name).write_text("#!/bin/sh\n" + script)
    (folder / name).chmod(0o755)


def run_on_apt(tmp_path, command, installed="", held=()):
    """Run `command` with the real apt-cache over nvidia_like_repository() (dpkg status: `installed` stanzas),
    apt-get simulating (`-s`) and recording its arguments, apt-mark recording its own; returns (process,
    apt-get's arguments, apt-mark's calls)."""
    if shutil.which("apt-get") is None:
        pytest.skip("needs apt (a Debian/Ubuntu controller)")
    repo, state, bin_dir = tmp_path / "repo", tmp_path / "state", tmp_path / "bin"
    for folder in (repo, state / "lists" / "partial", tmp_path / "cache" / "archives" / "partial", bin_dir,
                   tmp_path / "parts"):
        folder.mkdir(parents=True, exist_ok=True)
    (repo / "Packages").write_text(nvidia_like_repository())
    (state / "status").write_text(installed)
    (tmp_path / "sources.list").write_text(f"deb [trusted=yes] file:{repo} /\n")
    config = tmp_path / "apt.conf"
    config.write_text(f'Dir::State "{state}";\nDir::State::status "{state}/status";\nDir::Cache "{tmp_path}/cache";\n'
                      f'Dir::Etc::sourcelist "{tmp_path}/sources.list";\nDir::Etc::sourceparts "{tmp_path}/parts";\n'
                      f'Dir::Etc::preferencesparts "{tmp_path}/parts";\nAPT::Architecture "amd64";\n'
                      'Debug::NoLocking "true";\nAPT::Sandbox::User "";\n')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "APT_CONFIG": str(config)}
    real = shutil.which("apt-get", path="/usr/bin:/bin")
    subprocess.run([real, "update"], env=env, check=True, capture_output=True)
    _tool(bin_dir, "apt-get", f'echo "$@" > {tmp_path}/apt-get.log\nexec {real} -s "$@"\n')
    # apt-mark records its call and lifts holds in the dpkg status apt reads
    _tool(bin_dir, "apt-mark", f'echo "$@" >> {tmp_path}/apt-mark.log\ncase " $* " in *" unhold "*) ;; *) exit 0;; '
          'esac\nfor n in ${*##* unhold }; do awk -v n="$n" \'/^Package: /{p=($2==n)} p && /^Status: hold/'
          f'{{sub(/^Status: hold/, "Status: install")}} {{print}}\' {state}/status > {state}/status.new && '
          f'mv {state}/status.new {state}/status; done\n')
    listing = "".join(f"{'hi' if name in held else 'ii'}  {name}\\n" for name in re.findall(
        r"^Package: (.+)$", installed, re.M))
    _tool(bin_dir, "dpkg-query", f"printf '{listing}'\n")
    proc = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
    log = tmp_path / "apt-get.log"
    marks = tmp_path / "apt-mark.log"
    return (proc, log.read_text().split() if log.exists() else [],
            [line.split() for line in marks.read_text().splitlines()] if marks.exists() else [])


def _specs(args: list[str]) -> set[str]:
    """The `name=version` words of an apt-get command line (not its `-o` options)."""
    return {word for word in args if re.fullmatch(r"[a-z0-9][a-z0-9+.-]*=[0-9][^=]*", word)}


def _release(release: str) -> set[str]:
    return ({f"cuda-toolkit-12-8={release}-1", f"cuda-compiler-12-8={release}-1", f"cuda-libraries-12-8={release}-1",
             "cuda-toolkit-config-common=12.8.90-1"}
            | {f"{name}={version}-1" for name, version in RELEASES[release].items()})


@pytest.mark.tool
def test_a_locked_release_installs_with_its_own_parts_though_a_newer_release_is_in_the_repository(tmp_path):
    stack = make_stack()
    stack["cuda"]["packages"] = pkgs(("cuda-toolkit-12-8", "12.8.0-1"))
    [change] = plan(bare_facts(), stack)
    assert "with every package of its release" in change.summary
    proc, args, _ = run_on_apt(tmp_path, change.commands[-1])
    assert proc.returncode == 0, proc.stderr
    specs = _specs(args)
    assert specs == _release("12.8.0")
    # apt itself, simulating the transaction: every part at 12.8.0's version, libc6 left to apt
    installs = dict(re.findall(r"^Inst (\S+) \((\S+)", proc.stdout, re.M))
    assert installs == {**{spec.split("=")[0]: spec.split("=")[1] for spec in specs}, "libc6": "2.36-9"}
    # apt alone, asked for the toolkit at 12.8.0, takes the newer release's parts
    alone, _, _ = run_on_apt(tmp_path, "apt-get install cuda-toolkit-12-8=12.8.0-1")
    assert re.search(r"^Inst cuda-nvcc-12-8 \(12\.8\.93-1", alone.stdout, re.M), alone.stdout


@pytest.mark.tool
def test_moving_the_release_lifts_the_holds_of_the_old_release_first(tmp_path):
    installed = "".join(f"Package: {name}\nStatus: hold ok installed\nVersion: {version}\nArchitecture: amd64\n"
                        "Description: x\n\n" for name, version in (
                            ("cuda-toolkit-12-8", "12.8.0-1"), ("cuda-nvcc-12-8", "12.8.61-1"), ("bash", "5.2-2")))
    facts = bare_facts()
    facts["packages"] = {"cuda-toolkit-12-8": "12.8.0-1", "cuda-nvcc-12-8": "12.8.61-1"}
    [change] = plan(facts, make_stack())
    proc, args, marks = run_on_apt(tmp_path, change.commands[-1], installed,
                                   held=("cuda-toolkit-12-8", "cuda-nvcc-12-8", "bash"))
    assert proc.returncode == 0, proc.stderr
    assert marks and marks[0][-3:] == ["unhold", "cuda-nvcc-12-8", "cuda-toolkit-12-8"]
    assert _specs(args) == _release("12.8.1")


@pytest.mark.tool
def test_a_part_of_the_release_missing_from_the_repository_fails_before_apt_runs(tmp_path):
    stack = make_stack()
    stack["cuda"]["packages"] = pkgs(("cuda-toolkit-12-8", "12.8.0-1"))
    [change] = plan(bare_facts(), stack)
    command = change.commands[-1].replace("cuda-toolkit-12-8=12.8.0-1", "cuda-toolkit-12-8=12.8.7-1")
    proc, args, marks = run_on_apt(tmp_path, command)
    assert proc.returncode != 0 and args == [] and marks == []
    assert "cuda-toolkit-12-8=12.8.7-1 is not in the repository" in proc.stderr


def test_forward_compat_installs_the_compat_package():
    [change] = plan(bare_facts(), make_stack(forward_compat=True))
    assert "cuda-compat-12-8=570.124.06-1ubuntu1" in change.commands[-1]
    [change] = plan(bare_facts("rhel"), make_stack("rhel", forward_compat=True))
    assert "cuda-compat-12-8-570.124.06-1.el9" in shlex.split(change.commands[-1])


def test_forward_compat_without_a_compat_package_in_the_stack_fails():
    stack = make_stack(forward_compat=True)
    stack["cuda"]["packages"] = stack["cuda"]["packages"][:1]
    with pytest.raises(GpuprovError, match="lists no cuda-compat-12-8"):
        plan(bare_facts(), stack)


def test_compat_libraries_not_wanted_any_more_are_removed():
    stack = make_stack()
    facts = provisioned_facts("debian", stack, make_repo())
    facts["packages"]["cuda-compat-12-4"] = "550.54.15-1"
    [change] = plan(facts, stack)
    assert "remove cuda-compat-12-4 550.54.15-1" in change.summary
    assert "cuda-compat-12-4-" in shlex.split(change.commands[-1])


def test_in_state_cuda_changes_nothing():
    stack = make_stack(forward_compat=True)
    assert plan(provisioned_facts("debian", stack, make_repo()), stack) == []


@pytest.mark.parametrize("name,member", [
    ("cuda-compiler-12-8", True), ("libcublas-dev-12-8", True), ("gds-tools-12-8", True),
    ("cuda-toolkit-12-8-config-common", True), ("cuda-toolkit-12-config-common", True),
    ("cuda-toolkit-config-common", True), ("nsight-compute-2025.1.0", True), ("cuda-toolkit-12-8", True),
    ("cuda-compiler-12-6", False), ("cuda-toolkit-13-config-common", False), ("libnccl2", False),
    ("cuda-drivers-570", False), ("gcc-12", False), ("libcublas-12-80", False)])
def test_the_toolkit_family_by_name(name, member):
    assert families.in_family(name, families.family_pattern(make_stack())) is member
