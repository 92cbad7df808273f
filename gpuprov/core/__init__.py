"""The core every capability stands on: connections, the executor, the batched apply, errors, reports, masking
and settings. Nothing here knows a capability."""
