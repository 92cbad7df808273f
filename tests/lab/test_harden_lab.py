"""`invoke harden` against lab hosts over real SSH: traffic only between lab hosts on their internal network, a nested
Docker on host A, outside judges (nc from host B, ssh-audit, Lynis). The tests run in file order on shared hosts:
figures before -> dry run -> refusal -> harden -> second run -> audit -> sshd -t rejection -> forced lockout
rolled back -> figures after.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from judges import ssh_audit, ssh_audit_counts, ssh_audit_failures
from labutil import copy_inventory, docker_networks, invoke, on_host, snapshot

pytestmark = pytest.mark.lab

FIGURES: dict = {}
LISTENER_PORTS = (8080, 9090)       # 8080 allowed from the internal network, 9090 never
PUBLISHED = 8081                    # a nested container's port, published by Docker on host A
TINY_NC = ("docker image inspect lab-nc >/dev/null 2>&1 || { cd / && tar -chf /tmp/nc.tar bin/sh bin/nc.openbsd "
           "$(ldd /bin/nc.openbsd /bin/sh | awk '/=>/ { print substr($3, 2) } /ld-linux/ { print substr($1, 2) }' "
           "| sort -u) && docker import /tmp/nc.tar lab-nc >/dev/null; }")


@dataclass
class Fleet:
    """The lab, its two hosts, the networks as Docker (not gpuprov) describes them, the CLI environment."""

    lab: object
    a: str
    b: str
    a_internal_ip: str
    gateway: str          # where the controller's SSH connections come from, as lab hosts see them
    internal: str         # the lab's internal network
    env: dict
    folder: Path


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory) -> Fleet:
    """Host A (hgx-h100: Docker from the lab mirror) and host B, bare; lynis installed on A as the judge."""
    from gpuprov.lab.labels import NETWORK

    folder = tmp_path_factory.mktemp("harden")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    a = next(h for h in lab.hosts if h.profile == "hgx-h100")
    b = next(h for h in lab.hosts if h.name != a.name)
    gateway, internal = docker_networks(NETWORK)
    invoke("provision", "--host", a.name, "--only", "sources,engine", "--inventory", str(lab.inventory), env=env)
    on_host(lab, a.name, "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -y -q install "
                         "--no-install-recommends lynis >/dev/null")
    for port in LISTENER_PORTS:
        on_host(lab, a.name, f"systemd-run --quiet --unit=lab-listen-{port} nc.openbsd -lk {port}")
    on_host(lab, a.name, TINY_NC)
    on_host(lab, a.name, f"docker run -d --name published -p {PUBLISHED}:80 lab-nc /bin/nc.openbsd -lk 80 >/dev/null")
    return Fleet(lab, a.name, b.name, a.internal_ip, gateway, internal, env, folder)


def inventory(fleet: Fleet, name: str, ssh_sources: list[str] | None = None, allow: list[dict] | None = None,
              **extra) -> Path:
    """The lab inventory with host A's hardening variables: SSH from the controller and the internal network,
    8080 from the internal network (unless told otherwise)."""
    folder = fleet.folder / name
    folder.mkdir(exist_ok=True)
    sources = ssh_sources if ssh_sources is not None else [f"{fleet.gateway}/32", fleet.internal]
    rules = [{"port": 22, "proto": "tcp", "sources": sources},
             *(allow if allow is not None else [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]}])]

    def edit(document):
        document["hosts"][fleet.a]["vars"].update({"firewall": {"allow": rules}, **extra})

    return copy_inventory(fleet.lab, folder, edit=edit)


def harden(fleet: Fleet, path: Path, *args: str, code: int = 0) -> dict:
    proc = invoke("harden", "--host", fleet.a, "--inventory", str(path), "--json", *args, check_code=code,
                  env=fleet.env)
    (run,) = json.loads(proc.stdout)["hosts"]
    return run


def reaches(fleet: Fleet, port: int) -> bool:
    """Whether host B opens a TCP connection to host A's internal address (nc, 3 s)."""
    out = on_host(fleet.lab, fleet.b, f"nc -z -w 3 {fleet.a_internal_ip} {port}; echo rc=$?", check=False)
    return out.strip().endswith("rc=0")


