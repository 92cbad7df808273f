"""Preflight: Debian version ordering, the package_versions check, Secure Boot, masking, and the probe script run
for real by a local shell against a local HTTP(S) repository (curl, gzip, awk; dnf is a stand-in)."""

from __future__ import annotations

import datetime
import gzip
import http.server
import ipaddress
import os
import shutil
import ssl
import subprocess
import threading
from base64 import b64decode
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gpuprov.core.debversion import InvalidVersion, compare_versions, nearest
from gpuprov.core.packages import Package
from gpuprov.facts.parsers import parse_secure_boot
from gpuprov.provision.ops import RepoSpec
from gpuprov.provision.preflight import _package_versions, evaluate, parse_probe, probe_command

SECRET = "s3cr3t-pw"


# ------------------------------------------------------------------------------------------ version ordering

# Literal cases from apt's test/libapt/versions.lst (checked there against dpkg --compare-versions):
# (a, b, sign of compare(a, b)).
APT_CASES = [
    ("7.6p2-4", "7.6-0", 1), ("1.0.3-3", "1.0-1", 1), ("1.3", "1.2.2-2", 1), ("1.3", "1.2.2", 1),
    ("1:0.4", "10.3", 1), ("1:1.25-4", "1:1.25-8", -1), ("0:1.18.36", "1.18.36", 0),
    ("1.18.36", "1.18.35", 1), ("0:1.18.36", "1.18.35", 1),
    ("9:1.18.36:5.4-20", "10:0.5.1-22", -1), ("9:1.18.36:5.4-20", "9:1.18.36:5.5-1", -1),
    ("9:1.18.36:5.4-20", "9:1.18.37:4.3-22", -1), ("1.18.36-0.17.35-18", "1.18.36-19", 1),
    ("1:1.2.13-3", "1:1.2.13-3.1", -1), ("2.0.7pre1-4", "2.0.7r-1", -1),
    ("0-pre", "0-pre", 0), ("0-pre", "0-pree", -1), ("1.1.6r2-2", "1.1.6r-1", 1), ("2.6b2-1", "2.6b-2", 1),
    ("98.1p5-1", "98.1-pre2-b6-2", -1), ("0.4a6-2", "0.4-1", 1), ("1:3.0.5-2", "1:3.0.5.1", -1),
    ("3.0~rc1-1", "3.0-1", -1), ("1.0", "1.0-0", 0), ("0.2", "1.0-0", -1), ("1.0", "1.0-0+b1", -1),
    ("1.0", "1.0-0~", 1), ("0:0-0-0", "0-0", 1), ("0", "0", 0), ("0", "00", 0),
    ("1.2.3", "0:1.2.3", 0), ("1.2.3", "1.2.3-0", 0), ("009", "9", 0), ("009ab5", "9ab5", 0),
    ("1.2.3", "1.2.3-1", -1), ("1.2.24", "1.2.3", 1), ("0.10.0", "0.8.7", 1), ("1.3.2a", "1.3.2", 1),
    ("0.5.0~git", "0.5.0~git2", -1), ("2a", "21", -1), ("1.3.2a", "1.3.2b", -1), ("1:1.2.3", "1.2.4", 1),
    ("1.2a+~bCd3", "1.2a++", -1), ("1.2a+~bCd3", "1.2a+~", 1), ("5:2", "304-2", 1), ("5:2", "304:2", -1),
    ("25:2", "3:2", 1), ("1:2:123", "1:12:3", -1), ("1.2-5", "1.2-3-5", -1), ("5.10.0", "5.005", 1),
    ("3a9.8", "3.10.2", -1), ("3a9.8", "3~10", 1), ("1.4+OOo3.0.0~", "1.4+OOo3.0.0-4", -1),
    ("2.4.7-1", "2.4.7-z", -1), ("1.002-1+b2", "1.00", 1),
]


@pytest.mark.parametrize(("a", "b", "expected"), APT_CASES)
def test_compare_versions_orders_as_dpkg(a, b, expected):
    assert compare_versions(a, b) == expected
    assert compare_versions(b, a) == -expected


