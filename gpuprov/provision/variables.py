"""The provisioning variables, declared once (gpuprov.inventory.variables) and checked at load:

    hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
    stack:    {cuda: "12.8", driver: "570", pytorch: "2.7", ngc: "25.04", nccl: "2.26", forward_compat: false}
    mirror:   {url: http://mirror.internal/nvidia/, proxy: http://proxy:3128, fingerprint: <40 hex digits>,
               key_file: keys/nvidia.asc | key_url: http://mirror.internal/nvidia/key.pub, ca_file: certs/ca.pem,
               label: NVIDIA CUDA}
    container_engine: docker
"""

from __future__ import annotations

from gpuprov.inventory.variables import Spec, declare

CONTAINER_ENGINES = ("docker",)

VARIABLES = declare(
    "provision",
    Spec("hardware", "mapping", "the host's GPUs, as the operator knows them (facts may tell more)"),
    Spec("hardware.gpu", "gpu", "the GPU model, a catalog name (gpus.yaml) like H100-SXM"),
    Spec("hardware.count", "integer", "how many GPUs the host has", low=1),
    Spec("hardware.nvswitch", "bool", "whether the GPUs are joined by NVSwitch (an HGX board)"),
    Spec("stack", "mapping", "the software stack to resolve and install; each pin as stack.resolve takes it"),
    Spec("stack.cuda", "pin", "CUDA toolkit release, like \"12.8\""),
    Spec("stack.driver", "pin", "NVIDIA driver branch or version, like \"570\""),
    Spec("stack.pytorch", "pin", "PyTorch release, like \"2.7\""),
    Spec("stack.ngc", "pin", "NGC PyTorch container release, like \"25.04\""),
    Spec("stack.nccl", "pin", "NCCL release, like \"2.26\""),
    Spec("stack.forward_compat", "bool", "use CUDA forward compatibility (data center GPUs)"),
    Spec("mirror", "mapping", "an apt/dnf mirror of NVIDIA's repositories"),
    Spec("mirror.url", "url", "the mirror's URL", required=True),
    Spec("mirror.proxy", "url", "an HTTP proxy the hosts reach the mirror through"),
    Spec("mirror.fingerprint", "fingerprint", "the signing key's fingerprint (40 hex digits)"),
    Spec("mirror.key_file", "public_file", "the mirror's public signing key (may be written later)"),
    Spec("mirror.key_url", "url", "where the hosts fetch the signing key, when there is no key_file"),
    Spec("mirror.ca_file", "existing_public_file", "the CA certificates the mirror's TLS certificate rests on"),
    Spec("mirror.label", "release_label", "the Label: line of the mirror's Release file (apt pins by it)",
         message="bad label {value}: the Label: line of the mirror's Release file, letters, digits, spaces and "
                 "._+:~/- only (NVIDIA's is \"NVIDIA CUDA\")"),
    Spec("container_engine", "choice", "the container engine to install", choices=CONTAINER_ENGINES,
         message="bad container_engine {value}: give " + " or ".join(CONTAINER_ENGINES)),
)
