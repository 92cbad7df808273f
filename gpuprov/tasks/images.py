"""`invoke images.*`: the image matrix of `images/*.yaml`, rendered from `templates/` into build/images/<id>/ (the
user's ./images/ and ./templates/ when the working directory has them, else the ones gpuprov ships: gpuprov.images).

Every task reads and checks all specs first (a bad spec is exit 2 with FILE:LINE:COL: key: message, before
anything is written). `--name N` selects a spec by name (all its matrix entries) or one image by its id; repeat
it or give a comma list.
"""

from __future__ import annotations

from gpuprov.tasks._common import check_output_files, exits_cleanly, host_task, task

NAME_HELP = "a spec name (all its matrix entries) or an image id; repeat or give a comma list (default: all)"


@task(name="list", iterable=["name"], help={"name": NAME_HELP, "json": "print exactly one JSON document"})
@exits_cleanly
def list_(c, name=None, json_=False):
    """List the images of the specs: id, purpose, base, the stack inside and the tag."""
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import console, table
    from gpuprov.images.labels import image_labels
    from gpuprov.images.spec import load_specs

    images = _selected(load_specs(), name)
    if json_:
        print(dump_json([{"id": image.id, "name": image.name, "spec": str(image.file), "purpose": image.purpose,
                          "base": image.base.reference, "tag": image.version_tag, "labels": image_labels(image)}
                         for image in images]))
        return
    rows = [[value or "-" for value in (image.id, image.purpose, image.versions.pytorch, image.versions.cuda,
                                         image.versions.nccl, image.versions.min_driver, image.version_tag,
                                         image.base.reference)] for image in images]
    console().print(table(["image", "purpose", "pytorch", "cuda", "nccl", "min driver", "tag", "base"], rows))


@task(iterable=["name"], help={"name": NAME_HELP,
                               "wheels": "download the controller's wheelhouse (about 250 MB) for the images that "
                                         "install from it (the lab's) when it is not there yet; without it such an "
                                         "image is rendered only once its wheels are downloaded (images.build does)"})
@exits_cleanly
def render(c, name=None, wheels=False):
    """Render the Dockerfile and build context of each image into build/images/<id>/.

    Nothing is downloaded unless --wheels: an image that needs its wheels is named, with the command that renders
    it."""
    from gpuprov.core.report import console, styled
    from gpuprov.images.render import WheelsNotDownloaded
    from gpuprov.images.render import render as render_image
    from gpuprov.images.spec import load_specs

    out = console()
    for image in _selected(load_specs(), name):
        try:
            rendered = render_image(image, download=wheels,
                                    say=lambda what, image=image: out.print(styled(f"{image.id}: {what}", "dim")))
        except WheelsNotDownloaded as exc:
            out.print(styled(f"{exc.message}: not rendered; {exc.hint}", "yellow"), soft_wrap=True)
            continue
        out.print(styled(f"{rendered.folder}/Dockerfile"), styled(rendered.context_hash, "dim"), soft_wrap=True)


@task(iterable=["name"], help={"name": NAME_HELP})
@exits_cleanly
def lint(c, name=None):
    """Render, then run hadolint on every Dockerfile; a finding at error or warning level fails (exit 1)."""
    from gpuprov.core.errors import GpuprovError
    from gpuprov.core.report import console, styled
    from gpuprov.images import templates_folder
    from gpuprov.images.lint import lint as hadolint
    from gpuprov.images.render import render as render_image
    from gpuprov.images.spec import load_specs

    out = console()
    findings = []
    images = _selected(load_specs(), name)
    for image in images:
        rendered = render_image(image)
        found = hadolint(rendered.folder / "Dockerfile")
        findings += found
        for finding in found:
            out.print(styled(finding, "bold red" if finding.failing else "yellow"), soft_wrap=True)
    failing = sum(finding.failing for finding in findings)
    out.print(styled(f"hadolint: {len(images)} Dockerfiles, {len(findings)} findings, {failing} at error or "
                     "warning level", "bold red" if failing else "green"))
    if failing:
        raise GpuprovError(f"hadolint found {failing} problems at error or warning level", step="images.lint",
                           hint=f"fix the block templates under {templates_folder() / 'blocks'} (or the specs), "
                                "then rerun")


