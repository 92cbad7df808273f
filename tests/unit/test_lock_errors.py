"""Corrupt lock files fail clearly: InputError (exit 2) naming the file, the line and column, and the key."""

import textwrap

import pytest

from gpuprov.core.errors import InputError
from gpuprov.stack.lock import load_lock

GOOD = textwrap.dedent("""\
    lock_version: 1
    inputs:
      group: hgx
    stack:
      gpu:
        model: H100-SXM
        arch: hopper
        compute_capability: '9.0'
        datacenter: true
      os: ubuntu-22.04
      driver:
        branch: '570'
        version: 570.148.08
        kernel_modules: open
        packages:
        - name: nvidia-open-570
          version: 570.148.08-1ubuntu1
      cuda:
        version: 12.8.1
        packages:
        - name: cuda-toolkit-12-8
          version: 12.8.1-1
      forward_compat: false
      nccl:
        version: 2.26.5
        packages:
        - name: libnccl2
          version: 2.26.5-1+cuda12.9
      container_toolkit:
        version: 1.17.8
        packages:
        - name: nvidia-container-toolkit
          version: 1.17.8-1
      fabricmanager:
        version: 570.148.08
        packages:
        - name: nvidia-fabricmanager-570
          version: 570.148.08-1
      dcgm:
        version: 4.2.3
        packages:
        - name: datacenter-gpu-manager-4-core
          version: 1:4.2.3-1
      ngc_pytorch: 25.04-py3
      pytorch:
        version: '2.7'
        wheel: cu128
    """)
DRIVER = """\
  driver:
    branch: '570'
    version: 570.148.08
    kernel_modules: open
    packages:
    - name: nvidia-open-570
      version: 570.148.08-1ubuntu1
"""
CUDA = """\
  cuda:
    version: 12.8.1
    packages:
    - name: cuda-toolkit-12-8
      version: 12.8.1-1
"""
FABRICMANAGER = """\
  fabricmanager:
    version: 570.148.08
    packages:
    - name: nvidia-fabricmanager-570
      version: 570.148.08-1
"""