def test_policy_tilde_example_sorts_in_order():
    # Debian Policy 5.6.12: "~~, ~~a, ~, the empty part, a" sort in that order
    ordered = ["1.0~~", "1.0~~a", "1.0~", "1.0", "1.0a"]
    for lower, higher in zip(ordered, ordered[1:], strict=False):
        assert compare_versions(lower, higher) == -1


def test_nvidia_driver_versions_compare_numerically():
    assert compare_versions("570.86.15-1ubuntu1", "570.148.08-1ubuntu1") == -1
    assert compare_versions("1:4.2.3-1", "4.10.0-1") == 1


def test_nearest_gives_the_neighbours_below_and_above():
    have = ["570.86.15-1", "570.133.20-1", "570.172.08-1", "575.57.08-1"]
    assert nearest("570.148.08-1", have) == ["570.133.20-1", "570.172.08-1"]
    assert nearest("560.35.05-1", have) == ["570.86.15-1"]
    assert nearest("580.65.06-1", have) == ["575.57.08-1"]
    assert nearest("1.0", []) == []


# ------------------------------------------------------------------------------------------ evaluate

def facts(family: str = "debian", **overrides) -> dict:
    values = {"os": {"key": "debian-12" if family == "debian" else "rhel-9", "family": family,
                     "pretty_name": "test"},
              "kernel": "6.1.0-99-gpuprovtest", "secure_boot": False, "nouveau_loaded": False,
              "package_manager_busy": [], "dpkg_interrupted": False, "cloud_init": None,
              "disk_free_mib": {"/": 50000}, "kernel_headers": True, "packages": {}}
    values.update(overrides)
    return values


def repo(url: str = "https://mirror.example/nvidia/", **overrides) -> RepoSpec:
    values = {"url": url, "key_url": None, "key_data": "KEY", "fingerprint": "A" * 40, "proxy": None,
              "ca_pem": None}
    values.update(overrides)
    return RepoSpec(**values)


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


WANTED = [Package("nvidia-open-570", "570.148.08-1ubuntu1"), Package("libnccl2", "2.26.5-1+cuda12.9")]


def test_every_wanted_version_in_the_index_passes():
    probe = {"source": "200", "index": "ok", "pkg": "nvidia-open-570=570.133.20-1ubuntu1 "
             "nvidia-open-570=570.148.08-1ubuntu1 libnccl2=2.26.5-1+cuda12.9"}
    check = by_name(evaluate(facts(), probe, repo(), None, WANTED))["package_versions"]
    assert check.status == "pass" and "2 packages" in check.detail


def test_a_missing_version_fails_naming_the_nearest_ones():
    probe = {"source": "200", "index": "ok",
             "pkg": "nvidia-open-570=570.133.20-1ubuntu1 nvidia-open-570=570.172.08-1ubuntu1 "
                    "nvidia-open-570=575.57.08-1ubuntu1 libnccl2=2.26.5-1+cuda12.9"}
    check = by_name(evaluate(facts(), probe, repo(), None, WANTED))["package_versions"]
    assert check.status == "fail"
    assert check.detail == ("not in the repository: nvidia-open-570=570.148.08-1ubuntu1 "
                            "(nearest: 570.133.20-1ubuntu1, 570.172.08-1ubuntu1)")
    assert check.remedy


def test_a_package_the_repository_lacks_entirely_fails():
    probe = {"source": "200", "index": "ok", "pkg": "nvidia-open-570=570.148.08-1ubuntu1"}
    check = by_name(evaluate(facts(), probe, repo(), None, WANTED))["package_versions"]
    assert check.status == "fail" and check.detail.endswith("libnccl2=2.26.5-1+cuda12.9 (no version)")


def test_an_unreadable_index_warns_and_no_probe_skips():
    check = by_name(evaluate(facts(), {"source": "000"}, repo(), None, WANTED))["package_versions"]
    assert check.status == "warn"
    assert by_name(evaluate(facts(), None, repo(), None, WANTED))["package_versions"].status == "skip"
    assert "package_versions" not in by_name(evaluate(facts(), {"source": "200"}, repo(), None))


