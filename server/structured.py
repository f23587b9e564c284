"""Where a request's output constraint comes from, resolved into one
``tamis.constrain.StructuredOutputsParams`` (or None).

Sources, at most one per request:
- ``structured_outputs``: vLLM's field (what the OpenAI client's ``extra_body`` sends):
  ``{"choice": [...]}``, ``{"regex": ...}``, ``{"json": schema}``, ``{"grammar": ...}``,
  ``{"json_object": true}``, ``{"structural_tag": ...}`` plus whitespace options.
- ``response_format``: ``json_schema`` (``strict`` or not: the schema is always
  enforced), ``json_object``, ``text`` (none).
- a tool plan that constrains the output (``tool_choice`` required or named).

The legacy ``guided_*`` fields are refused with a 400 naming the replacement, because
ignoring them silently would return unconstrained text to a caller expecting a constraint.
"""
from __future__ import annotations

from tamis.server.errors import invalid

LEGACY_FIELDS = {
    "guided_json": "structured_outputs.json",
    "guided_regex": "structured_outputs.regex",
    "guided_choice": "structured_outputs.choice",
    "guided_grammar": "structured_outputs.grammar",
    "guided_decoding_backend": "--structured-outputs-backend (server flag)",
    "guided_whitespace_pattern": "structured_outputs.whitespace_pattern",
}


def reject_legacy_fields(request) -> None:
    extras = request.model_extra or {}
    for name, replacement in LEGACY_FIELDS.items():
        if name in extras:
            raise invalid(f"`{name}` is no longer supported; use `{replacement}` instead "
                          f"(e.g. extra_body={{\"structured_outputs\": {{...}}}})", name)


def resolve_structured_outputs(request, tool_schema: dict | None = None):
    """The request's constraint as ``StructuredOutputsParams`` or None; 400 on conflict
    or on a spec the constraint layer refuses (its message is passed through)."""
    reject_legacy_fields(request)
    sources = []
    if request.structured_outputs:
        sources.append(("structured_outputs", dict(request.structured_outputs)))
    from_format = _from_response_format(request.response_format)
    if from_format is not None:
        sources.append(("response_format", from_format))
    if tool_schema is not None:
        sources.append(("tool_choice", {"json": tool_schema}))
    if not sources:
        return None
    if len(sources) > 1:
        names = " and ".join(f"`{name}`" for name, _ in sources)
        raise invalid(f"{names} both constrain the output; send only one", sources[1][0])
    param, spec = sources[0]
    return build_params(spec, param)


def _from_response_format(response_format) -> dict | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return {"json_object": True}
    if response_format.type == "structural_tag":
        extra = response_format.model_extra or {}
        return {"structural_tag": extra.get("structural_tag") or extra}
    spec = response_format.json_schema
    if spec is None or spec.schema_ is None:
        raise invalid("response_format of type json_schema needs `json_schema.schema`",
                      "response_format.json_schema")
    return {"json": spec.schema_}


def build_params(spec: dict, param: str):
    """``StructuredOutputsParams`` from the body's dict, validated; every failure is a 400
    carrying the constraint layer's message."""
    from tamis.constrain import StructuredOutputsParams

    make = getattr(StructuredOutputsParams, "from_dict", None) or (
        lambda data: StructuredOutputsParams(**data))
    try:
        params = make(spec)
        params.validate()
    except (TypeError, ValueError) as exc:
        raise invalid(f"{param}: {exc}", param) from exc
    return params