def edit(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


def load_error(tmp_path, content: str | bytes) -> tuple[str, str]:
    """(path, message) of the InputError that loading `content` as a lock raises; the file stays as it was."""
    path = tmp_path / "gpu.lock.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    before = path.read_bytes()
    with pytest.raises(InputError) as caught:
        load_lock(path)
    assert caught.value.exit_code == 2
    assert path.read_bytes() == before
    return str(path), caught.value.message


def test_the_good_lock_loads(tmp_path):
    path = tmp_path / "gpu.lock.yaml"
    path.write_text(GOOD)
    lock = load_lock(path)
    assert lock["stack"]["driver"]["packages"] == [{"name": "nvidia-open-570", "version": "570.148.08-1ubuntu1"}]
    path.write_text(edit(FABRICMANAGER, "  fabricmanager: null\n").replace("inputs:\n  group: hgx\n", ""))
    lock = load_lock(path)
    assert lock["stack"]["fabricmanager"] is None and lock["inputs"] == {}


@pytest.mark.parametrize(("content", "place", "message"), [
    # a package version that YAML reads as a number
    (edit("      version: 570.148.08-1ubuntu1", "      version: 570.5"),
     "17:16: stack.driver.packages[0].version", "must be a string (quote it), not 570.5"),
    (edit("    version: 570.148.08\n    kernel", "    version: 570\n    kernel"),
     "13:14: stack.driver.version", "must be a string (quote it), not 570"),
    (edit("    version: 2.26.5", "    version: 2.26"), "25:14: stack.nccl.version", "must be a string"),
    (edit("    version: 12.8.1\n", "    version: twelve\n"), "19:14: stack.cuda.version", "bad version 'twelve'"),
    # package entries without a name or a version, or with an unusable one
    (edit("    - name: nvidia-open-570\n      version: 570.148.08-1ubuntu1", "    - version: 570.148.08-1ubuntu1"),
     "16:7: stack.driver.packages[0].name", "missing"),
    (edit("    - name: nvidia-open-570\n      version: 570.148.08-1ubuntu1", "    - name: nvidia-open-570"),
     "16:7: stack.driver.packages[0].version", "missing"),
    (edit("    - name: libnccl2", "    - name: 'libnccl2; reboot'"),
     "27:13: stack.nccl.packages[0].name", "not a valid package name"),
    (edit("      version: 1:4.2.3-1", "      version: '1:4.2.3 -1'"),
     "43:16: stack.dcgm.packages[0].version", "not a valid package version"),
    (edit("    - name: libnccl2\n      version: 2.26.5-1+cuda12.9", "    - libnccl2"), "27:7: stack.nccl.packages[0]",
     "must be a mapping, not str"),
    # null or wrong-typed sections
    ("lock_version: 1\nstack: null\n", "2:8: stack", "must be a mapping, not empty (null)"),
    ("lock_version: 1\nstack:\n", "2:7: stack", "must be a mapping, not empty (null)"),
    (edit(DRIVER, "  driver: [570.148.08]\n"), "11:11: stack.driver", "must be a mapping, not a list"),
    (edit(CUDA, "  cuda:\n    version: 12.8.1\n    packages: {cuda-toolkit-12-8: 12.8.1-1}\n"),
     "20:15: stack.cuda.packages", "must be a list, not a mapping"),
    (edit(CUDA, "  cuda:\n    version: 12.8.1\n    packages: []\n"), "20:15: stack.cuda.packages", "must not be empty"),
    (edit(CUDA, "  cuda: null\n"), "18:9: stack.cuda", "must be a mapping, not empty (null)"),
    (edit(CUDA, ""), "5:3: stack.cuda", "missing"),
    (edit(FABRICMANAGER, "  fabricmanager: yes\n"), "34:18: stack.fabricmanager", "must be a mapping, not a boolean"),
    (edit("  forward_compat: false", "  forward_compat: 'no'"), "23:19: stack.forward_compat",
     "must be true or false, not 'no'"),
    (edit("  os: ubuntu-22.04", "  os: ubuntu-18.04"), "10:7: stack.os", "must be one of ubuntu-22.04"),
    (edit("    kernel_modules: open", "    kernel_modules: closed"), "14:21: stack.driver.kernel_modules",
     "must be one of open, proprietary"),
    (edit("    datacenter: true", "    datacenter: 1"), "9:17: stack.gpu.datacenter", "must be true or false"),
    (edit("    wheel: cu128", "    wheel: 128"), "47:12: stack.pytorch.wheel", "must be a string"),
    (edit("inputs:\n  group: hgx", "inputs: [hgx]"), "2:9: inputs", "must be a mapping, not a list"),
    (GOOD + "  nscq: 570.148.08\n", "48:9: stack.nscq", "must be a mapping, not str"),
    # the top level
    (edit("lock_version: 1", "lock_version: 9"), "1:15: lock_version", "reads lock_version 1, not 9"),
    (edit("lock_version: 1", "lock_version: '1'"), "1:15: lock_version", "reads lock_version 1, not '1'"),
    (edit("lock_version: 1\n", ""), "1:1: lock_version", "missing"),
    (GOOD + "extra: 1\n", "48:1: extra", "unknown key"),
    (GOOD + "stack: {}\n", "48:1: stack", "duplicate key 'stack' (first at line 4)"),
    ("- lock_version: 1\n", "1:1: (top level)", "must be a mapping with lock_version, inputs and stack, not a list"),
    ("just text\n", "1:1: (top level)", "not str"),
    (edit("  os: ubuntu-22.04", "  os: !vault ubuntu-22.04"), "10:7: stack.os", "unsupported YAML tag '!vault'"),
])
def test_a_corrupt_lock_names_file_line_column_and_key(tmp_path, content, place, message):
    path, text = load_error(tmp_path, content)
    assert text.startswith(f"{path}:{place}: ")
    assert message in text


@pytest.mark.parametrize(("content", "place", "message"), [
    (b"lock_version: 1\nstack: \xff\xfe\n", "2:8: (file)", "not UTF-8 text"),
    ("lock_version: 1\nstack: [unclosed\n", "3:1: (file)", "YAML syntax error"),
    ("lock_version: 1\n  stack: {}\n", "2:8: (file)", "YAML syntax error"),
    ("lock_version: 1\x07\n", "1:16: (file)", "not allowed in YAML"),
    ("", "1:1: (file)", "the file is empty"),
    ("# only a comment\n", "1:1: (file)", "the file is empty"),
])
def test_a_file_that_is_not_yaml_names_the_place(tmp_path, content, place, message):
    path, text = load_error(tmp_path, content)
    assert text.startswith(f"{path}:{place}: ")
    assert message in text


def test_a_syntax_error_names_where_its_construct_began(tmp_path):
    content = ("lock_version: 1\ninputs: {}\nstack:\n  os: ubuntu-22.04\n  gpu: H100-SXM\n  a: 1\n"
               "  driver: [570, 1\n  cuda: x\n")
    path, text = load_error(tmp_path, content)
    assert text == (f"{path}:8:7: (file): YAML syntax error: did not find expected ',' or ']' (while parsing a flow "
                    "sequence that began at line 7, column 11)")


def test_every_problem_is_listed_in_file_order(tmp_path):
    content = edit("  os: ubuntu-22.04", "  os: 7").replace("      version: 12.8.1-1", "      version: 12.8")
    path, text = load_error(tmp_path, content)
    assert text.splitlines() == [f"{path}: 2 errors:",
                                 f"  {path}:10:7: stack.os: must be one of ubuntu-22.04, ubuntu-24.04, debian-12, "
                                 "rhel-9, rocky-9, not 7",
                                 f"  {path}:22:16: stack.cuda.packages[0].version: must be a string (quote it), "
                                 "not 12.8"]


def test_runaway_yaml_is_refused_not_crashed(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(6))
    path, text = load_error(tmp_path, bomb)
    assert path in text
    path, text = load_error(tmp_path, "[" * 5000 + "]" * 5000)
    assert path in text


def test_a_directory_is_not_a_lock(tmp_path):
    folder = tmp_path / "gpu.lock.yaml"
    folder.mkdir()
    with pytest.raises(InputError) as caught:
        load_lock(folder)
    assert caught.value.exit_code == 2 and caught.value.message == f"{folder}: not a file"


def test_the_error_says_what_to_do(tmp_path):
    path = tmp_path / "gpu.lock.yaml"
    path.write_text("lock_version: 2\n")
    with pytest.raises(InputError) as caught:
        load_lock(path)
    assert "invoke stack.lock" in caught.value.hint


# ------------------------------------------------------------------ through the tasks, before any host

TASK_CASES = [
    # binary: a PNG header where the lock should be
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "1:1: (file): not UTF-8 text"),
    (b"lock_version: 1\x00\n", "1:16: (file): character '\\x00' is not allowed in YAML"),
    # bad YAML
    ("lock_version: 1\nstack: [unclosed\n", "3:1: (file): YAML syntax error: did not find expected ',' or ']' "
                                            "(while parsing a flow sequence that began at line 2, column 8)"),
    # wrong types
    (edit("      version: 570.148.08-1ubuntu1", "      version: 570.5"),
     "17:16: stack.driver.packages[0].version: must be a string (quote it), not 570.5"),
    ("- lock_version: 1\n", "1:1: (top level): must be a mapping with lock_version, inputs and stack, not a list"),
    # null sections
    (edit(CUDA, "  cuda: null\n"), "18:9: stack.cuda: must be a mapping, not empty (null)"),
    ("lock_version: 1\nstack:\n", "2:7: stack: must be a mapping, not empty (null)"),
]


