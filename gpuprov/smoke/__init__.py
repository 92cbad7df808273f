"""The validation suite that runs ON a host (copied there by `invoke validate`).

It imports only the standard library, and torch / onnx / onnxruntime / numpy where a check needs them, never
gpuprov's own dependencies; modules import each other relatively. Run it as `python -m smoke --config FILE`
from the folder it was copied into; it prints one JSON document with every check's result.
"""