def test_rhel_versions_compare_without_the_epoch_dnf_shows():
    wanted = [Package("nvidia-driver", "570.148.08-1.el9")]
    probe = {"source": "200", "index": "ok", "pkg": "nvidia-driver=3:570.148.08-1.el9"}
    assert by_name(evaluate(facts("rhel"), probe, repo(), None, wanted))["package_versions"].status == "pass"
    probe = {"source": "200", "index": "ok", "pkg": "nvidia-driver=3:570.133.20-1.el9"}
    check = by_name(evaluate(facts("rhel"), probe, repo(), None, wanted))["package_versions"]
    assert check.status == "fail" and "(nearest: 570.133.20-1.el9)" in check.detail


def test_secure_boot_unknown_warns_with_how_to_find_out():
    check = by_name(evaluate(facts(secure_boot=None), None, repo(), None))["secure_boot"]
    assert check.status == "warn" and "mokutil --sb-state" in check.remedy
    for state in ("bios", "0"):  # a BIOS boot, or the SecureBoot EFI variable's byte 0
        off = by_name(evaluate(facts(secure_boot=parse_secure_boot(state)), None, repo(), None))["secure_boot"]
        assert off.status == "pass" and "off" in off.detail


def test_credentials_never_show_in_any_check():
    mirror = repo(f"https://ops:{SECRET}@mirror.example/nvidia/", proxy=f"http://ops:{SECRET}@proxy:3128")
    for probe in ({"source": "200", "index": "ok"}, {"source": "407"}):
        checks = evaluate(facts(), probe, mirror, None, WANTED)
        assert not any(SECRET in f"{c.detail} {c.remedy}" for c in checks)
        assert "https://***@mirror.example/nvidia/" in by_name(checks)["package_source"].detail


def test_parse_probe_collects_versions_and_index():
    output = "source=200\nindex=ok\npkg=a=1.0-1\npkg=a=1:2.0-1\nheaders=repo\nnoise\n"
    assert parse_probe(output) == {"source": "200", "index": "ok", "pkg": "a=1.0-1 a=1:2.0-1", "headers": "repo"}


# ------------------------------------------------------------------------------------------ the probe command

def test_no_secret_on_the_command_line():
    mirror = repo(f"https://ops:{SECRET}@mirror.example/nvidia/", proxy=f"http://ops:{SECRET}@proxy:3128",
                  ca_pem="-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n")
    for family in ("debian", "rhel"):
        command, stdin = probe_command(facts(family), mirror, WANTED)
        assert SECRET not in command and "mirror.example/nvidia" in command  # the duplicate check, no secret
        assert stdin.splitlines()[:2] == [f"https://ops:{SECRET}@mirror.example/nvidia",
                                          f"http://ops:{SECRET}@proxy:3128"]
        assert stdin.endswith("-----END CERTIFICATE-----\n")
        assert "nvidia-open-570" in command and "libnccl2" in command


def test_rhel_looks_up_duplicates_with_dnf_list():
    command, _ = probe_command(facts("rhel"), repo(), WANTED)
    assert "list --showduplicates --available" in command and "repodata/repomd.xml" in command


class Repo(http.server.BaseHTTPRequestHandler):
    """Serves `files` by path, whether asked directly or as a proxy (absolute URL); records each request."""

    files: dict[str, bytes] = {}
    seen: list[tuple[str, dict]] = []

    def do_GET(self):  # noqa: N802 - the http.server API
        self.seen.append((self.path, dict(self.headers)))
        body = self.files.get(urlsplit(self.path).path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


def packages_index(entries: list[tuple[str, str]]) -> bytes:
    text = "".join(f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nDescription: test\n multi\n\n"
                   for name, version in entries)
    return text.encode()


@pytest.fixture
def server(tmp_path):
    """A local repository over HTTP: (base URL, files, requests seen, start_tls(cert, key))."""
    Repo.files, Repo.seen = {}, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Repo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)

    def start_tls(cert: Path, key: Path) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)

    yield httpd, start_tls, thread
    httpd.shutdown()
    httpd.server_close()


def run_probe(command: str, stdin: str, env: dict | None = None, shell: str = "sh") -> dict[str, str]:
    """Run the probe as the host would (`sh -c SCRIPT`; RHEL's sh is bash)."""
    assert command.startswith("sh -c ")
    proc = subprocess.run(f"{shell} -c {command.removeprefix('sh -c ')}", shell=True, input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return parse_probe(proc.stdout)


needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in ("sh", "curl", "gzip", "awk")),
                                 reason="the probe needs sh, curl, gzip and awk")
