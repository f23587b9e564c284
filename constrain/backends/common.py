"""Helpers the external backends share: the schema a params object asks for, and raw access
to one bitmask row (numpy array or CPU torch tensor, int32 [batch, ceil(V/32)])."""
from __future__ import annotations

import copy
import json

import numpy as np

from ..errors import ConstraintError
from ..params import StructuredOutputsParams


def schema_of(params: StructuredOutputsParams) -> dict:
    """The JSON schema of a ``json`` / ``json_object`` constraint, as a dict, with
    ``disable_additional_properties`` applied (objects without the keyword get ``false``)."""
    schema = {"type": "object"} if params.kind == "json_object" else params.json
    if isinstance(schema, str):
        schema = json.loads(schema)
    if isinstance(schema, bool):
        raise ConstraintError("a boolean JSON schema is not supported by this backend")
    if params.disable_additional_properties:
        schema = _close_objects(copy.deepcopy(schema))
    return schema


def _close_objects(node):
    if isinstance(node, dict):
        if (node.get("type") == "object" or "properties" in node) \
                and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_objects(value)
    elif isinstance(node, list):
        for value in node:
            _close_objects(value)
    return node


def clear_row(bitmask, row: int) -> None:
    """Row ``row`` = no token allowed (a finished matcher)."""
    if isinstance(bitmask, np.ndarray):
        bitmask[row] = 0
    else:
        bitmask[row].zero_()


def row_address(bitmask, row: int) -> tuple[int, int]:
    """(address, byte size) of row ``row``; the row must be contiguous CPU memory."""
    if isinstance(bitmask, np.ndarray):
        view = bitmask[row]
        if not view.flags["C_CONTIGUOUS"] or view.dtype != np.int32:
            raise ValueError("bitmask rows must be contiguous int32")
        return view.ctypes.data, view.nbytes
    view = bitmask[row]
    if not view.is_contiguous() or view.element_size() != 4 or view.device.type != "cpu":
        raise ValueError("bitmask rows must be contiguous int32 on the CPU")
    return view.data_ptr(), view.numel() * 4
