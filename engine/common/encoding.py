"""JSON for what the engine stores and prints: numpy arrays and numbers, records with `to_json`
and dataclasses become JSON values (anything else its `str`)."""
from __future__ import annotations

import numpy as np


def json_default(obj):
    """`json.dumps(..., default=json_default)`: a JSON value for what json cannot encode."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return str(obj)
