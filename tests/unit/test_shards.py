"""--shard K/N (gpuprov.core.shards): the split of the selected hosts (every host in exactly one shard, whatever the
inventory's order, sizes within one), bad input exit 2 naming the flag, the flag on every host task; and the
controller's budget before a large run: the decision with given numbers, and the memory a real SSH connection takes
here, measured."""

from __future__ import annotations

import gc
import hashlib
import os
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invoke import Config, Context
from invoke.exceptions import Exit
from test_executor_open_files import ssh_server  # noqa: F401  (a local SSH server in another process)

from gpuprov.core.errors import InputError
from gpuprov.core.shards import (
    MEMORY_PER_CONNECTION,
    Shard,
    available_memory,
    memory_budget,
    open_files_budget,
    parse_shard,
    shard_hosts,
    shard_record,
)
from gpuprov.inventory import Host

MiB = 2**20


def hosts(*names: str) -> list[Host]:
    return [Host(name=name, address="192.0.2.1") for name in names]


# ----------------------------------------------------------------------------------------------- the flag

@pytest.mark.parametrize("text, expected", [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)), (" 3/3 ", Shard(3, 3))])
def test_a_shard_is_k_of_n(text, expected):
    assert parse_shard(text) == expected and str(expected) == text.strip()


@pytest.mark.parametrize("text", ["0/3", "4/3", "a/b", "", "1/0", "-1/3", "1/3/5", "1", "1 /3", "\u0661/\u0663",
                                  "2/100001"])
def test_bad_input_names_the_flag(text):
    with pytest.raises(InputError) as caught:
        parse_shard(text)
    assert "--shard" in str(caught.value) and caught.value.exit_code == 2


def test_without_the_flag_there_is_no_shard():
    assert parse_shard(None) is None


def test_the_split_is_round_robin_over_the_names_sorted():
    fleet = hosts("gpu05", "gpu02", "gpu04", "gpu01", "gpu03")      # the inventory's order, not sorted
    # sorted: gpu01 gpu02 gpu03 gpu04 gpu05 -> shard 1 takes the 1st, 3rd, 5th, shard 2 the 2nd and 4th
    assert [h.name for h in shard_hosts(fleet, Shard(1, 2))] == ["gpu05", "gpu01", "gpu03"]
    assert [h.name for h in shard_hosts(fleet, Shard(2, 2))] == ["gpu02", "gpu04"]


def test_a_shard_without_hosts_is_bad_input():
    with pytest.raises(InputError, match=r"--shard 3/3: the selection has 2 hosts"):
        shard_hosts(hosts("a", "b"), Shard(3, 3))


names_strategy = st.lists(st.text(st.sampled_from("abcxyz019-._"), min_size=1, max_size=6), min_size=1, max_size=40,
                          unique=True)


@given(names=names_strategy, count=st.integers(1, 9), data=st.data())
def test_every_host_is_in_exactly_one_shard_whatever_the_order(names, count, data):
    shuffled = data.draw(st.permutations(names))
    shards = []
    for index in range(1, count + 1):
        if index > len(names):     # more shards than hosts: the extra ones are refused, never silently empty
            with pytest.raises(InputError):
                shard_hosts(hosts(*names), Shard(index, count))
            continue
        mine = [h.name for h in shard_hosts(hosts(*names), Shard(index, count))]
        again = [h.name for h in shard_hosts(hosts(*shuffled), Shard(index, count))]
        assert set(mine) == set(again)                              # the inventory's order does not matter
        assert mine == [n for n in names if n in set(mine)]          # the shard keeps the given order
        shards.append(set(mine))
    assert sorted(n for shard in shards for n in shard) == sorted(names)   # every host once
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1                             # balanced


