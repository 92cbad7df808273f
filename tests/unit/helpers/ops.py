"""Builders for the ops tests: stacks, repositories and host facts, by hand (the ops tests do not depend on the
resolver)."""

from __future__ import annotations

from gpuprov.provision.ops import MANAGED_FILES, OpContext, RepoSpec, container_toolkit, kernel, pins, sources
from gpuprov.stack import families

FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"
KERNEL = {"debian": "6.1.0-18-amd64", "rhel": "5.14.0-427.13.1.el9_4.x86_64"}
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def pkgs(*pairs: tuple[str, str]) -> list[dict]:
    return [{"name": name, "version": version} for name, version in pairs]


def make_stack(family: str = "debian", *, branch: str = "570", version: str = "570.148.08",
               flavor: str = "open", nvswitch: bool = False, forward_compat: bool = False,
               fourth_gen: bool = False) -> dict:
    """A resolved stack (Stack.to_dict() shape) for an H100 host (a B200 with `fourth_gen`)."""
    deb = family == "debian"
    if deb:
        meta = f"nvidia-open-{branch}" if flavor == "open" else f"cuda-drivers-{branch}"
        driver = pkgs((meta, f"{version}-1ubuntu1"))
        fm = pkgs((f"nvidia-fabricmanager-{branch}", f"{version}-1"))
        nscq = pkgs((f"libnvidia-nscq-{branch}", f"{version}-1"))
        nccl = pkgs(("libnccl2", "2.26.5-1+cuda12.9"), ("libnccl-dev", "2.26.5-1+cuda12.9"))
        dcgm = pkgs(("datacenter-gpu-manager-4-core", "1:4.2.3-1"), ("datacenter-gpu-manager-4-cuda12", "1:4.2.3-1"))
        compat = ("cuda-compat-12-8", "570.124.06-1ubuntu1")
    else:
        kmod = "kmod-nvidia-open-dkms" if flavor == "open" else "kmod-nvidia-latest-dkms"
        driver = pkgs(("nvidia-driver", f"{version}-1.el9"), (kmod, f"{version}-1.el9"))
        fm = pkgs(("nvidia-fabric-manager", f"{version}-1"))
        nscq = pkgs((f"libnvidia-nscq-{branch}", f"{version}-1"))
        nccl = pkgs(("libnccl", "2.26.5-1+cuda12.9"), ("libnccl-devel", "2.26.5-1+cuda12.9"))
        dcgm = pkgs(("datacenter-gpu-manager-4-core", "4.2.3-1"), ("datacenter-gpu-manager-4-cuda12", "4.2.3-1"))
        compat = ("cuda-compat-12-8", "570.124.06-1.el9")
    cuda = pkgs(("cuda-toolkit-12-8", "12.8.1-1")) + (pkgs(compat) if forward_compat else [])
    ctk = pkgs(*[(name, "1.17.8-1") for name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                                   "libnvidia-container-tools", "libnvidia-container1")])
    gpu = ({"model": "B200", "arch": "blackwell", "compute_capability": "10.0", "datacenter": True} if fourth_gen
           else {"model": "H100-SXM", "arch": "hopper", "compute_capability": "9.0", "datacenter": True})
    return {
        "gpu": gpu,
        "os": "debian-12" if deb else "rhel-9",
        "driver": {"branch": branch, "version": version, "kernel_modules": flavor, "packages": driver},
        "cuda": {"version": "12.8", "packages": cuda}, "forward_compat": forward_compat,
        "nccl": {"version": "2.26.5", "packages": nccl},
        "container_toolkit": {"version": "1.17.8", "packages": ctk},
        "fabricmanager": {"version": version, "packages": fm} if nvswitch else None,
        "dcgm": {"version": "4.2.3", "packages": dcgm},
        "ngc_pytorch": None, "pytorch": None,
        "nscq": {"version": version, "packages": nscq} if nvswitch else None,
        "nvlsm": {"version": "2025.10.11", "packages": pkgs(("nvlsm", "2025.10.11-1"))} if fourth_gen else None,
    }


def make_repo(**overrides) -> RepoSpec:
    values = {"url": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/",
              "key_url": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub",
              "key_data": None, "fingerprint": FPR, "proxy": None, "ca_pem": None, "label": "NVIDIA CUDA"}
    values.update(overrides)
    return RepoSpec(**values)


def bare_facts(family: str = "debian") -> dict:
    """A freshly installed host: no NVIDIA software, no managed files, no headers."""
    return {
        "host": "gpu01",
        "os": {"id": "debian" if family == "debian" else "rhel", "family": family,
               "key": "debian-12" if family == "debian" else "rhel-9"},
        "kernel": KERNEL[family], "arch": "x86_64",
        "loaded_driver_version": None, "packages": {}, "held": [],
        "nouveau_loaded": True, "kernel_headers": False,
        "docker": None, "services": {}, "files": dict.fromkeys(MANAGED_FILES),
        "dkms_status": None, "kernels_installed": [KERNEL[family]],
    }


def all_packages(stack: dict) -> dict[str, str]:
    return {p["name"]: p["version"] for section in pins.SECTIONS if stack.get(section)
            for p in stack[section]["packages"]}