@task(iterable=["name"], help={"name": NAME_HELP, "registry": "registry the tags name, such as 127.0.0.1:5000",
                               "output": "bake file to write (default build/images/docker-bake.json)"})
@exits_cleanly
def bake(c, name=None, registry=None, output=None):
    """Render, then write a docker-bake.json (contexts, tags, labels) for `docker buildx bake`."""
    from pathlib import Path

    from gpuprov.core.errors import InputError
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import console, styled
    from gpuprov.images import OUTPUT
    from gpuprov.images.bake import bake_document
    from gpuprov.images.labels import provenance
    from gpuprov.images.render import render as render_image
    from gpuprov.images.spec import load_specs
    from gpuprov.images.tags import check_registry

    registry = check_registry(registry)
    if output is not None and not str(output).strip():
        raise InputError("--output needs the path of the bake file to write, not ''", step="images.bake")
    target = Path(output) if output else OUTPUT / "docker-bake.json"
    check_output_files("--output", [target])
    images = _selected(load_specs(), name)
    document = bake_document([render_image(image) for image in images], registry, provenance())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dump_json(document) + "\n", encoding="utf-8")
    console().print(styled(f"{target}: {len(images)} targets; build them from {Path.cwd()} with: docker buildx bake "
                           f"-f {target}"), soft_wrap=True)


def _selected(images: list, names: list[str] | None) -> list:
    """The images `--name` selects: a spec's name selects all its entries, an image id one image."""
    from gpuprov.core.errors import InputError
    from gpuprov.inventory.diagnostics import suggest
    from gpuprov.tasks._common import split_names

    wanted = split_names(names, "--name")
    if not wanted:
        return images
    known = sorted({image.name for image in images} | {image.id for image in images})
    for item in wanted:
        if item not in known:
            raise InputError(f"--name: no image or spec named {item!r}{suggest(item, known)}; there are: "
                             f"{', '.join(known)}", step="images")
    return [image for image in images if image.name in wanted or image.id in wanted]


# ------------------------------------------------------------------------------- build, test, push and run

_BUILD_HELP = {
    "name": NAME_HELP,
    "changed_only": "build only the images whose rendered context changed since their last build (its hash is the "
                    "image's io.gpuprov.context-hash label)",
    "push": "push the images to --registry after they are built and verified",
    "registry": "registry the images are tagged for (and pushed to with --push), such as 127.0.0.1:5000",
    "no_cache": "run every step again (no layer cache)",
    "builder": "sdk (default: the engine's API, on its Unix socket or through the Docker SDK) or buildx (docker "
               "buildx bake, where buildx is installed)",
    "parallel": "how many images the engine builds at a time (default 2; 1: one after another)",
    "json": "print exactly one JSON document",
}