def test_the_shard_record_names_the_selection_whatever_its_order():
    one = shard_record(Shard(1, 2), hosts("a", "b", "c"))
    two = shard_record(Shard(2, 2), hosts("c", "a", "b"))
    assert (one["index"], one["count"], one["selected"]) == (1, 2, 3)
    assert one["selection"] == two["selection"] != shard_record(Shard(1, 2), hosts("a", "b", "d"))["selection"]


# ------------------------------------------------------------------------------------- through the tasks

def context(tmp_path) -> Context:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n" + "".join(f"  gpu0{i}: {{address: 192.0.2.{i}}}\n" for i in range(1, 5)))
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "reports": str(tmp_path / "reports"), "locks": str(tmp_path / "locks"),
        "known_hosts": str(tmp_path / "known_hosts"), "wheelhouse": str(tmp_path / "wheelhouse")}}))


@pytest.mark.parametrize("text", ["0/3", "4/3", "a/b"])
def test_a_host_task_exits_2_naming_the_flag_before_any_host(tmp_path, capsys, contacted, text):
    from gpuprov.tasks.facts import facts

    with pytest.raises(Exit) as caught:
        facts(context(tmp_path), all=True, shard=text)
    assert caught.value.code == 2 and contacted == []
    assert "error: select hosts: --shard " in capsys.readouterr().err


def test_a_host_task_works_on_its_shard_only(tmp_path, capsys, contacted):
    from gpuprov.tasks.facts import facts

    with pytest.raises(Exit):   # the stand-in hosts answer nothing, so their facts fail: who was contacted counts
        facts(context(tmp_path), all=True, json_=True, shard="2/2")
    assert sorted(contacted) == ["gpu02", "gpu04"]
    assert "shard 2/2: 2 of the 4 hosts selected" in capsys.readouterr().err


def test_every_host_task_takes_the_flag():
    from gpuprov.tasks import namespace

    ns = namespace()
    with_hosts = [name for name in ns.task_names if "host" in [a.name for a in ns[name].get_arguments()]]
    missing = [name for name in with_hosts if "shard" not in [a.name for a in ns[name].get_arguments()]]
    assert {"facts", "validate.validate", "harden", "provision", "preflight", "rollout"} <= set(with_hosts)
    # inventory.show and monitoring.server name one host: nothing to split
    assert set(missing) <= {"inventory.show", "monitoring.server"}


@pytest.mark.parametrize("name", ["provision", "preflight"])
def test_provision_and_preflight_work_on_their_shard_only(tmp_path, capsys, contacted, name):
    from gpuprov.tasks import provision

    with pytest.raises(Exit):
        getattr(provision, name)(context(tmp_path), all=True, json_=True, shard="1/2")
    assert sorted(contacted) == ["gpu01", "gpu03"]
    assert "shard 1/2: 2 of the 4 hosts selected" in capsys.readouterr().err


def test_a_fleet_report_records_its_shard_and_an_unsharded_one_none(tmp_path, capsys, contacted):
    import json

    from gpuprov.tasks.provision import preflight

    for shard, folder in (("2/2", "sharded"), (None, "whole")):
        c = context(tmp_path)
        c.config.gpuprov.reports = str(tmp_path / folder)
        with pytest.raises(Exit):
            preflight(c, all=True, json_=True, shard=shard)
    sharded, whole = (json.loads((tmp_path / f / "preflight-latest.json").read_text()) for f in ("sharded", "whole"))
    # the selection's digest worked out here: sha256 of the sorted names, one a line, its first 16 hex digits
    digest = hashlib.sha256(b"gpu01\ngpu02\ngpu03\ngpu04").hexdigest()[:16]
    assert sharded["shard"] == {"index": 2, "count": 2, "selected": 4, "selection": digest}
    assert [h["host"] for h in sharded["hosts"]] == ["gpu02", "gpu04"]
    assert whole["shard"] is None and len(whole["hosts"]) == 4