@pytest.fixture
def hosts_task(tmp_path, monkeypatch):
    """(context, contacted host names) for running provision and stack.check on gpu01 of group hgx."""
    from invoke import Config, Context

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  gpu01: {address: 192.0.2.11, groups: [hgx]}\ngroups:\n  hgx:\n    vars:\n"
                         "      hardware: {gpu: H100-SXM, count: 8, nvswitch: true}\n")
    contacted: list[str] = []

    def connect(host, *args, **kwargs):
        contacted.append(host.name)
        raise AssertionError("a host was contacted")

    monkeypatch.setattr("gpuprov.core.executor.connect", connect)
    c = Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "locks": str(tmp_path / "locks"), "reports": str(tmp_path / "reports"),
        "known_hosts": str(tmp_path / "known_hosts")}}))
    return c, contacted


def run_task(name: str, c, capsys) -> tuple[int, str]:
    from invoke.exceptions import Exit

    from gpuprov.tasks import provision as provision_tasks
    from gpuprov.tasks import stack as stack_tasks

    task = {"provision": provision_tasks.provision, "stack.check": stack_tasks.check}[name]
    with pytest.raises(Exit) as caught:
        task(c, host=["gpu01"])
    return caught.value.code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["provision", "stack.check"])
@pytest.mark.parametrize(("content", "error"), TASK_CASES)
def test_a_corrupt_lock_stops_the_task_before_any_host(tmp_path, capsys, hosts_task, name, content, error):
    c, contacted = hosts_task
    path = tmp_path / "locks" / "hgx.lock.yaml"
    path.parent.mkdir()
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    before = path.read_bytes()
    code, err = run_task(name, c, capsys)
    assert code == 2
    assert err.splitlines()[0] == f"error: {path}:{error}"
    assert "Traceback" not in err
    assert contacted == [] and path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.yaml", "locks"]


@pytest.mark.parametrize("name", ["provision", "stack.check"])
def test_a_lock_that_is_a_folder_stops_the_task_before_any_host(tmp_path, capsys, hosts_task, name):
    c, contacted = hosts_task
    folder = tmp_path / "locks" / "gpu01.lock.yaml"
    folder.mkdir(parents=True)
    code, err = run_task(name, c, capsys)
    assert code == 2 and err.splitlines()[0] == f"error: {folder}: not a file"
    assert contacted == [] and list(folder.iterdir()) == []


def test_a_key_with_a_line_break_cannot_forge_an_error_line(tmp_path, capsys, hosts_task):
    c, _ = hosts_task
    path = tmp_path / "locks" / "hgx.lock.yaml"
    path.parent.mkdir()
    path.write_text(GOOD + '"x\\n/etc/passwd:1:1: stack: forged": 1\n')
    code, err = run_task("stack.check", c, capsys)
    assert code == 2
    assert err.splitlines()[0] == f"error: {path}:48:1: x\\n/etc/passwd:1:1: stack: forged: unknown key; a lock has " \
                                  "lock_version, inputs, stack and images"
    assert not any(line.startswith("/etc/passwd") for line in err.splitlines())