def lynis_index(fleet: Fleet) -> int:
    on_host(fleet.lab, fleet.a, "lynis audit system --quick --no-colors >/dev/null 2>&1; true")
    report = on_host(fleet.lab, fleet.a, "cat /var/log/lynis-report.dat")
    return int(re.search(r"^hardening_index=(\d+)$", report, re.M).group(1))


def audit_figures(fleet: Fleet) -> dict:
    report = ssh_audit("127.0.0.1", fleet.lab.host(fleet.a).port)
    return {**ssh_audit_counts(report), "failures": ssh_audit_failures(report)}


def test_figures_before(fleet):
    FIGURES["before"] = {"ssh_audit": audit_figures(fleet), "lynis_hardening_index": lynis_index(fleet)}
    print("harden figures before:", json.dumps(FIGURES["before"]))
    assert FIGURES["before"]["ssh_audit"]["fail"] > 0   # Debian's defaults: the judge has something to find
    assert all(reaches(fleet, port) for port in (22, *LISTENER_PORTS, PUBLISHED))


def test_dry_run_shows_the_plan_and_changes_nothing(fleet):
    before = snapshot(fleet.lab, fleet.a)
    run = harden(fleet, inventory(fleet, "dry"), "--dry-run")
    assert run["status"] == "planned" and {c["component"] for c in run["plan"]} == {"firewall", "ssh", "updates"}
    assert run["controller"]["address"] == fleet.gateway
    assert snapshot(fleet.lab, fleet.a) == before


def test_a_lockout_is_refused_and_nothing_changes(fleet):
    before = snapshot(fleet.lab, fleet.a)
    run = harden(fleet, inventory(fleet, "refused", ssh_sources=["192.0.2.0/24"]), code=1)
    assert run["status"] == "refused" and run["steps"] == []
    assert f"drop SSH from {fleet.gateway}" in run["refusals"][0]
    assert snapshot(fleet.lab, fleet.a) == before


def test_harden_filters_ports_and_docker_published_ports(fleet):
    run = harden(fleet, inventory(fleet, "applied"))
    assert run["status"] == "changed" and run["guard"]["result"] == "confirmed", run
    assert [c["id"] for c in run["controls"] if c["status"] == "fail"] == []
    assert reaches(fleet, 22) and reaches(fleet, 8080)
    assert not reaches(fleet, 9090)
    assert not reaches(fleet, PUBLISHED)     # published by Docker, not allowed: the classic hole is closed
    assert on_host(fleet.lab, fleet.a, "systemctl is-enabled gpuprov-firewall.service").strip() == "enabled"
    assert "table ip nat" in on_host(fleet.lab, fleet.a, "nft list tables")   # Docker's own tables are still there


def test_a_published_port_is_reachable_once_allowed(fleet):
    allow = [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]},
             {"port": PUBLISHED, "proto": "tcp", "sources": [fleet.internal]}]
    run = harden(fleet, inventory(fleet, "published", allow=allow))
    assert run["status"] == "changed" and [c["component"] for c in run["plan"]] == ["firewall"]
    assert reaches(fleet, PUBLISHED) and reaches(fleet, 8080) and not reaches(fleet, 9090)


def test_second_run_changes_nothing(fleet):
    allow = [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]},
             {"port": PUBLISHED, "proto": "tcp", "sources": [fleet.internal]}]
    run = harden(fleet, inventory(fleet, "published", allow=allow))
    assert (run["status"], run["plan"], run["steps"]) == ("unchanged", [], [])


UPLINK = ("ip link add br-ex type bridge && ip addr add 192.0.2.1/24 dev br-ex && ip link set br-ex up && "
          "ip netns add uplink && ip link add vuplink type veth peer name eth0 netns uplink && "
          "ip link set vuplink master br-ex up && ip -n uplink link set lo up && ip -n uplink link set eth0 up && "
          "ip -n uplink addr add 192.0.2.2/24 dev eth0")