def test_provision_refuses_moving_the_lock_from_a_shard(tmp_path, capsys, contacted):
    from gpuprov.tasks.provision import provision

    with pytest.raises(Exit) as caught:
        provision(context(tmp_path), all=True, update_lock=True, shard="1/2")
    assert caught.value.code == 2 and contacted == []
    assert "error: provision: --update-lock with --shard 1/2: a group's lock is resolved" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["1/2", "x"])
def test_rollout_refuses_the_flag_saying_why_before_any_host(tmp_path, capsys, contacted, text):
    from gpuprov.tasks.rollout import rollout

    with pytest.raises(Exit) as caught:
        rollout(context(tmp_path), all=True, shard=text)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and contacted == [] and not (tmp_path / "reports").exists()
    assert f"error: rollout: --shard {text}: a rollout is not split into shards: --max-unavailable" in err
    assert "next: roll out from one controller" in err


def test_stack_lock_refuses_the_flag_before_any_host(tmp_path, capsys, contacted):
    from gpuprov.tasks.stack import lock

    with pytest.raises(Exit) as caught:
        lock(context(tmp_path), all=True, shard="1/2")
    assert caught.value.code == 2 and contacted == [] and not (tmp_path / "locks").exists()
    assert "error: stack.lock: --shard 1/2: stack.lock is not split into shards" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- the budget

