"""`invoke rollout`: move a busy fleet to a new stack through its scheduler (drain, upgrade, reboot, validate,
resume) in budgeted batches, with a journal that a rerun resumes from."""