def uplink_reaches(fleet: Fleet, port: int) -> bool:
    """Whether a machine behind host A's uplink bridge br-ex (a namespace on A) opens a TCP connection to A's
    br-ex address (nc, 3 s)."""
    out = on_host(fleet.lab, fleet.a, f"ip netns exec uplink nc.openbsd -z -w 3 192.0.2.1 {port}; echo rc=$?",
                  check=False)
    return out.strip().endswith("rc=0")


def test_an_uplink_bridge_named_br_ex_meets_the_allow_list(fleet):
    """Only Docker's own bridges are left to Docker: through an uplink bridge named br-ex, the published port is
    open only where the allow list says (first allowed from behind it, then not)."""
    allowed = [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]},
               {"port": PUBLISHED, "proto": "tcp", "sources": [fleet.internal, "192.0.2.2/32"]}]
    on_host(fleet.lab, fleet.a, UPLINK)
    try:
        run = harden(fleet, inventory(fleet, "uplink", allow=allowed))
        assert run["status"] == "changed" and run["guard"]["result"] == "confirmed", run
        assert uplink_reaches(fleet, PUBLISHED)          # Docker publishes through br-ex: the path works
        allow = [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]},
                 {"port": PUBLISHED, "proto": "tcp", "sources": [fleet.internal]}]
        run = harden(fleet, inventory(fleet, "published", allow=allow))
        assert run["status"] == "changed" and run["guard"]["result"] == "confirmed", run
        assert not uplink_reaches(fleet, PUBLISHED)      # br-* is not Docker's: the allow list holds
        assert reaches(fleet, PUBLISHED)
    finally:
        on_host(fleet.lab, fleet.a, "ip netns del uplink; ip link del br-ex", check=False)


def test_check_passes_then_catches_a_manual_sshd_change(fleet):
    path = fleet.folder / "published" / "inventory.yaml"
    run = harden(fleet, path, "--check")
    assert run["status"] == "checked" and not [c for c in run["controls"] if c["status"] == "fail"]
    on_host(fleet.lab, fleet.a, "printf 'PasswordAuthentication yes\\n' > /etc/ssh/sshd_config.d/05-manual.conf && "
                                "systemctl reload ssh")
    try:
        run = harden(fleet, path, "--check", code=1)
        failed = {c["id"]: c["observed"] for c in run["controls"] if c["status"] == "fail"}
        assert failed == {"ssh-password-authentication": "yes"}
    finally:
        on_host(fleet.lab, fleet.a, "rm -f /etc/ssh/sshd_config.d/05-manual.conf && systemctl reload ssh")


def test_a_firewall_gpuprov_does_not_own_is_refused_and_audited(fleet):
    """Debian's nftables.service enabled (its restart flushes the whole ruleset): a firewall change is refused,
    naming it and what to do, nothing changes, and the audit reports it."""
    on_host(fleet.lab, fleet.a, "systemctl enable nftables.service 2>/dev/null")
    try:
        before = snapshot(fleet.lab, fleet.a)
        run = harden(fleet, inventory(fleet, "other-firewall", allow=[]), code=1)
        assert run["status"] == "refused" and run["steps"] == [], run
        assert [r for r in run["refusals"] if r.startswith("nftables.service is enabled")], run["refusals"]
        assert snapshot(fleet.lab, fleet.a) == before
        run = harden(fleet, fleet.folder / "published" / "inventory.yaml", "--check", code=1)
        failed = {c["id"]: c["observed"] for c in run["controls"] if c["status"] == "fail"}
        assert failed == {"firewall-no-other-ruleset": ["nftables.service enabled"]}
    finally:
        on_host(fleet.lab, fleet.a, "systemctl disable nftables.service 2>/dev/null")