SHELLS = [shell for shell in ("sh", "bash") if shutil.which(shell)]


@pytest.mark.tool
@needs_tools
def test_probe_reads_every_version_from_a_gzipped_flat_repository(server):
    httpd, _, thread = server
    thread.start()
    Repo.files = {"/repo/InRelease": b"signed",
                  "/repo/Packages.gz": gzip.compress(packages_index([
                      ("nvidia-open-570", "570.133.20-1ubuntu1"), ("libnccl2", "2.26.5-1+cuda12.9"),
                      ("nvidia-open-570", "570.172.08-1ubuntu1"), ("libnccl-dev", "2.26.5-1+cuda12.9"),
                      ("linux-headers-6.1.0-99-gpuprovtest", "6.1.0-99")]))}
    url = f"http://127.0.0.1:{httpd.server_address[1]}/repo/"
    command, stdin = probe_command(facts(kernel_headers=False), repo(url), WANTED)
    probe = run_probe(command, stdin)
    assert probe["source"] == "200" and probe["index"] == "ok" and probe["headers"] == "repo"
    assert sorted(probe["pkg"].split()) == ["libnccl2=2.26.5-1+cuda12.9", "nvidia-open-570=570.133.20-1ubuntu1",
                                            "nvidia-open-570=570.172.08-1ubuntu1"]
    check = by_name(evaluate(facts(), probe, repo(url), None, WANTED))["package_versions"]
    assert check.status == "fail" and "nearest: 570.133.20-1ubuntu1, 570.172.08-1ubuntu1" in check.detail


@pytest.mark.tool
@needs_tools
def test_probe_falls_back_to_the_plain_index_through_the_proxy_from_stdin(server):
    httpd, _, thread = server
    thread.start()
    Repo.files = {"/nvidia/InRelease": b"signed",
                  "/nvidia/Packages": packages_index([("libnccl2", "2.26.5-1+cuda12.9")])}
    proxy = f"http://ops:{SECRET}@127.0.0.1:{httpd.server_address[1]}"
    mirror = repo("http://mirror.invalid/nvidia/", proxy=proxy)
    command, stdin = probe_command(facts(), mirror, [Package("libnccl2", "2.26.5-1+cuda12.9")])
    probe = run_probe(command, stdin)
    assert probe["source"] == "200" and probe["index"] == "ok" and probe["pkg"] == "libnccl2=2.26.5-1+cuda12.9"
    paths = [path for path, _ in Repo.seen]
    assert "http://mirror.invalid/nvidia/Packages" in paths  # asked of the proxy, after Packages.gz was missing
    assert all(b64decode(headers["Proxy-Authorization"].split()[1]).decode() == f"ops:{SECRET}"
               for _, headers in Repo.seen)


@pytest.mark.tool
@needs_tools
@pytest.mark.parametrize("shell", SHELLS)
def test_probe_trusts_the_extra_ca_from_stdin(server, tmp_path, shell):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuprov test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    (tmp_path / "cert.pem").write_text(pem)
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    httpd, start_tls, thread = server
    start_tls(tmp_path / "cert.pem", tmp_path / "key.pem")
    thread.start()
    Repo.files = {"/r/InRelease": b"signed", "/r/Packages.gz": gzip.compress(packages_index([("a", "1")]))}
    url = f"https://127.0.0.1:{httpd.server_address[1]}/r"
    assert run_probe(*probe_command(facts(), repo(url), []), shell=shell)["source"] == "000"  # untrusted
    probe = run_probe(*probe_command(facts(), repo(url, ca_pem=pem), [Package("a", "1")]), shell=shell)
    assert probe["source"] == "200" and probe["pkg"] == "a=1"


