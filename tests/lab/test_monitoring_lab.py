"""`invoke monitoring.*` against lab hosts over real SSH, judged by a real Prometheus (Debian's package, installed by
`monitoring.server` on a lab host) through its HTTP API: exporters up, a textfile folder only root writes, Prometheus
on the monitoring address only, a host's textfile that cannot speak for another host, textfile metrics from validate
and the drift timer, an alert firing on a simulated driver/library mismatch, a host added without a Prometheus
restart, every dashboard query answered, idle GPUs with their cost, and the exporter ports closed outside the
monitoring network on a hardened host. The tests run in file order on shared hosts."""

from __future__ import annotations

import json
import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from labutil import copy_inventory, docker_networks, invoke, on_host

from gpuprov.lab.faults import clear_faults, set_faults

pytestmark = pytest.mark.lab

COST = {"a": 98.32, "b": 12.0}     # per hour, as the inventory gives them
WAIT = 90                          # seconds Prometheus gets to see a change (it scrapes every 5 s in the lab)


@dataclass
class Fleet:
    """Host a (hgx-h100: Prometheus and GPUs), host b (l40s), host c (a100-pcie, added later); CLI settings."""

    lab: object
    a: str
    b: str
    c: str
    env: dict
    two: Path            # the inventory of a and b
    three: Path          # the same with c


def _inventory(lab, folder: Path, names: list[str], c_name: str) -> Path:
    def edit(document):
        for name in list(document["hosts"]):
            if name not in names:
                del document["hosts"][name]
        for key, name in (("a", names[0]), ("b", names[1])):
            document["hosts"][name]["vars"]["cost"] = {"per_hour": COST[key], "currency": "USD"}
        if c_name in document["hosts"]:   # no DCGM on the bare host: node_exporter only
            document["hosts"][c_name]["vars"]["monitoring"] = {"dcgm_exporter": "none", "scrape_interval_s": 5}

    folder.mkdir(exist_ok=True)
    return copy_inventory(lab, folder, edit=edit)


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory) -> Fleet:
    folder = tmp_path_factory.mktemp("monitoring")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    by_profile = {h.profile: h.name for h in lab.hosts}
    a, b, c = by_profile["hgx-h100"], by_profile["l40s"], by_profile["a100-pcie"]
    two = _inventory(lab, folder / "two", [a, b], c)
    three = _inventory(lab, folder / "three", [a, b, c], c)
    started = time.monotonic()
    invoke("provision", "--inventory", str(two), "--host", a, "--host", b, "--only", "sources,kernel,driver,dcgm",
           env=env)
    print(f"driver and DCGM on {a}, {b}: {time.monotonic() - started:.1f} s")
    return Fleet(lab, a, b, c, env, two, three)


def run_json(fleet: Fleet, *args: str, inventory: Path | None = None, check_code: int | None = 0) -> dict:
    proc = invoke(*args, "--inventory", str(inventory or fleet.two), "--json", env=fleet.env, check_code=check_code)
    return json.loads(proc.stdout)


@contextmanager
def prometheus(fleet: Fleet):
    """Prometheus on host a, through gpuprov's SSH connection to it (the controller reaches lab hosts on 127.0.0.1
    only)."""
    from gpuprov.core.connection import HostConnection
    from gpuprov.core.known_hosts import read_known_hosts
    from gpuprov.inventory import load_inventory
    from gpuprov.monitoring.query import through_ssh

    inv = load_inventory(fleet.two)
    with HostConnection(inv.host(fleet.a), known_hosts=read_known_hosts(Path(inv.known_hosts))) as conn:
        yield through_ssh(conn)


def values(prom, expr: str) -> dict[tuple, float]:
    """{(host, other label values...): value} of an instant query."""
    return {tuple(sorted(row["metric"].items())): row["value"] for row in prom.query(expr)}


def wait_until(prom, what: str, test, timeout: float = WAIT) -> None:
    prom.wait_for(what, test, timeout)


# ---------------------------------------------------------------------------------------------------- deploy