def test_an_sshd_config_that_sshd_rejects_is_never_applied(fleet):
    dropin = "/etc/ssh/sshd_config.d/10-gpuprov-hardening.conf"
    before = on_host(fleet.lab, fleet.a, f"cat {dropin}; sshd -T | grep ^kexalgorithms")
    # ML-KEM key exchange arrived in OpenSSH 9.9; Debian 12 has 9.2 (paramiko has it: no lockout refusal)
    allow = [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]},
             {"port": PUBLISHED, "proto": "tcp", "sources": [fleet.internal]}]
    path = inventory(fleet, "mlkem", allow=allow,
                     ssh_hardening={"kex_algorithms": ["mlkem768x25519-sha256", "curve25519-sha256@libssh.org"]})
    proc = invoke("harden", "--host", fleet.a, "--inventory", str(path), "--json", check_code=1, env=fleet.env)
    (run,) = json.loads(proc.stdout)["hosts"]
    assert run["status"] == "failed" and "sshd -t rejected the configuration" in run["error"]["output"]
    assert on_host(fleet.lab, fleet.a, f"cat {dropin}; sshd -T | grep ^kexalgorithms") == before
    assert run["guard"]["result"] == "reverted by gpuprov"
    invoke("facts", "--host", fleet.a, "--inventory", str(path), env=fleet.env)   # SSH works


def test_a_ruleset_that_blocks_ssh_is_rolled_back_by_the_host(fleet):
    table = "nft list table inet gpuprov"
    before = on_host(fleet.lab, fleet.a, table)
    allow = [{"port": 8080, "proto": "tcp", "sources": [fleet.internal]},
             {"port": PUBLISHED, "proto": "tcp", "sources": [fleet.internal]}]
    path = inventory(fleet, "lockout", ssh_sources=["192.0.2.0/24"], allow=allow)
    run = harden(fleet, path, "--i-have-console-access", "--confirm-timeout", "20", code=1)
    assert run["status"] == "rolled back" and run["guard"]["result"] == "rolled back by the host", run
    assert "restored the nftables table" in run["guard"]["log"] and run["overridden"]
    assert on_host(fleet.lab, fleet.a, table) == before
    invoke("facts", "--host", fleet.a, "--inventory", str(path), env=fleet.env)   # SSH works again
    assert on_host(fleet.lab, fleet.a, "ls /var/lib/gpuprov/harden/*/armed 2>/dev/null; true") == ""


def test_service_ports_open_to_the_monitoring_network(fleet):
    b_ip = fleet.lab.host(fleet.b).internal_ip
    path = inventory(fleet, "services", allow=[], monitoring_cidrs=[f"{b_ip}/32"],
                     service_ports=[{"name": "metrics", "port": 9090, "sources": "monitoring"}])
    run = harden(fleet, path)
    assert run["status"] == "changed" and run["guard"]["result"] == "confirmed"
    assert reaches(fleet, 9090) and reaches(fleet, 22)
    assert not reaches(fleet, 8080) and not reaches(fleet, PUBLISHED)


def test_everything_is_open_between_cluster_hosts(fleet):
    run = harden(fleet, inventory(fleet, "cluster", allow=[], cluster_cidrs=[fleet.internal]))
    assert run["status"] == "changed" and run["guard"]["result"] == "confirmed"
    assert all(reaches(fleet, port) for port in (22, *LISTENER_PORTS, PUBLISHED))


def test_figures_after(fleet):
    FIGURES["after"] = {"ssh_audit": audit_figures(fleet), "lynis_hardening_index": lynis_index(fleet)}
    print("harden figures after:", json.dumps(FIGURES["after"]))
    (fleet.folder / "figures.json").write_text(json.dumps(FIGURES, indent=1))
    print(f"harden figures: {fleet.folder / 'figures.json'}")
    assert FIGURES["after"]["ssh_audit"]["failures"] == []
    assert FIGURES["after"]["lynis_hardening_index"] > FIGURES["before"]["lynis_hardening_index"]
