"""Provisioning: the stack's operations, the plan, preflight and the per-host run (`invoke provision`)."""