# What a driver metapackage pulls in besides itself: packages built from the driver, at its version.
DRIVER_DEPS = {"debian": {"libnvidia-compute-{branch}": "{version}-0ubuntu1",
                          "nvidia-kernel-common-{branch}": "{version}-0ubuntu1",
                          "xserver-xorg-video-nvidia-{branch}": "{version}-0ubuntu1"},
               "rhel": {"nvidia-driver-cuda-libs": "3:{version}-1.el9", "nvidia-kmod-common": "3:{version}-1.el9",
                        "xorg-x11-nvidia": "3:{version}-1.el9"}}


HEADERS = {"debian": {"linux-headers-amd64": "6.1.76-1", "dkms": "3.0.10-8+deb12u1"},
           "rhel": {"kernel-devel-matched": "5.14.0-427.13.1.el9_4", "kernel-headers": "5.14.0-427.13.1.el9_4",
                    "dkms": "3.1.4-1.el9"}}


def provisioned_facts(family: str, stack: dict, repo: RepoSpec) -> dict:
    """A host gpuprov has provisioned and rebooted: what facts show after a complete run."""
    facts = bare_facts(family)
    driver = stack["driver"]
    installed = {**all_packages(stack), **{name.format(**driver): version.format(**driver)
                                           for name, version in DRIVER_DEPS[family].items()}}
    facts.update(loaded_driver_version=driver["version"], kernel_headers=True, nouveau_loaded=False,
                 packages={**installed, **HEADERS[family]}, held=sorted(installed) if family == "debian" else [],
                 dkms_status=[f"nvidia/{driver['version']}, {KERNEL[family]}, x86_64: installed"])
    up = {"exists": True, "enabled": True, "active": True}
    facts["services"] = {"nvidia-dcgm": dict(up), "nvidia-persistenced": dict(up),
                         "nvidia-fabricmanager": dict(up)}
    files = facts["files"]
    files[sources.KEY_STAMP] = FPR + "\n"
    files[container_toolkit.DEV_CHAR_RULE] = container_toolkit.DEV_CHAR_CONTENT
    files[container_toolkit.CDI_SPEC] = f"hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{stack['driver']['version']}\n"
    files[kernel.NOUVEAU_BLACKLIST] = kernel.BLACKLIST_CONTENT
    url, url_login = bare(repo.url)
    proxy, proxy_login = bare(repo.proxy) if repo.proxy else (None, None)
    if repo.ca_pem:
        files[sources.DEB_CA if family == "debian" else sources.RHEL_CA] = repo.ca_pem
    if family == "debian":
        files[sources.APT_KEYRING] = "\x99binary keyring"
        files[sources.APT_LIST] = f"# {sources.HEADER}\ndeb [signed-by={sources.APT_KEYRING}] {url} /\n"
        if proxy:
            files[sources.APT_PROXY] = (f"// {sources.HEADER}\nAcquire::http::Proxy \"{proxy}\";\n"
                                        f"Acquire::https::Proxy \"{proxy}\";\n")
        logins = [(url, url_login), (proxy, proxy_login)]
        files[sources.APT_AUTH] = "".join(f"machine {where.rstrip('/')} login {who[0]} password {who[1]}\n"
                                          for where, who in logins if who) or None
        files[pins.APT_PREFERENCES] = pins.preferences(pins.pinned_packages(ctx_for(facts, stack, repo)),
                                                       driver["version"], repo.label)
        files[families.UNATTENDED] = families.unattended()
    else:
        files[sources.RPM_KEY] = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n"
        files[sources.DNF_REPO] = (
            f"# {sources.HEADER}\n# module_hotfixes: exact versions install without enabling a module stream.\n"
            f"[gpuprov-nvidia]\nname=NVIDIA CUDA repository (gpuprov)\nbaseurl={url}\nenabled=1\n"
            f"gpgcheck=1\ngpgkey=file://{sources.RPM_KEY}\nmodule_hotfixes=1\n"
            + (f"username={url_login[0]}\npassword={url_login[1]}\n" if url_login else "")
            + (f"proxy={proxy}\n" if proxy else "")
            + (f"proxy_username={proxy_login[0]}\nproxy_password={proxy_login[1]}\n" if proxy_login else ""))
        files[pins.VERSIONLOCK_LIST] = "".join(f"{name}-{version if ':' in version else '0:' + version}.*\n"
                                               for name, version in installed.items())
    return facts


def bare(url: str) -> tuple[str, tuple[str, str] | None]:
    """A URL without `user:password@`, and the login it carried."""
    scheme, rest = url.split("://", 1)
    if "@" not in rest.split("/", 1)[0]:
        return url, None
    login, _, rest = rest.partition("@")
    return f"{scheme}://{rest}", tuple(login.split(":", 1))


def ctx_for(facts: dict, stack: dict | None = None, repo: RepoSpec | None = None, **kwargs) -> OpContext:
    family = facts["os"]["family"]
    return OpContext(host="gpu01", facts=facts, stack=stack or make_stack(family), repo=repo or make_repo(),
                     **kwargs)

