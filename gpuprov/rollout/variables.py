"""The rollout's inventory variables, declared once (gpuprov.inventory.variables) and checked at load:

    scheduler:
      kind: slurm                   # slurm | hook | none: what `rollout --drain` uses when not given
      controller: slurm-ctl         # slurm: the inventory host whose scontrol/squeue/sinfo the rollout runs
      node: gpu07                   # the host's node name in the scheduler (default: the host's name)
      # hook: each a command or a list of commands run in order on this machine, without a shell
      cordon:                       # block lists: in a [flow list] YAML reads {node} as a mapping
        - kubectl annotate node {node} gpuprov.io/rollout={reason} --overwrite
        - kubectl cordon {node}
      busy: gpuprov-k8s-busy {node}   # the work still on the node, one line each; nothing (exit 0): idle
      uncordon:
        - kubectl annotate node {node} gpuprov.io/rollout-
        - kubectl uncordon {node}
      state: gpuprov-k8s-state {node} # `ready`, `cordoned <reason>` or `down <why>`
      timeout: 120                  # seconds each command may take
"""

from __future__ import annotations

import re

from gpuprov.core.controller import NODE_NAME
from gpuprov.inventory.variables import Spec, declare

SCHEDULER_KINDS = ("slurm", "hook", "none")
# a hook command: one line of printable text (split into words, never given to a shell)
COMMAND = re.compile(r"[^\x00-\x1f\x7f]{1,4096}")

VARIABLES = declare(
    "rollout",
    Spec("scheduler", "mapping", "the scheduler a rollout drains the host through"),
    Spec("scheduler.kind", "choice", "slurm, hook or none", choices=SCHEDULER_KINDS),
    Spec("scheduler.controller", "pattern", "slurm: the inventory host that runs scontrol, squeue and sinfo",
         pattern=NODE_NAME, label="controller host"),
    Spec("scheduler.node", "pattern", "the host's node name in the scheduler (default: the host's name)",
         pattern=NODE_NAME, label="node name"),
    Spec("scheduler.cordon", "commands", "hook: the command that stops new work on {node} (reason in {reason})",
         pattern=COMMAND, label="command"),
    Spec("scheduler.busy", "commands", "hook: the command that prints the work still on {node}, one per line",
         pattern=COMMAND, label="command"),
    Spec("scheduler.uncordon", "commands", "hook: the command that puts {node} back in service", pattern=COMMAND,
         label="command"),
    Spec("scheduler.state", "commands", "hook: prints `ready`, `cordoned <reason>` or `down <why>` for {node}",
         pattern=COMMAND, label="command"),
    Spec("scheduler.timeout", "duration", "hook: seconds each command may take", high=3600),
)