DNF_LIST = """\
Available Packages
nvidia-driver.x86_64                   3:570.133.20-1.el9                     gpuprov-preflight
nvidia-driver.x86_64                   3:570.148.08-1.el9                     gpuprov-preflight
datacenter-gpu-manager-4-cuda-compat-12.x86_64
                                       1:4.2.3-1                              gpuprov-preflight
"""
FAKE_DNF = """\
#!/bin/sh
printf '%s\\n' "$*" >> "$PROBE_LOG"
for a; do case $a in --setopt=reposdir=*) dir=${a#--setopt=reposdir=};; esac; done
case " $* " in
  *" makecache "*) cat "$dir"/*.repo > "$PROBE_REPO"; [ -r "$dir/ca.pem" ] && cp "$dir/ca.pem" "$PROBE_CA"; exit 0;;
  *" list --showduplicates --available "*) cat "$PROBE_LIST"; exit 0;;
esac
exit 1
"""


@pytest.mark.tool
@needs_tools
@pytest.mark.parametrize("shell", SHELLS)
def test_rhel_probe_asks_dnf_about_the_repository_alone(server, tmp_path, shell):
    httpd, _, thread = server
    thread.start()
    Repo.files = {"/rhel9/repodata/repomd.xml": b"<repomd/>"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dnf").write_text(FAKE_DNF)
    (bin_dir / "dnf").chmod(0o755)
    (tmp_path / "list.txt").write_text(DNF_LIST)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROBE_LOG": str(tmp_path / "argv.log"),
           "PROBE_REPO": str(tmp_path / "repo.txt"), "PROBE_CA": str(tmp_path / "ca.txt"),
           "PROBE_LIST": str(tmp_path / "list.txt"), "TMPDIR": str(tmp_path)}
    url = f"http://ops:{SECRET}@mirror.invalid/rhel9/"
    proxy = f"http://ops:{SECRET}@127.0.0.1:{httpd.server_address[1]}"
    pem = "-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----"
    wanted = [Package("nvidia-driver", "570.148.08-1.el9"), Package("datacenter-gpu-manager-4-cuda-compat-12",
                                                                    "4.2.3-1")]
    command, stdin = probe_command(facts("rhel"), repo(url, proxy=proxy, ca_pem=pem),
                                   wanted)
    probe = run_probe(command, stdin, env, shell)
    assert probe["source"] == "200" and probe["index"] == "ok"
    assert sorted(probe["pkg"].split()) == ["datacenter-gpu-manager-4-cuda-compat-12=1:4.2.3-1",
                                            "nvidia-driver=3:570.133.20-1.el9", "nvidia-driver=3:570.148.08-1.el9"]
    repo_file = (tmp_path / "repo.txt").read_text()
    assert f"baseurl={url.rstrip('/')}\n" in repo_file and f"proxy={proxy}\n" in repo_file
    assert (tmp_path / "ca.txt").read_text().strip() == pem
    assert SECRET not in (tmp_path / "argv.log").read_text()
    assert not list(tmp_path.glob("tmp.*"))  # the temporary folder is gone
    check = by_name(evaluate(facts("rhel"), probe, repo(url), None, wanted))["package_versions"]
    assert check.status == "pass"


# --- versions as dpkg judges them (python-debian): rpm versions matched as text, a bad Debian pin is bad input --

def test_rpm_versions_debian_cannot_order_are_matched_as_text():
    probe = {"index": "ok", "pkg": "cuda-drivers=570.133.20-1.el9_4 cuda-drivers=570.148.08-1.el9_4"}
    assert _package_versions("rhel", probe, [Package("cuda-drivers", "570.133.20-1.el9_4")]).status == "pass"
    check = _package_versions("rhel", probe, [Package("cuda-drivers", "570.100.00-1.el9_4")])
    assert check.status == "fail" and "(no version)" in check.detail


def test_a_debian_pin_dpkg_refuses_is_bad_input():
    probe = {"index": "ok", "pkg": "nvidia-driver-570=570.133.20-1ubuntu1"}
    with pytest.raises(InvalidVersion, match="revision number is empty"):
        _package_versions("debian", probe, [Package("nvidia-driver-570", "570.133.20-")])


def test_an_odd_index_entry_is_never_ordered_nor_fatal():
    probe = {"index": "ok", "pkg": "x=1.0-1 x=1.0_9 x=1.0-3"}
    check = _package_versions("debian", probe, [Package("x", "1.0-2")])
    assert check.status == "fail" and "(nearest: 1.0-1, 1.0-3)" in check.detail
