"""The images.run variables, declared once (gpuprov.inventory.variables) and checked at load;
gpuprov.images.run.run_vars reads them (and data_dir, validation's) with their defaults.

    images:
      registry: 10.0.0.5:5000     where the host pulls images from (images.run --registry wins)
      output_dir: /srv/out        mounted at the same path
      shm_size: 64g               a sized /dev/shm instead of the host's IPC namespace (--ipc=host)
      memlock: 8388608            the locked-memory limit in bytes; null: the engine's own; default -1, unlimited
"""

from __future__ import annotations

import re

from gpuprov.inventory.variables import Spec, declare

SHM_SIZE = re.compile(r"[1-9][0-9]*[bkmg]?")

VARIABLES = declare(
    "images",
    Spec("images", "mapping", "how images.run starts images on the host", null=True),
    Spec("images.registry", "registry", "where the host pulls images from (images.run --registry wins)", null=True),
    Spec("images.output_dir", "folder", "a folder mounted at the same path", null=True),
    Spec("images.shm_size", "pattern", "a sized /dev/shm instead of the host's IPC namespace", pattern=SHM_SIZE,
         null=True, message="must be a size like 64g (digits, then b, k, m or g), not {value}"),
    Spec("images.memlock", "memlock", "the locked-memory limit in bytes, -1 unlimited (the default), null the "
         "engine's own", null=True,
         message="must be a number of bytes, -1 for unlimited, or null for the engine's own limit, not {value}"),
)