def test_deploy_shows_its_plan_then_serves_both_exporters(fleet):
    planned = run_json(fleet, "monitoring.deploy", "--host", fleet.a, "--host", fleet.b, "--dry-run")
    for host in planned["hosts"]:
        summaries = [change["summary"] for change in host["plan"]]
        assert host["status"] == "planned" and host["dcgm_exporter"] == "service"
        assert "install prometheus-node-exporter (the distribution's package)" in summaries
        assert any(s.startswith("install datacenter-gpu-manager-exporter=4.") for s in summaries)
    done = run_json(fleet, "monitoring.deploy", "--host", fleet.a, "--host", fleet.b)
    internal = {h.name: h.internal_ip for h in fleet.lab.hosts}
    for host in done["hosts"]:
        assert host["status"] == "changed" and host["address"] == internal[host["host"]]
        assert host["endpoints"] == {"node-exporter": "serving", "dcgm-exporter": "serving"}
    # listening on the monitoring address only, not on every address
    listening = on_host(fleet.lab, fleet.b, "ss -Htln | awk '{print $4}'")
    assert f"{internal[fleet.b]}:9100" in listening.split() and f"{internal[fleet.b]}:9400" in listening.split()
    assert not {"0.0.0.0:9100", "*:9100", "[::]:9100"} & set(listening.split())


def test_a_second_deploy_changes_nothing(fleet):
    again = run_json(fleet, "monitoring.deploy", "--host", fleet.a, "--host", fleet.b)
    assert [(h["host"], h["status"], h["plan"]) for h in again["hosts"]] == [(fleet.a, "unchanged", []),
                                                                             (fleet.b, "unchanged", [])]


def test_a_textfile_folder_others_could_write_is_made_root_only_again(fleet):
    """Everything in the folder is a metric of the host: only root may write there."""
    folder = "/var/lib/prometheus/node-exporter"
    on_host(fleet.lab, fleet.b, f"chown prometheus:prometheus {folder} && chmod 0777 {folder}")
    (host,) = run_json(fleet, "monitoring.deploy", "--host", fleet.b)["hosts"]
    assert host["status"] == "changed" and [c["summary"] for c in host["plan"]] == [
        f"make (directory prometheus:prometheus 777 now) {folder} root:root 0755 (only root writes this host's "
        "metrics)"], host
    assert on_host(fleet.lab, fleet.b, f"stat -c '%U:%G %a' {folder}").strip() == "root:root 755"
    (host,) = run_json(fleet, "monitoring.deploy", "--host", fleet.b)["hosts"]
    assert host["status"] == "unchanged"


def test_validate_writes_its_textfile(fleet):
    proc = invoke("validate", "--inventory", str(fleet.two), "--host", fleet.b, "--only", "host,perf", "--json",
                  env=fleet.env, check_code=None)
    assert proc.returncode in (0, 1), proc.stderr
    text = on_host(fleet.lab, fleet.b, "cat /var/lib/prometheus/node-exporter/gpuprov_validate.prom")
    assert f'gpuprov_validate_timestamp_seconds{{host="{fleet.b}"}}' in text


def test_the_server_scrapes_every_exporter(fleet):
    planned = run_json(fleet, "monitoring.server", "--host", fleet.a, "--dry-run")
    assert any("install prometheus" in c["summary"] for c in planned["hosts"][0]["plan"])
    run_json(fleet, "monitoring.server", "--host", fleet.a)
    assert run_json(fleet, "monitoring.server", "--host", fleet.a)["hosts"][0]["status"] == "unchanged"
    with prometheus(fleet) as prom:
        want = {(host, job) for host in (fleet.a, fleet.b) for job in ("gpuprov-node", "gpuprov-dcgm")}
        wait_until(prom, "every exporter up", lambda: {
            (dict(k)["host"], dict(k)["job"]) for k, v in values(prom, 'up{job=~"gpuprov-.*"}').items() if v == 1
        } == want)
        # the GPUs of each profile (8 H100, 4 L40S in the lab's profiles) as DCGM series
        gpus = values(prom, 'count by (host) (DCGM_FI_DEV_GPU_UTIL{job="gpuprov-dcgm"})')
        assert gpus == {(("host", fleet.a),): 8.0, (("host", fleet.b),): 4.0}
        # the target labels come from the inventory
        labels = prom.query(f'up{{job="gpuprov-node", host="{fleet.b}"}}')[0]["metric"]
        assert labels["gpu_model"] == "L40S" and labels["cost_per_hour"] == "12.0" and ",l40s," in labels["groups"]


