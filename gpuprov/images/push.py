"""Push built images to a registry through the Docker SDK, with each layer's progress.

Credentials never travel on a command line and are never printed: GPUPROV_REGISTRY_USER and
GPUPROV_REGISTRY_PASSWORD, when set, go to the engine in the SDK's X-Registry-Auth header; otherwise the SDK uses
what `docker login` stored (~/.docker/config.json and its credential helpers). The password is registered with
gpuprov.core.secrets, so that every message, report and JSON output has it replaced by ***.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.secrets import mask, register

USER_ENV = "GPUPROV_REGISTRY_USER"
PASSWORD_ENV = "GPUPROV_REGISTRY_PASSWORD"
# the statuses worth a line; the engine sends "Pushing" with byte counts many times a second
SHOWN = ("Preparing", "Waiting", "Layer already exists", "Pushed", "Mounted from")


@dataclass
class Pushed:
    """One pushed reference: the manifest digest the registry stored, and each layer's last status."""

    reference: str
    digest: str
    size: int | None
    seconds: float
    layers: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"reference": self.reference, "digest": self.digest, "size": self.size,
                "seconds": round(self.seconds, 3), "layers": self.layers}


def registry_auth(environ: Mapping[str, str] = os.environ) -> dict | None:
    """The SDK's auth_config from GPUPROV_REGISTRY_USER / _PASSWORD (None: use docker login's)."""
    user, password = environ.get(USER_ENV), environ.get(PASSWORD_ENV)
    if not user and not password:
        return None
    if not (user and password):
        raise InputError(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither (then `docker login` applies)",
                         step="images.push")
    register(password)
    return {"username": user, "password": password}


def push_image(api, reference: str, *, auth: dict | None = None,
               on_line: Callable[[str], None] = lambda line: None) -> Pushed:
    """Push `reference` (REGISTRY/NAME:TAG, already tagged on the engine), reporting each layer's status
    changes; GpuprovError (credentials masked) when the engine or the registry refuses."""
    import docker.errors
    from docker.utils import parse_repository_tag

    register((auth or {}).get("password"))
    repository, tag = parse_repository_tag(reference)
    started = time.monotonic()
    layers: dict[str, str] = {}
    digest, size = None, None
    try:
        for item in api.push(repository, tag=tag or "latest", stream=True, decode=True, auth_config=auth):
            if "error" in item or "errorDetail" in item:
                message = str((item.get("errorDetail") or {}).get("message") or item.get("error"))
                raise GpuprovError(f"push of {reference} failed: {mask(message)}", step="images.push",
                                   hint="check the registry address, that it answers, and the credentials "
                                        f"({USER_ENV}/{PASSWORD_ENV} or docker login)")
            status, layer = str(item.get("status", "")), item.get("id")
            if layer and status.startswith(SHOWN) and layers.get(layer) != status:
                layers[layer] = status
                on_line(f"{reference}: layer {layer} {status}")
            aux = item.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest, size = str(aux["Digest"]), aux.get("Size")
    except docker.errors.APIError as exc:
        raise GpuprovError(f"push of {reference} failed: {mask(str(exc.explanation or exc))}",
                           step="images.push", hint="is the image built and tagged? (invoke images.build)") from None
    if digest is None:
        raise GpuprovError(f"push of {reference} ended without a digest from the registry", step="images.push")
    on_line(f"{reference}: pushed {digest}")
    return Pushed(reference, digest, size, time.monotonic() - started, layers)


def lock_entry(api, image, registry: str) -> dict:
    """What stack.lock records of a pushed image (gpuprov.images.model.Image): its id, version tag, the digest the
    registry stored (the engine's RepoDigests for the registry's repository) and its io.gpuprov.min-driver
    label; InputError when this engine has not pushed it there."""
    from gpuprov.images.build import existing_image
    from gpuprov.images.labels import MIN_DRIVER
    from gpuprov.images.tags import image_tags, repository

    reference = image_tags(image, registry)[0]
    found = existing_image(api, [reference]) or {}
    base = repository(image, registry)
    digests = [item.split("@", 1)[1] for item in found.get("RepoDigests") or [] if item.startswith(f"{base}@")]
    if not digests:
        raise InputError(f"{reference} has no digest on this engine: it was not pushed from here", step="stack.lock",
                         hint=f"push it first: invoke images.build --name {image.id} --push --registry {registry}")
    labels = (found.get("Config") or {}).get("Labels") or {}
    return {"name": image.id, "tag": image.version_tag, "digest": digests[0], "min_driver": labels.get(MIN_DRIVER)}
