"""Request fields the server does not turn into sampling: ids, refusals, unknown names.

No field is silently ignored. ``check_request_fields`` runs first in each generation
handler:

- a field this server does not serve (``prediction``, a ``service_tier`` other than
  "auto"/"default", ``modalities`` other than ["text"], ``stream_interval``, ``extra_body``
  sent as a field), or ``priority`` other than 0 on an FCFS server: 400 naming the field
  and what to send instead;
- an unknown field within edit distance of a known one (``structured_output``,
  ``max_token``): 400 naming the field and its likely spelling, because the request
  clearly meant something the server would otherwise not do;
- any other unknown field: one warning per field name for the life of the process (vLLM
  logs them too; the first ``_MAX_WARNED_NAMES`` names), or a 400 naming it when the
  server runs with ``--reject-unknown-fields``. More than ``MAX_UNKNOWN_FIELDS`` unknown
  fields in one body is a 400: each is compared with every known name.

``request_ids`` gives a request its response id and engine id from ``X-Request-Id`` or the
body's ``request_id``, as vLLM does.
"""
from __future__ import annotations

import difflib
import logging
import uuid

from tamis.server.access_log import printable
from tamis.server.errors import invalid
from tamis.server.structured import reject_legacy_fields

logger = logging.getLogger("tamis.server")

_NEAR_MISS_CUTOFF = 0.85   # difflib ratio: "structured_output" ~ "structured_outputs" 0.97
MAX_UNKNOWN_FIELDS = 64
_MAX_WARNED_NAMES = 1024   # names remembered (and logged) at most: hostile bodies invent many
_MAX_NAME_CHARS = 100      # of a field name quoted in an answer or the log

# field -> (is the value harmless?, what to do instead)
_REFUSED = {
    "prediction": (lambda v: v is None,
                   "Predicted Outputs are not supported; drop `prediction`"),
    "service_tier": (lambda v: v in (None, "auto", "default"),
                     'this server has one service tier: send "auto", "default" or nothing'),
    "modalities": (lambda v: v is None or v == ["text"],
                   'this server generates text only: send ["text"] or nothing'),
    "stream_interval": (lambda v: v is None or v == 1,
                        "streams carry every token as it comes; stream_interval is not a "
                        "request field"),
    "extra_body": (lambda v: v is None,
                   "`extra_body` is a client-side option: send its fields at the top "
                   "level of the body"),
}

_warned: set[str] = set()


def check_request_fields(ctx, body) -> None:
    """400 for a refused value or a misspelled field; unknown fields warned or refused
    (``ctx.reject_unknown_fields``); ``priority`` checked against the scheduling policy."""
    reject_legacy_fields(body)
    extras = body.model_extra or {}
    unknown = [name for name in extras if name not in _REFUSED]
    if len(unknown) > MAX_UNKNOWN_FIELDS:
        raise invalid(f"the body holds {len(unknown)} fields this API does not know (at most "
                      f"{MAX_UNKNOWN_FIELDS}), the first being `{_quoted(unknown[0])}`",
                      _quoted(unknown[0]))
    known = _known_names(type(body))
    for name, value in extras.items():
        if name in _REFUSED:
            harmless, instead = _REFUSED[name]
            if not harmless(value):
                raise invalid(f"`{name}` is not supported: {instead}", name)
            continue
        _check_unknown(name, known, ctx.reject_unknown_fields)
    if body.priority != 0 and ctx.scheduling_policy != "priority":
        raise invalid(f"priority={body.priority} needs priority scheduling; this server runs "
                      f"--scheduling-policy {ctx.scheduling_policy} (send priority 0 or "
                      f"restart it with --scheduling-policy priority)", "priority")


def _known_names(model) -> set[str]:
    names = set(model.model_fields)
    names.update(f.alias for f in model.model_fields.values() if f.alias)
    return names


def _check_unknown(name: str, known: set[str], reject: bool) -> None:
    quoted = _quoted(name)
    close = difflib.get_close_matches(name, known, n=1, cutoff=_NEAR_MISS_CUTOFF)
    if close:
        raise invalid(f"unknown field `{quoted}`; did you mean `{close[0]}`?", quoted)
    if reject:
        raise invalid(f"unknown field `{quoted}` (this server runs with "
                      f"--reject-unknown-fields)", quoted)
    if quoted not in _warned and len(_warned) < _MAX_WARNED_NAMES:
        _warned.add(quoted)
        logger.warning("requests hold the unknown field `%s`, which is ignored "
                       "(--reject-unknown-fields refuses such requests)", printable(quoted))


def _quoted(name: str) -> str:
    return name[:_MAX_NAME_CHARS]


def request_ids(raw, body, prefix: str) -> tuple[str, str]:
    """(response id, engine id). The response id is ``{prefix}-{base}``, base being the
    client's ``X-Request-Id`` header, else the body's ``request_id``, else a fresh uuid;
    a body ``request_id`` is also echoed in the ``X-Request-Id`` response header. The
    engine id adds a random tail when the client chose the base, so two requests with
    the same id can run at once."""
    header = raw.headers.get("x-request-id")
    if header is not None:
        base = raw.scope.get("state", {}).get("request_id", header)
    elif body.request_id is not None:
        base = _checked_request_id(body.request_id)
        raw.scope.setdefault("state", {})["request_id"] = base
    else:
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        return response_id, response_id
    response_id = f"{prefix}-{base}"
    return response_id, f"{response_id}-{uuid.uuid4().hex[:8]}"


def _checked_request_id(value: str) -> str:
    if not (0 < len(value) <= 256 and value.isprintable() and value.isascii()):
        raise invalid("request_id must be 1 to 256 printable ASCII characters (it is echoed "
                      "in the X-Request-Id header)", "request_id")
    return value