def reaches(fleet: Fleet, source: str, address: str, port: int) -> bool:
    """Whether lab host `source` opens a TCP connection to address:port."""
    out = on_host(fleet.lab, source, f"nc -z -w 3 {address} {port}; echo rc=$?", check=False)
    return out.strip().endswith("rc=0")


def test_prometheus_listens_on_the_monitoring_address_only(fleet):
    """The monitoring address is host a's internal IP: Prometheus is reached there, and not on 127.0.0.1 or host
    a's other interface (the lab's default bridge)."""
    internal = fleet.lab.host(fleet.a).internal_ip
    listening = on_host(fleet.lab, fleet.a, "ss -Htln | awk '{print $4}'").split()
    assert [address for address in listening if address.endswith(":9090")] == [f"{internal}:9090"], listening
    assert reaches(fleet, fleet.b, internal, 9090)
    others = [address for address in on_host(fleet.lab, fleet.a, "hostname -I").split() if address != internal]
    assert others, "host a has no address besides its internal one"
    for address in ("127.0.0.1", *others):
        assert not reaches(fleet, fleet.a, address, 9090), address


def test_a_hosts_textfile_cannot_speak_for_another_host(fleet):
    """Host b's textfile claims host a's `host` label: Prometheus stores the series under host b."""
    forged = "/var/lib/prometheus/node-exporter/gpuprov-lab-forged.prom"
    line = f'gpuprov_lab_forged{{host="{fleet.a}"}} 1'
    on_host(fleet.lab, fleet.b, f"printf '%s\\n' {shlex.quote(line)} > {forged}")
    try:
        with prometheus(fleet) as prom:
            wait_until(prom, "the forged series scraped", lambda: bool(prom.query("gpuprov_lab_forged")))
            (row,) = prom.query("gpuprov_lab_forged")
            assert row["metric"]["host"] == fleet.b, row
            assert row["metric"]["instance"] == f"{fleet.lab.host(fleet.b).internal_ip}:9100"
            assert not [key for key in row["metric"] if key.startswith("exported_")], row
            assert prom.query(f'{{host="{fleet.a}", __name__="gpuprov_lab_forged"}}') == []
    finally:
        on_host(fleet.lab, fleet.b, f"rm -f {forged}")


def test_textfile_metrics_of_validate_and_drift_reach_prometheus(fleet):
    with prometheus(fleet) as prom:
        wait_until(prom, "validate's and the drift timer's metrics", lambda: all(
            prom.query(expr) for expr in (f'gpuprov_check_status{{host="{fleet.b}", check="host.gpus"}}',
                                          f'gpuprov_stack_info{{host="{fleet.a}"}}',
                                          f'gpuprov_driver_library_mismatch{{host="{fleet.b}"}} == 0')))
        info = prom.query(f'gpuprov_stack_info{{host="{fleet.a}"}}')[0]["metric"]
        driver = on_host(fleet.lab, fleet.a, "nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1")
        assert info["driver"] == driver.strip()
        cost = values(prom, f'gpuprov_cost_per_hour{{host="{fleet.b}"}}')
        assert list(cost.values()) == [COST["b"]]


