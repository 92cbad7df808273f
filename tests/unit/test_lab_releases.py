"""Lab hosts of other Debian releases: `--profile NAME@RELEASE`, a bad release refused before anything is touched,
each release its own debootstrapped base image (and so host image), hosts of another release never reused.

What the hosts run (their python3, systemd, sshd) is judged on real hosts: tests/lab/test_validate_releases_lab.py.
"""

from __future__ import annotations

import docker.errors
import pytest

import gpuprov.lab
from gpuprov.core.errors import InputError
from gpuprov.lab import hosts, images
from gpuprov.lab.labels import HOST_ROLE, LABEL, PROFILE_LABEL, ROLE_LABEL
from gpuprov.lab.profiles import assign_profiles
from gpuprov.lab.state import LabPaths


def test_a_profile_names_its_release_and_bookworm_is_the_default():
    chosen = assign_profiles(4, ["hgx-h100@bullseye", "l40s@trixie", "a100-pcie"])
    assert [(p.name, p.release) for p in chosen] == [("hgx-h100", "bullseye"), ("l40s", "trixie"),
                                                     ("a100-pcie", "bookworm"), ("hgx-h100", "bullseye")]
    assert {p.release for p in assign_profiles(6, None)} == {"bookworm"}
    # the hardware is the profile's whatever the release
    assert chosen[0].devices == assign_profiles(1, ["hgx-h100"])[0].devices


@pytest.mark.parametrize("spec, wanted", [
    ("l40s@buster", "--profile l40s@buster: unknown Debian release 'buster'"),
    ("l40s@Trixie", "--profile l40s@Trixie: unknown Debian release 'Trixie'"),
    ("l40s@bookworm@trixie", "unknown Debian release 'bookworm@trixie'"),
    ("l40s@", "--profile l40s@: no Debian release after '@'"),
])
def test_a_bad_release_is_a_clear_error(spec, wanted):
    with pytest.raises(InputError) as caught:
        assign_profiles(1, [spec])
    assert wanted in caught.value.message
    assert "bookworm, bullseye, trixie" in caught.value.hint or "NAME@RELEASE" in caught.value.hint
    assert caught.value.exit_code == 2


def test_an_unknown_profile_with_a_release_is_named_without_it():
    with pytest.raises(InputError) as caught:
        assign_profiles(1, ["l41s@trixie"])
    assert "unknown lab profile(s): l41s" in caught.value.message


def test_lab_up_refuses_a_bad_release_before_it_touches_the_engine(tmp_path, monkeypatch):
    def engine(*_):
        raise AssertionError("the engine was touched")

    monkeypatch.setattr("gpuprov.lab.engine.ensure_engine", engine)
    with pytest.raises(InputError, match="unknown Debian release 'sid'"):
        gpuprov.lab.up(2, ["l40s@sid"], paths=LabPaths(tmp_path))
    assert not (tmp_path / ".lab").exists()


# ---- images: one base per release ----------------------------------------------------------------------------------

def test_each_release_has_its_own_base_and_host_image():
    tags = {release: images.base_tag(release) for release in ("bookworm", "bullseye", "trixie")}
    assert len(set(tags.values())) == 3
    assert images.base_tag() == tags["bookworm"]              # the default lab's cached base stays valid
    assert all(tag.startswith("gpuprov-lab/") for tag in tags.values())
    host_tags = {images.host_tag(images.host_context(base, "ssh-ed25519 AAAA lab")) for base in tags.values()}
    assert len(host_tags) == 3


class _NoImages:
    """An engine without the image: images.get raises as the Docker SDK does."""

    def __init__(self):
        self.imported: list[dict] = []
        self.images = self
        self.api = self

    def get(self, tag):
        raise docker.errors.ImageNotFound(f"No such image: {tag}")

    def import_image_from_file(self, archive, **options):
        self.imported.append(options)


