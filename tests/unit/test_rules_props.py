"""Property: every stack the resolver returns passes the independent checker; every conflict explains itself."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.catalog import models
from gpuprov.stack.data import OS_KEYS, table
from gpuprov.stack.resolve import StackConflict, resolve
from gpuprov.stack.rules import check_stack

maybe = lambda values: st.none() | st.sampled_from(sorted(values))  # noqa: E731


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu=st.sampled_from(sorted(models())), os=st.sampled_from(OS_KEYS), gpus=st.integers(1, 8),
       nvswitch=st.booleans(), cuda=maybe(table("cuda")["releases"]),
       driver=maybe(b for b, r in table("drivers")["branches"].items() if r["latest"]),
       pytorch=maybe(table("pytorch_wheels")["releases"]), ngc=maybe(table("ngc_pytorch")["tags"]),
       nccl=maybe({".".join(v.split(".")[:2]) for v in table("nccl")["releases"]}), fc=st.booleans())
def test_resolved_stacks_satisfy_rules(gpu, os, gpus, nvswitch, cuda, driver, pytorch, ngc, nccl, fc):
    try:
        stack = resolve(gpu, os, gpus=gpus, nvswitch=nvswitch, cuda=cuda, driver=driver, pytorch=pytorch,
                        ngc=ngc, nccl=nccl, forward_compat=fc)
    except StackConflict as exc:
        assert exc.conflicts and all(isinstance(c, str) and c for c in exc.conflicts)
        return
    assert check_stack(stack.to_dict(), gpu, os, nvswitch, gpus) == []


def test_checker_catches_a_broken_stack():
    data = resolve("B200", "ubuntu-24.04", nvswitch=True, gpus=8).to_dict()
    data["driver"]["kernel_modules"] = "proprietary"
    data["fabricmanager"]["version"] = "570.1.1"
    data["nccl"]["packages"][0]["version"] = "2.26.5-1+cuda11.8"
    problems = check_stack(data, "B200", "ubuntu-24.04", True, 8)
    assert any("open kernel modules" in p for p in problems)
    assert any("fabric manager" in p for p in problems)
    assert any("NCCL" in p for p in problems)