def test_a_driver_library_mismatch_fires_its_alert(fleet):
    host = fleet.lab.host(fleet.b)
    set_faults(host, "driver-mismatch")
    try:
        on_host(fleet.lab, fleet.b, "systemctl start gpuprov-drift.service")
        with prometheus(fleet) as prom:
            wait_until(prom, "gpuprov_driver_library_mismatch = 1", lambda: values(
                prom, f'gpuprov_driver_library_mismatch{{host="{fleet.b}"}}') and all(
                v == 1 for v in values(prom, f'gpuprov_driver_library_mismatch{{host="{fleet.b}"}}').values()))

            def firing() -> bool:
                return any(a["labels"].get("alertname") == "GpuprovDriverLibraryMismatch"
                           and a["labels"].get("host") == fleet.b and a["state"] == "firing" for a in prom.alerts())
            wait_until(prom, "GpuprovDriverLibraryMismatch firing", firing)
            assert not any(a["labels"].get("alertname") == "GpuprovDriverLibraryMismatch"
                           and a["labels"].get("host") == fleet.a for a in prom.alerts())
    finally:
        clear_faults(host)
        on_host(fleet.lab, fleet.b, "systemctl start gpuprov-drift.service")


def test_a_host_added_to_the_inventory_is_scraped_without_a_restart(fleet):
    with prometheus(fleet) as prom:
        started = values(prom, 'process_start_time_seconds{job="prometheus"}')
        # a new server: its package sources first (the lab mirror serves the Debian packages), then its exporter
        invoke("provision", "--inventory", str(fleet.three), "--host", fleet.c, "--only", "sources", env=fleet.env)
        run_json(fleet, "monitoring.deploy", "--host", fleet.c, inventory=fleet.three)
        run_json(fleet, "monitoring.targets", "--server", fleet.a, "--out", str(fleet.two.parent / "targets"),
                 inventory=fleet.three)
        wait_until(prom, f"{fleet.c} scraped", lambda: list(values(prom, f'up{{host="{fleet.c}"}}').values()) == [1])
        (labels,) = [dict(key) for key in values(prom, f'up{{host="{fleet.c}"}}')]
        # profiles.yaml: the a100-pcie profile is two A100 PCIe 80GB cards
        assert (labels["job"], labels["gpu_model"], labels["gpu_count"]) == ("gpuprov-node", "A100-PCIE-80GB", "2")
        assert labels["instance"] == f"{fleet.lab.host(fleet.c).internal_ip}:9100"
        assert values(prom, 'process_start_time_seconds{job="prometheus"}') == started


def test_every_dashboard_panel_query_returns_data(fleet):
    """A host in the middle of a rollout (its textfile as `invoke rollout` writes it) and a host whose health check
    drained it for a fault (its textfile as gpuprov-health writes it) included."""
    from gpuprov.health.check import TEXTFILE, textfile
    from gpuprov.monitoring.dashboard import build_dashboard, concrete, panel_queries
    from gpuprov.rollout.status import METRIC_FILE, metric_text

    queries = panel_queries(build_dashboard())
    assert len(queries) >= 20
    rollout = f"/var/lib/prometheus/node-exporter/{METRIC_FILE}"
    health = f"/var/lib/prometheus/node-exporter/{TEXTFILE}"
    # the fault's action and severity as gpuprov/data/health_codes.yaml gives them for PCIE_DEGRADED
    failing = {"ok": False, "time": time.time(), "slurm": {"drained_by_gpuprov": True},
               "faults": [{"code": "PCIE_DEGRADED", "gpu": "00000000:00:1E.0", "action": "HARDWARE_INSPECTION",
                           "severity": "fatal", "text": "PCIe link x8 of x16"}]}
    on_host(fleet.lab, fleet.b, f"printf %s {shlex.quote(metric_text('0123abcd-1', 'upgrading', time.time()))} "
                                f"> {rollout} && printf %s {shlex.quote(textfile(failing))} > {health}")
    try:
        with prometheus(fleet) as prom:
            wait_until(prom, f"{fleet.b} upgrading", lambda: values(
                prom, f'gpuprov_rollout_state{{host="{fleet.b}", state="upgrading"}} == 1'))
            wait_until(prom, f"{fleet.b} failing its health check", lambda: values(
                prom, f'gpuprov_health_ok{{host="{fleet.b}"}} == 0'))
            empty = []
            for title, expr in queries:
                if not prom.query(concrete(expr)):
                    empty.append(f"{title}: {expr}")
            assert not empty, "panels without data:\n" + "\n".join(empty)
    finally:
        on_host(fleet.lab, fleet.b, f"rm -f {rollout} {health}")


