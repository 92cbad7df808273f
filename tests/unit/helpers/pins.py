"""Stack pins and GPU names that gpuprov.stack.inputs refuses, with the exact message for each (the accepted
lists are those of gpuprov/data/*.yaml)."""

from __future__ import annotations

CUDA = "11.8, 12.0, 12.1, 12.2, 12.3, 12.4, 12.5, 12.6, 12.8, 12.9, 13.0, 13.1, 13.2, 13.3"
BRANCHES = "470, 520, 525, 530, 535, 545, 550, 555, 560, 565, 570, 575, 580, 590, 595, 610"
NCCL = ("2.15.5, 2.16.5, 2.17.1, 2.19.3, 2.20.3, 2.21.5, 2.22.3, 2.23.4, 2.25.1, 2.26.2, 2.26.5, 2.27.3, 2.27.5, "
        "2.27.7, 2.28.7, 2.28.9, 2.30.4")
NGC = ("23.10, 23.11, 23.12, 24.01, 24.02, 24.03, 24.04, 24.05, 24.06, 24.07, 24.08, 24.09, 24.10, 24.11, 24.12, "
       "25.01, 25.02, 25.03, 25.04, 25.05, 25.06, 25.07, 25.08, 25.09, 25.10, 25.11, 25.12, 26.01, 26.02, 26.03, "
       "26.04, 26.05, 26.06, 26.07")
PYTORCH = "2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14"
MODELS = ("V100-SXM2-16GB, V100-SXM2-32GB, V100-PCIE-16GB, V100-PCIE-32GB, T4, A10, A100-PCIE-40GB, A100-SXM4-40GB, "
          "A100-PCIE-80GB, A100-SXM4-80GB, L4, L40S, H100-PCIE, H100-SXM, H100-NVL, H200-SXM, GH200-96GB, GH200-144GB, "
          "B200, GB200, B300, RTX-4090, RTX-5090")
# NVIDIA GPU Operator component matrix (data center driver release notes) and CUDA 12.8.x installers.
R570 = "570.86.10, 570.86.15, 570.124.06, 570.133.20, 570.148.08, 570.158.01, 570.172.08, 570.195.03, 570.211.01"
BAD_PINS = [
    ("cuda", "12.7", f"unknown CUDA release '12.7'. Accepted: {CUDA}, or an update of one such as 12.8.1"),
    ("cuda", "12.8.5", "unknown CUDA update '12.8.5'. CUDA 12.8 updates: 12.8.0, 12.8.1"),
    ("cuda", "12.7.1", f"unknown CUDA release 12.7 (in '12.7.1'). Accepted: {CUDA}, or an update of one such as "
                       "12.8.1"),
    ("cuda", "twelve", "bad CUDA version 'twelve': give a release such as 12.8 or an update such as 12.8.1. "
                       f"Accepted: {CUDA}, or an update of one such as 12.8.1"),
    ("cuda", "12.８", "CUDA version '12.８' has digits that are not ASCII ('８'); write it with the digits 0-9"),
    ("driver", "999", f"unknown driver branch '999'. Accepted: {BRANCHES} (or R570, or a published version such "
                      "as 570.148.08)"),
    ("driver", "570.999", f"NVIDIA never published 570.999 as far as gpuprov's data knows; published 570 versions: "
                          f"{R570}; pin the branch (570) or add the version to gpuprov/data/drivers.yaml"),
    ("driver", "R570.148.8", f"NVIDIA never published 570.148.8 as far as gpuprov's data knows; published 570 "
                             f"versions: {R570}; pin the branch (570) or add the version to "
                             "gpuprov/data/drivers.yaml"),
    ("driver", "620", f"driver branch 620 has no published version in gpuprov's data, so it cannot be installed. "
                      f"Accepted: {BRANCHES}; or add 620's versions to gpuprov/data/drivers.yaml"),
    ("driver", "570-open", "bad driver version '570-open': give a branch such as 570 (or R570) or a published "
                           f"version such as 570.148.08. Accepted branches: {BRANCHES}"),
    ("driver", "５７０", "driver '５７０' has digits that are not ASCII ('５', '７', '０'); write it with the "
                      "digits 0-9"),
    ("driver", "57⁰", "driver '57⁰' has digits that are not ASCII ('⁰'); write it with the digits 0-9"),
    ("nccl", "9.9", f"unknown NCCL version '9.9'. Accepted: {NCCL}, or a release such as 2.26 (its newest build)"),
    ("nccl", "2", f"unknown NCCL version '2'. Accepted: {NCCL}, or a release such as 2.26 (its newest build)"),
    ("ngc", "19.01", f"unknown NGC PyTorch tag '19.01'. Accepted: {NGC} (with or without -py3)"),
    ("pytorch", "1.0", f"unknown PyTorch release '1.0'. Accepted: {PYTORCH}"),
    ("pytorch", "2.²", "PyTorch release '2.²' has digits that are not ASCII ('²'); write it with the digits 0-9"),
]
UNKNOWN_GPU = (f"unknown GPU model 'H1000' (did you mean 'H100', 'H100-80GB', 'V100'?). Accepted: a catalog model "
               f"({MODELS}), one of its aliases, or the name nvidia-smi prints for it; invoke stack.matrix "
               "--component gpus lists them all")
FOREIGN_GPU = "GPU model 'H１00' has digits that are not ASCII ('１'); write it with the digits 0-9"
BAD_IDS = [f"{key}={text}" for key, text, _ in BAD_PINS]