@task(iterable=["name"], help=_BUILD_HELP)
@exits_cleanly
def build(c, name=None, changed_only=False, push=False, registry=None, no_cache=False, builder="sdk", parallel=2,
          json_=False):
    """Render and build images with per-step progress, read the versions and labels back; --push sends them on.

    Each image's context is built through the engine's API (on its Unix socket, else through the Docker SDK),
    --parallel images at a time (or `docker buildx bake`), tagged <name>:<pytorch>-<cuXY|cpu>-<purpose> and with the
    git revision (and the same under --registry). After a build, torch's versions inside the image and the image's
    labels must equal the spec's (the versions read in a container of that image ID before are reused). A failed
    step shows the step and its output's tail; exit 1 when any image failed. The lab's wheelhouse is downloaded
    here, for the images that install from it."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError
    from gpuprov.core.report import check_folder
    from gpuprov.images.build import require_buildx
    from gpuprov.images.render import render as render_image
    from gpuprov.images.spec import load_specs
    from gpuprov.images.tags import check_registry
    from gpuprov.images.verify import versions_record
    from gpuprov.tasks._common import whole_number

    if builder not in ("sdk", "buildx"):
        raise InputError(f"--builder must be sdk or buildx, not {builder!r}", step="images.build")
    if builder == "buildx":
        require_buildx()
    parallel = whole_number("--parallel", parallel, 1)
    registry = check_registry(registry)
    if push and not registry:
        raise InputError("--push needs --registry: the registry to push to, such as 127.0.0.1:5000",
                         step="images.build")
    images = _selected(load_specs(), name)
    reports = path_setting(c, "reports")
    check_folder("gpuprov.reports", reports, write=True)
    check_output_files("gpuprov.reports", [reports / "images-build-latest.json"])
    check_output_files("the images build folder", [versions_record(image.id) for image in images])
    progress = _progress(quiet=json_)
    rendered = (render_image(image, say=lambda what, image=image: progress(f"{image.id}: {what}", "dim"))
                for image in images)      # each rendered while the images before it build (the SDK's builder)
    if builder == "sdk":
        results = _build_sdk(rendered, registry=registry, changed_only=changed_only, no_cache=no_cache, push=push,
                             progress=progress, parallel=parallel)
    else:
        results = _build_buildx(list(rendered), registry=registry, changed_only=changed_only, no_cache=no_cache,
                                push=push, progress=progress)
    _finish("images.build", reports, "images-build", {"builder": builder, "registry": registry, "push": push,
                                                       "changed_only": changed_only, "images": results}, json_,
            columns=["image", "result", "cached", "seconds", "pushed"])


def _progress(quiet: bool):
    """Events on stderr, each line of one as a line (nothing with --json: no console is made)."""
    from gpuprov.core.report import console, styled

    if quiet:
        return lambda text, style=None: None
    out = console(stderr=True)

    def say(text: str, style: str | None = None) -> None:
        for line in text.splitlines():
            out.print(styled(line, style), soft_wrap=True)

    return say


def _step_printer(image_id: str, progress):
    def on_event(kind: str, step) -> None:
        if kind == "start":
            shown = step.instruction if len(step.instruction) <= 100 else step.instruction[:97] + "..."
            progress(f"{image_id}: step {step.number}/{step.total} {shown}")
        elif kind == "status":
            progress(f"{image_id}: step {step.number}/{step.total} pull {step.lines[-1]}", "dim")
        elif not step.is_from:
            progress(f"{image_id}: step {step.number}/{step.total} "
                     + ("cached" if step.cached else f"done in {step.seconds:.1f} s"), "dim")

    return on_event


def _build_sdk(rendered, *, registry, changed_only, no_cache, push, progress, parallel=1) -> list[dict]:
    """Build (or, --changed-only, skip) each rendered image on the engine, verify it, push it: `parallel` images
    at a time (each image's lines name it)."""
    from gpuprov.core.errors import GpuprovError
    from gpuprov.images.build import build_engine, build_image, in_parallel
    from gpuprov.images.labels import build_labels, provenance

    engine = build_engine()
    origin = provenance()

    def one(item) -> dict:
        image = item.image
        tags = _tags(image, registry, origin.revision)
        entry = {"image": image.id, "tags": tags}
        try:
            built = build_image(engine.api, image.id, item.folder, tags,
                                labels=build_labels(item.context_hash, origin), no_cache=no_cache,
                                changed_only=changed_only, on_event=_step_printer(image.id, progress))
            entry.update(built.to_dict(), result="unchanged" if built.skipped else "built",
                         cached="-" if built.skipped else f"{built.cache_hits}/{built.work_steps}")
            if built.skipped:
                progress(f"{image.id}: unchanged since its last build ({item.context_hash}): not built", "green")
            else:
                progress(f"{image.id}: built in {built.seconds:.1f} s ({entry['cached']} steps cached)", "green")
                entry["verification"] = _verify(engine, image, tags[0], progress)
            if push:
                entry["pushed"] = _push(engine.sdk, tags, registry, progress)
        except GpuprovError as exc:
            entry.update(result="failed", error=exc.to_dict())
            progress(str(exc), "bold red")
        return entry

    return in_parallel(one, rendered, parallel)


def _build_buildx(rendered, *, registry, changed_only, no_cache, push, progress) -> list[dict]:
    """The same contexts through `docker buildx bake` (images.bake's file); --changed-only leaves out the targets
    whose image on this engine carries the context's hash."""
    from gpuprov.core.errors import GpuprovError
    from gpuprov.core.json_text import dump_json
    from gpuprov.images import OUTPUT
    from gpuprov.images.bake import bake_document, target_name
    from gpuprov.images.build import bake, bake_command, engine_client, existing_image
    from gpuprov.images.labels import CONTEXT_HASH, provenance

    client = engine_client()
    origin = provenance()
    results, targets = [], []
    for item in rendered:
        tags = _tags(item.image, registry, origin.revision)
        found = existing_image(client.api, tags) if changed_only else None
        labels = ((found or {}).get("Config") or {}).get("Labels") or {}
        unchanged = found is not None and labels.get(CONTEXT_HASH) == item.context_hash
        results.append({"image": item.image.id, "tags": tags, "result": "unchanged" if unchanged else "built"})
        if not unchanged:
            targets.append(target_name(item.image.id))
    bake_file = OUTPUT / "docker-bake.json"
    bake_file.write_text(dump_json(bake_document(rendered, registry, origin)) + "\n", encoding="utf-8")
    if targets:
        try:
            bake(bake_command(bake_file, targets, no_cache=no_cache, push=push), lambda line: progress(line, "dim"))
        except GpuprovError as exc:
            progress(str(exc), "bold red")
            for entry in results:
                if entry["result"] == "built":
                    entry.update(result="failed", error=exc.to_dict())
    return results


def _tags(image, registry: str | None, revision: str | None) -> list[str]:
    """The local tags (the version tag first), then the same under the registry."""
    from gpuprov.images.tags import image_tags

    return image_tags(image, None, revision) + (image_tags(image, registry, revision) if registry else [])


def _verify(client, image, reference: str, progress) -> dict:
    """Versions inside the image and its labels against the spec; GpuprovError naming each difference. The versions
    recorded for the image's ID by an earlier verification are reused (the same ID is the same content)."""
    from gpuprov.core.errors import GpuprovError
    from gpuprov.images.labels import image_labels
    from gpuprov.images.verify import expected_versions, verify_image, versions_record

    verification = verify_image(client, reference, expected_versions(image.versions), image_labels(image),
                                record=versions_record(image.id))
    if verification.problems:
        raise GpuprovError(f"{reference} differs from its spec: " + "; ".join(verification.problems),
                           step="verify image", hint=f"fix the spec or templates of {image.id} and build it again")
    found = verification.versions
    where = f"as read earlier in this image ({verification.image_id[:19]})" if verification.reused else "inside"
    progress(f"{image.id}: {where}: torch {found.get('torch')}, CUDA {found.get('cuda') or 'none'}, cuDNN "
             f"{found.get('cudnn') or 'none'}, NCCL {found.get('nccl') or 'none'}; labels as the spec's", "green")
    return verification.to_dict()


def _push(client, tags: list[str], registry: str, progress) -> list[dict]:
    from gpuprov.images.push import push_image, registry_auth

    auth = registry_auth()
    return [push_image(client.api, tag, auth=auth, on_line=lambda line: progress(line, "dim")).to_dict()
            for tag in tags if tag.startswith(f"{registry}/")]


def _finish(step: str, reports, kind: str, payload: dict, json_: bool, columns: list[str]) -> None:
    """The run's report, a table (or the JSON document) and exit 1 when an image failed."""
    from invoke.exceptions import Exit

    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import summary_table, write_json_report

    report = write_json_report(reports, kind, payload)
    failed = [entry for entry in payload["images"] if entry.get("result") == "failed"]
    if json_:
        print(dump_json({"report": str(report), **payload}))
    else:
        rows = [{**entry, "pushed": ", ".join(p["digest"][:19] for p in entry.get("pushed", [])) or "-"}
                for entry in payload["images"]]
        summary_table(step, rows, columns)
        print(f"report: {report}")
    if failed:
        raise Exit(code=1)


@task(iterable=["name"], help={"name": NAME_HELP, "json": "print exactly one JSON document"})
@exits_cleanly
def test(c, name=None, json_=False):
    """Run the validation smoke suite inside built images; exit 1 when a check fails.

    With --gpus all where this machine has GPUs, on the CPU otherwise."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import GpuprovError
    from gpuprov.core.report import check_folder
    from gpuprov.images.build import engine_client
    from gpuprov.images.container import machine_has_gpus
    from gpuprov.images.spec import load_specs
    from gpuprov.images.suite import run_image_suite
    from gpuprov.images.tags import image_tags
    from gpuprov.images.verify import expected_versions

    images = _selected(load_specs(), name)
    reports = path_setting(c, "reports")
    check_folder("gpuprov.reports", reports, write=True)
    check_output_files("gpuprov.reports", [reports / "images-test-latest.json"])
    progress = _progress(quiet=json_)
    client = engine_client()
    gpus = machine_has_gpus()
    results = []
    for image in images:
        reference = image_tags(image)[0]
        entry = {"image": image.id, "reference": reference, "gpus": gpus}
        progress(f"{image.id}: the smoke suite in {reference} ({'all GPUs' if gpus else 'CPU only'})")
        try:
            run = run_image_suite(client, reference, expected_versions(image.versions), gpus=gpus)
            counts = run.counts()
            entry.update(result="failed" if run.failed else "passed", document=run.document,
                         checks=", ".join(f"{count} {status}" for status, count in sorted(counts.items())))
            for failed in run.failed:
                progress(f"{image.id}: {failed['check']} failed: {failed['reason']}", "bold red")
        except GpuprovError as exc:
            entry.update(result="failed", error=exc.to_dict(), checks="-")
            progress(str(exc), "bold red")
        results.append(entry)
    _finish("images.test", reports, "images-test", {"gpus": gpus, "images": results}, json_,
            columns=["image", "result", "checks"])


@task(iterable=["name"], help={"name": NAME_HELP, "registry": "registry to push to, such as 127.0.0.1:5000",
                               "json": "print exactly one JSON document"})
@exits_cleanly
def push(c, name=None, registry=None, json_=False):
    """Tag built images for a registry and push them, with each layer's progress.

    Credentials come from GPUPROV_REGISTRY_USER/GPUPROV_REGISTRY_PASSWORD or docker login, never from a command
    line."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import GpuprovError, InputError
    from gpuprov.core.report import check_folder
    from gpuprov.images.build import engine_client, existing_image
    from gpuprov.images.labels import provenance
    from gpuprov.images.spec import load_specs
    from gpuprov.images.tags import check_registry

    registry = check_registry(registry)
    if not registry:
        raise InputError("--registry is required: the registry to push to, such as 127.0.0.1:5000",
                         step="images.push")
    images = _selected(load_specs(), name)
    reports = path_setting(c, "reports")
    check_folder("gpuprov.reports", reports, write=True)
    check_output_files("gpuprov.reports", [reports / "images-push-latest.json"])
    progress = _progress(quiet=json_)
    client = engine_client()
    revision = provenance().revision
    results = []
    for image in images:
        tags = _tags(image, registry, revision)
        entry = {"image": image.id, "tags": tags}
        try:
            found = existing_image(client.api, tags[:1])
            if found is None:
                raise GpuprovError(f"{tags[0]} is not built on this engine", step="images.push",
                                   hint=f"build it first: invoke images.build --name {image.id}")
            for reference in tags:   # an image unchanged since an older commit gets this commit's tags too
                repository, _, tag = reference.rpartition(":")
                client.api.tag(found["Id"], repository, tag, force=True)
            entry.update(result="pushed", pushed=_push(client, tags, registry, progress))
        except GpuprovError as exc:
            entry.update(result="failed", error=exc.to_dict())
            progress(str(exc), "bold red")
        results.append(entry)
    _finish("images.push", reports, "images-push", {"registry": registry, "images": results}, json_,
            columns=["image", "result", "pushed"])


@host_task(help={
    "name": "the image id (or a spec name with one image) to run; the command to run follows --",
    "registry": "the registry as the hosts reach it, such as 10.0.0.5:5000 (default: the hosts' images.registry)",
    "detach": "start the container in the background and return (default: wait, print its output, remove it)",
    "container": "the container's name (default: gpuprov-<name>-<UTC time>)",
    "json": "print exactly one JSON document",
})
def run(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False, name=None,
        registry=None, detach=False, container=None, json_=False):
    """Pull an image on hosts and start it with the flags a PyTorch job needs: images.run --host H --name N [-- CMD].

    `--gpus all` (where the host has GPUs), `--ipc=host` (or the host's images.shm_size), `--ulimit memlock=-1
    --ulimit stack=67108864`, the data_dir and images.output_dir mounts. A host whose driver is older than the
    image's io.gpuprov.min-driver is refused before anything is pulled (unless its stack uses forward
    compatibility). A host whose lock records the image pulls the locked digest. Each host's output (or error) is
    printed, and the run's report written: reports/images-run-<UTC time>.json (Ctrl-C: what completed, exit 130)."""
    import sys

    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError
    from gpuprov.core.runtime import run_fleet
    from gpuprov.images.labels import MIN_DRIVER, image_labels
    from gpuprov.images.run import check_container, container_name, run_vars
    from gpuprov.images.run_job import ImageRunJob
    from gpuprov.images.spec import load_specs
    from gpuprov.images.tags import check_registry
    from gpuprov.stack.lock import locked_images, locks_for
    from gpuprov.tasks._common import finish, open_fleet

    if not name:
        raise InputError("--name is required: the image to run (invoke images.list shows them)", step="images.run")
    chosen = _selected(load_specs(), [name])
    if len(chosen) != 1:
        raise InputError(f"--name {name} selects {len(chosen)} images: name one of {', '.join(i.id for i in chosen)}",
                         step="images.run")
    image = chosen[0]
    registry = check_registry(registry)
    check_container(container)
    command = remainder(sys.argv)
    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       json_=json_, kind=ImageRunJob.kind)
    settings = {h.name: run_vars(h) for h in fleet.hosts}
    registries = {h.name: registry or settings[h.name].registry for h in fleet.hosts}
    missing = sorted(name for name, value in registries.items() if not value)
    if missing:
        raise InputError(f"no registry for {', '.join(missing)}: give --registry, or set the hosts' images.registry",
                         step="images.run")
    locks_dir = path_setting(c, "locks")
    job = ImageRunJob(image, registries=registries, settings=settings, stacks=locks_for(fleet.hosts, locks_dir),
                      locked=locked_images(fleet.hosts, locks_dir), min_driver=image_labels(image).get(MIN_DRIVER),
                      container=container or container_name(image.name), detach=detach, command=command)
    finish(run_fleet(fleet, job))


def remainder(argv: list[str]) -> list[str]:
    """The words after the first `--` of the command line (the command to run in the container), as given."""
    return argv[argv.index("--") + 1:] if "--" in argv else []