def test_idle_lists_the_idle_host_with_its_cost_and_not_the_busy_one(fleet):
    host = fleet.lab.host(fleet.b)
    set_faults(host, *[f"gpu-busy {gpu}" for gpu in range(4)])   # the L40S host's 4 GPUs in use
    try:
        with prometheus(fleet) as prom:
            wait_until(prom, f"{fleet.b}'s GPUs busy", lambda: set(values(
                prom, f'DCGM_FI_DEV_GPU_UTIL{{host="{fleet.b}"}}').values()) == {100.0})
            # a GPU counts as idle only when Prometheus measured it from the window's start (36 s ago)
            wait_until(prom, "36 s of history", lambda: len(prom.query(
                f'present_over_time(DCGM_FI_DEV_GPU_UTIL{{host="{fleet.a}"}}[5m] offset 40s)')) == 8)
        idle = run_json(fleet, "monitoring.idle", "--hours", "0.01", "--server", fleet.a)
        found = {entry["host"]: entry for entry in idle["idle"]}
        assert fleet.b not in found and fleet.a in found, idle
        entry = found[fleet.a]
        # the H100 capture's GPUs idle (0 %): all 8, so the host's whole cost per hour (the inventory's 98.32 USD)
        assert entry["gpus"] == [str(gpu) for gpu in range(8)] and entry["gpu_count"] == 8
        assert entry["idle_cost_per_hour"] == COST["a"] and entry["currency"] == "USD"
        # the report rounds the hours to 3 decimals: the cost so far agrees within that rounding (0.0005 h)
        assert entry["idle_hours"] >= 0.01
        assert entry["idle_cost"] == pytest.approx(COST["a"] * entry["idle_hours"], abs=COST["a"] * 0.0005 + 0.005)
        # the idle-GPU validation does not run while a GPU process runs, and says why
        on_host(fleet.lab, fleet.b, "systemctl start gpuprov-validate-idle.service")
        skipped = on_host(fleet.lab, fleet.b, "cat /var/lib/prometheus/node-exporter/gpuprov-validate-idle.prom")
        assert f'gpuprov_validate_idle_skipped_timestamp_seconds{{host="{fleet.b}",reason="busy"}}' in skipped
    finally:
        clear_faults(host)


def test_exporter_ports_are_closed_outside_the_monitoring_network_on_a_hardened_host(fleet):
    from gpuprov.lab.labels import NETWORK

    gateway, internal = docker_networks(NETWORK)
    ips = {h.name: h.internal_ip for h in fleet.lab.hosts}

    def edit(document):
        document["hosts"][fleet.b]["vars"].update({
            "monitoring_cidrs": [f"{ips[fleet.a]}/32"],
            "firewall": {"allow": [{"port": 22, "proto": "tcp", "sources": [f"{gateway}/32", internal]}]}})

    folder = fleet.two.parent.parent / "hardened"
    folder.mkdir()
    path = copy_inventory(fleet.lab, folder, edit=edit)
    proc = invoke("harden", "--host", fleet.b, "--only", "firewall", "--inventory", str(path), "--json",
                  env=fleet.env)
    (run,) = json.loads(proc.stdout)["hosts"]
    assert run["status"] == "changed" and run["guard"]["result"] == "confirmed", run

    assert reaches(fleet, fleet.a, ips[fleet.b], 9100) and reaches(fleet, fleet.a, ips[fleet.b], 9400)   # monitoring
    assert not reaches(fleet, fleet.c, ips[fleet.b], 9100) and not reaches(fleet, fleet.c, ips[fleet.b], 9400)
    hardened = time.time()   # lab hosts share this machine's clock
    with prometheus(fleet) as prom:   # still scraped after the firewall went up
        wait_until(prom, "a scrape of host b after the firewall went up", lambda: min(
            values(prom, f'timestamp(up{{host="{fleet.b}"}})').values() or [0.0]) > hardened)
        assert set(values(prom, f'up{{host="{fleet.b}"}}').values()) == {1.0}
