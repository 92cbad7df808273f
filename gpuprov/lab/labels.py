"""Names and labels of everything the lab creates on the engine."""

LABEL = "gpuprov.lab"
LABELS = {LABEL: "1"}
LABEL_FILTER = f"{LABEL}=1"
PROFILE_LABEL = "gpuprov.lab.profile"
# What a labelled container is: "host" for lab hosts (other lab services use other roles).
ROLE_LABEL = "gpuprov.lab.role"
HOST_ROLE = "host"
HOST_PREFIX = "gpuprov-lab-"
NETWORK = "gpuprov-lab-internal"
BASE_REPO = "gpuprov-lab/debian12-base"
HOST_REPO = "gpuprov-lab/host"
REGISTRY_REPO = "gpuprov-lab/registry"
# Images carry their own label: image labels are inherited by every container made from them,
# and only containers the lab creates itself may carry LABEL.
IMAGE_LABEL = "gpuprov.lab.image"
IMAGE_LABELS = {IMAGE_LABEL: "1"}
