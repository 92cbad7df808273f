"""The CUDA toolkit held as a whole: a lab host provisioned with its lock over real SSH through the lab mirror,
which carries a newer patch release of the locked toolkit (`standins.newer_cuda_release`, 13.2.99 beside the
lock's 13.2.1, every part newer), as NVIDIA's repository keeps every release.

apt is the judge: the parts installed are the locked release's (each below the newer release's version that
apt lists beside it), `apt-get -s dist-upgrade` moves none of them, and without gpuprov's holds and pins it would.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from labutil import ROOT, invoke, invoke_json, on_host

pytestmark = pytest.mark.lab
PROFILE = "l40s"
PINS = "/etc/apt/preferences.d/gpuprov-nvidia"
NVIDIA = ("cuda", "nvidia", "libnvidia", "libcu", "libnccl", "nsight", "gds-tools")
INST = re.compile(r"^Inst (\S+)(?: \[(\S+)\])? \((\S+) ", re.M)  # name, installed version (if any), new


@pytest.fixture(scope="module")
def locked_host(lab, tmp_path_factory):
    """(lab, host name, CLI environment, the lock's stack) after `invoke stack.lock` and a provision with it."""
    from gpuprov.lab.state import LabPaths

    folder = tmp_path_factory.mktemp("cuda-hold")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    name = next(h.name for h in lab.hosts if h.profile == PROFILE)
    inventory = str(LabPaths(ROOT).inventory)
    invoke("stack.lock", "--host", name, "--inventory", inventory, env=env)
    lock = yaml.safe_load((Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{name}.lock.yaml").read_text())
    [run] = invoke_json("provision", "--inventory", inventory, "--host", name, env=env)["hosts"]
    assert run["status"] == "changed" and run["mismatches"] == [], run.get("error")
    assert run["lock"] and run["stack"]["cuda"] == lock["stack"]["cuda"]
    return lab, name, env, inventory, lock["stack"]


def toolkit(stack: dict) -> tuple[str, str, str]:
    """(cuda-toolkit-X-Y, its locked version, the family suffix X-Y)."""
    [pkg] = [p for p in stack["cuda"]["packages"] if p["name"].startswith("cuda-toolkit-")]
    return pkg["name"], pkg["version"], pkg["name"].removeprefix("cuda-toolkit-")


def installed(lab, name: str) -> dict[str, tuple[str, bool]]:
    """name -> (version, held) of every installed package."""
    out = on_host(lab, name, "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'")
    return {f[1]: (f[2], f[0].startswith("h")) for f in (line.split() for line in out.splitlines())
            if f[0] in ("ii", "hi")}


def versions(lab, name: str, package: str) -> list[str]:
    """The versions apt lists for `package` (apt-cache madison)."""
    out = on_host(lab, name, f"apt-cache madison {package}")
    return [line.split("|")[1].strip() for line in out.splitlines() if line.split("|")[0].strip() == package]


def newer(lab, name: str, a: str, b: str) -> bool:
    return on_host(lab, name, f"dpkg --compare-versions {a} gt {b} && echo yes || true").strip() == "yes"


def test_provision_with_the_lock_installs_exactly_the_locked_release_though_a_newer_one_is_published(locked_host):
    lab, name, _, _, stack = locked_host
    meta, version, suffix = toolkit(stack)
    published = versions(lab, name, meta)
    assert version in published and any(newer(lab, name, v, version) for v in published), published
    now = installed(lab, name)
    assert now[meta][0] == version
    # every package of the release the toolkit pulls (apt's own recursive view of what is installed)
    depends = on_host(lab, name, f"apt-cache depends --recurse --installed --no-recommends --no-suggests "
                                 f"--no-conflicts --no-breaks --no-replaces --no-enhances {meta}")
    family = sorted({line.strip() for line in depends.splitlines()
                     if not line.startswith(" ") and line.strip().endswith(f"-{suffix}")} - {meta})
    assert {"cuda-compiler", "cuda-nvcc", "cuda-libraries", "libcublas"} <= {f.rsplit("-", 2)[0] for f in family}
    for package in family:
        listed = versions(lab, name, package)
        assert len(listed) >= 2, (package, listed)  # the locked release's and the newer release's
        assert all(not newer(lab, name, now[package][0], v) for v in listed)
        assert any(newer(lab, name, v, now[package][0]) for v in listed)
        assert now[package][1], f"{package} is not held"


def test_dist_upgrade_moves_no_package_of_the_toolkit_and_would_without_holds_and_pins(locked_host):
    lab, name, _, _, stack = locked_host
    meta, _, suffix = toolkit(stack)
    on_host(lab, name, "apt-get update -qq")
    for command in ("apt-get -s dist-upgrade", "apt-get -s upgrade"):
        moved = INST.findall(on_host(lab, name, command))
        assert not [m for m in moved if m[0].startswith(NVIDIA) or f"-{suffix}" in m[0]], moved
    family = [p for p, (_, held) in installed(lab, name).items() if held and re.search(f"-{suffix}(-|$)", p)]
    try:
        on_host(lab, name, f"apt-mark unhold {' '.join(family)} >/dev/null && mv {PINS} /root/gpuprov-pins")
        moved = {m[0]: (m[1], m[2]) for m in INST.findall(on_host(lab, name, "apt-get -s dist-upgrade"))}
        assert meta in moved and f"cuda-compiler-{suffix}" in moved and f"cuda-nvcc-{suffix}" in moved, moved
    finally:
        on_host(lab, name, f"mv /root/gpuprov-pins {PINS}; apt-mark hold {' '.join(family)} >/dev/null")


def test_stack_check_reports_an_unheld_part_and_provision_holds_it_again(locked_host):
    lab, name, env, inventory, stack = locked_host
    _, _, suffix = toolkit(stack)
    assert invoke_json("stack.check", "--host", name, "--inventory", inventory, env=env)[name]["mismatches"] == []
    on_host(lab, name, f"apt-mark unhold libcublas-{suffix} cuda-nvcc-{suffix} >/dev/null")
    found = invoke_json("stack.check", "--host", name, "--inventory", inventory, check_code=1,
                        env=env)[name]["mismatches"]
    assert sorted(m["what"] for m in found) == [f"package cuda-nvcc-{suffix} hold",
                                                f"package libcublas-{suffix} hold"]
    [run] = invoke_json("provision", "--inventory", inventory, "--host", name, env=env)["hosts"]
    assert run["status"] == "changed" and run["mismatches"] == []
    assert invoke_json("stack.check", "--host", name, "--inventory", inventory, env=env)[name]["mismatches"] == []
    [again] = invoke_json("provision", "--inventory", inventory, "--host", name, env=env)["hosts"]
    assert (again["status"], again["plan"]["changes"]) == ("unchanged", [])
