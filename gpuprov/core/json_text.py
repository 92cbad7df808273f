"""Strict JSON text: what every `--json` output and JSON report of gpuprov is made of.

JSON has no NaN or Infinity, and `json.dumps` writes them by default (`NaN`, which strict parsers such as
`jq` and JavaScript's JSON.parse refuse). Here a float that is not finite becomes `null` ("no number"), the
value JSON has for a measurement that is missing, and the text is written with allow_nan=False so that
nothing else can slip through. Secrets are masked on the way out (gpuprov.core.secrets.mask_data: in each string,
so that the text stays valid JSON whatever a secret holds).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpuprov.core.secrets import mask, mask_data


def dump_json(data: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """One JSON document: non-finite floats as null, keys as strings, other objects (paths, dates) as
    their text, credentials masked."""
    return json.dumps(mask_data(_strict(data)), indent=indent, sort_keys=sort_keys, allow_nan=False,
                      default=lambda item: mask(str(item)))


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {_key(key): _strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item) for item in value]
    return value


def _key(key: Any) -> str:
    """A mapping key as text: strings as they are, other scalars written the JSON way (1, true, null)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(_strict(key), allow_nan=False)
    return str(key)