def test_memory_that_fits_says_nothing():
    assert memory_budget(64, 32, available=8 * 1024 * MiB, per_connection=2 * MiB, per_record=MiB // 4) is None


def test_memory_past_the_share_is_a_warning_saying_what_to_do():
    # 1000 hosts, 500 at once: 500 x 2 MiB + 1000 x 0.25 MiB = 1250 MiB, over half of 2048 MiB
    note = memory_budget(1000, 500, available=2048 * MiB, per_connection=2 * MiB, per_record=MiB // 4)
    assert note is not None and "need about 1250 MiB" in note and "of the 2048 MiB available" in note
    # (1024 - 250) // 2 = 387 hosts at once fit
    assert "lower --parallel (to 387 or less) or split the run with --shard K/N" in note


def test_only_the_hosts_in_flight_hold_a_connection():
    # 10 hosts at once of 100: 10 x 2 + 100 x 0.25 = 45 MiB, fits in half of 100 MiB; all 100 at once would not
    assert memory_budget(100, 10, available=100 * MiB, per_connection=2 * MiB, per_record=MiB // 4) is None
    assert memory_budget(100, 100, available=100 * MiB, per_connection=2 * MiB, per_record=MiB // 4) is not None


def test_unknown_memory_says_nothing():
    assert memory_budget(10**6, 10**6, available=None) is None


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:          100000 kB\nMemAvailable:    8192000 kB\n")
    assert available_memory(str(meminfo)) == 8192000 * 1024
    assert available_memory(str(tmp_path / "missing")) is None


def test_open_files_past_the_hard_limit_is_a_warning():
    # 200 hosts x 6 + 20 in use + 32 margin = 1252 > 1024: (1024 - 52) // 6 = 162 at once
    note = open_files_budget(200, hard=1024, in_use=20, per_host=6, margin=32)
    assert note is not None and "need about 1252 descriptors" in note and "work on 162 at once" in note
    assert open_files_budget(100, hard=1024, in_use=20, per_host=6, margin=32) is None


@pytest.mark.parametrize("task", ["preflight", "facts"])
def test_a_run_past_the_memory_budget_is_warned_before_any_host(tmp_path, capsys, monkeypatch, task):
    """A fleet run (open_fleet) and a read of facts (gather_outcomes) check the controller's budget first."""
    import sys

    from gpuprov.core.errors import GpuprovError
    from gpuprov.tasks.facts import facts
    from gpuprov.tasks.provision import preflight

    def connect(host, *args, **kwargs):
        print(f"contacting {host.name}", file=sys.stderr)
        raise GpuprovError("refused here", host=host.name)

    monkeypatch.setattr("gpuprov.core.executor.connect", connect)
    monkeypatch.setattr("gpuprov.core.shards.available_memory", lambda: 4 * MiB)
    with pytest.raises(Exit):
        {"preflight": preflight, "facts": facts}[task](context(tmp_path), all=True, json_=True, parallel="100")
    err = capsys.readouterr().err
    # 4 hosts, all 4 at once: 4 x 1 MiB + 4 x 256 KiB = 5 MiB, more than half of 4 MiB
    warning = "warning: memory: 4 hosts, 4 at once, need about 5 MiB on this controller"
    assert warning in err and "of the 4 MiB available" in err
    assert err.index(warning) < err.index("contacting gpu0")


def test_a_run_within_the_budget_says_nothing(tmp_path, capsys, contacted):
    from gpuprov.tasks.provision import preflight

    with pytest.raises(Exit):
        preflight(context(tmp_path), all=True, json_=True)
    assert "warning: memory" not in capsys.readouterr().err and sorted(contacted) == [f"gpu0{i}" for i in range(1, 5)]


def test_the_open_files_warning_names_the_pool_the_executor_will_size(monkeypatch):
    """budget_notices says what fit_open_files (the executor's pool) will then do with the same limit."""
    import resource

    from gpuprov.core.open_files import fit_open_files
    from gpuprov.core.shards import budget_notices

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: None)
    monkeypatch.setattr("gpuprov.core.open_files._open_descriptors", lambda: 20)
    monkeypatch.setattr("gpuprov.core.shards.available_memory", lambda: None)
    # 400 hosts x 6 + 20 in use + 32 margin = 2452 > 1024: (1024 - 52) // 6 = 162 at once
    [note] = budget_notices(1000, 400)
    assert note.startswith("open files: 400 hosts at once need about 2452 descriptors, over the hard limit 1024: "
                           "the run will work on 162 at once")
    assert fit_open_files(400).parallel == 162
    assert budget_notices(1000, 100) == []       # 100 x 6 + 52 = 652 fits under the hard limit


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc/self/statm (Linux)")
def test_a_connection_in_flight_takes_less_memory_than_the_budget_allows(tmp_path, ssh_server):  # noqa: F811
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gpuprov.core.connection import HostConnection

    port, known_hosts = ssh_server
    identity = tmp_path / "id_ed25519"
    identity.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    count = 8
    warm = HostConnection(Host(name="warm", address="127.0.0.1", port=port, user="root",
                               identity_file=str(identity)), known_hosts=known_hosts, retries=0)
    warm.run("true")     # the first connection loads paramiko's and cryptography's modules: not per host
    gc.collect()
    rss_before = rss()
    tracemalloc.start()
    conns = []
    try:
        for index in range(count):
            conn = HostConnection(Host(name=f"gpu{index:02d}", address="127.0.0.1", port=port, user="root",
                                       identity_file=str(identity)), known_hosts=known_hosts, retries=0)
            conns.append(conn)
            assert conn.run("true").stdout == "ok\n"
        traced = tracemalloc.get_traced_memory()[0] / count
        resident = (rss() - rss_before) / count
    finally:
        tracemalloc.stop()
        for conn in [warm, *conns]:
            conn.close()
    print(f"per connection: {traced / 1024:.0f} KiB traced, {resident / 1024:.0f} KiB resident")
    assert 0 < traced < MEMORY_PER_CONNECTION and resident < MEMORY_PER_CONNECTION


def test_validate_refuses_a_multi_node_run_of_one_shard_before_any_host(tmp_path, capsys, contacted):
    from gpuprov.tasks.validate import validate

    with pytest.raises(Exit) as caught:
        validate(context(tmp_path), all=True, multi_node=True, shard="1/2")
    assert caught.value.code == 2 and contacted == []
    assert "error: validate: --multi-node with --shard: one all-reduce needs every host" in capsys.readouterr().err