@pytest.mark.parametrize("release", ["bullseye", "trixie"])
def test_a_base_image_is_debootstrapped_from_its_release(release, monkeypatch):
    commands = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    monkeypatch.setattr(images.shutil, "which", lambda *_a, **_k: "/usr/sbin/debootstrap")
    monkeypatch.setattr(images.subprocess, "run", lambda cmd, **_: commands.append(cmd) or Done())
    client = _NoImages()
    tag = images.ensure_base_image(client, lambda _: None, release)
    debootstrap = commands[0]
    assert debootstrap[0] == "debootstrap" and debootstrap[-3] == release and debootstrap[-1] == images.MIRROR
    included = next(arg for arg in debootstrap if arg.startswith("--include=")).removeprefix("--include=").split(",")
    assert set(images.BASE_PACKAGES) <= set(included)
    # Debian's python3.9 has no distutils without python3-distutils, and pip imports it before 3.10
    assert ("python3-distutils" in included) is (release == "bullseye")
    assert tag == images.base_tag(release)
    assert client.imported[0]["repository"] + ":" + client.imported[0]["tag"] == tag


# ---- hosts: a host of another release is replaced, not reused ------------------------------------------------------

class _Container:
    def __init__(self, release: str | None, image: str):
        self.name, self.status = "gpuprov-lab-01", "running"
        self.labels = {LABEL: "1", ROLE_LABEL: HOST_ROLE, PROFILE_LABEL: "l40s",
                       hosts.PORT_LABEL: str(hosts.host_port(1)), hosts.RUN_LABEL: hosts.RUN_DIGEST}
        if release is not None:
            self.labels[hosts.RELEASE_LABEL] = release
        self.image = type("Image", (), {"tags": [image]})()
        self.removed = False

    def start(self):
        raise AssertionError("a kept host is running already")


@pytest.mark.parametrize("existing, wanted, reused", [
    ("bookworm", "trixie", False),
    (None, "bookworm", True),            # a host made before releases runs bookworm
    (None, "bullseye", False),
    ("bullseye", "bullseye", True),
])
def test_reconcile_keeps_a_host_only_of_the_wanted_release(existing, wanted, reused, tmp_path, monkeypatch):
    tags = {"bookworm": "gpuprov-lab/host:b12", "bullseye": "gpuprov-lab/host:b11", "trixie": "gpuprov-lab/host:t13"}
    paths = LabPaths(tmp_path)
    (paths.host_keys / "gpuprov-lab-01").mkdir(parents=True)
    (paths.host_keys / "gpuprov-lab-01" / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAA root\n")
    container = _Container(existing, tags[existing or "bookworm"])
    created = []

    class Client:
        class containers:
            @staticmethod
            def list(**_):
                return []

            @staticmethod
            def get(_name):
                return container

    monkeypatch.setattr(hosts, "lab_containers", lambda _: [container])
    monkeypatch.setattr(hosts, "ensure_network", lambda *_: "network")
    monkeypatch.setattr(hosts, "remove_container", lambda c: setattr(c, "removed", True))
    monkeypatch.setattr(hosts, "create_host", lambda _c, index, profile, image, *_: created.append((index, image)))
    monkeypatch.setattr(hosts, "wait_ready", lambda *_: "running")
    monkeypatch.setattr(container, "reload", lambda: None, raising=False)
    monkeypatch.setattr(hosts, "host_from_container", lambda c: c.name)
    monkeypatch.setattr(hosts, "write_files", lambda *_: None)
    hosts.reconcile(Client(), assign_profiles(1, [f"l40s@{wanted}"]), tags, paths, lambda _: None)
    assert container.removed is not reused
    assert created == ([] if reused else [(1, tags[wanted])])


def test_a_host_made_before_releases_reads_as_bookworm():
    container = _Container(None, "gpuprov-lab/host:b12")
    container.id, container.attrs = "c1", {}
    assert hosts.host_from_container(container).release == "bookworm"
    container.labels[hosts.RELEASE_LABEL] = "trixie"
    assert hosts.host_from_container(container).release == "trixie"
