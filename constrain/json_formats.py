"""Regexes for JSON-schema ``format`` values, as string *content* (without the quotes).

Formats are enforced (assertion semantics). They never produce characters that need a JSON
escape. Known limits (documented policy): leap seconds (``:60``) are rejected; e-mail local
parts are dot-atoms (no quoted local parts); ``hostname`` checks label syntax and lengths and
refuses labels with "--" as their 3rd and 4th characters (A-labels such as ``xn--...``, whose
IDNA/Punycode rules it cannot check).

``regex`` is enforced as a regular subset of ECMAScript regexes (a documented narrowing: see
``REGEX_SUBSET``); ``iri``, ``iri-reference`` (RFC 3987) and ``uri-template`` (RFC 6570) exactly.

Formats tamis has no regex for: a format the JSON Schema specification defines
(``STANDARD_FORMATS``: idn-email, idn-hostname) is a compile error naming it,
because a user asking for it expects it enforced and tamis cannot; any other name
(``url``, ``path``, ``semver``, ``int32`` on a string...) is an annotation and asserts nothing,
as JSON Schema 2020-12 says for formats by default and as vLLM's backends (xgrammar,
llguidance) and the jsonschema validator do with names they do not know.
"""
from __future__ import annotations

from functools import lru_cache

from .regex_parser import parse_regex

_YEAR = r"[0-9]{4}"
_MONTH_DAY = (r"((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
              r"|02-(0[1-9]|1[0-9]|2[0-8]))")
_LEAP_DAY = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29"
DATE = rf"({_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
DATE_TIME = rf"{DATE}[Tt]{TIME}"
UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{OCTET}(\.{OCTET}){{3}}"
# A label of 1-63 letters, digits and inner hyphens, never with "--" as its 3rd and 4th
# characters: those are A-labels ("xn--...") whose Punycode a regex cannot check, or reserved.
_AN, _ANH = "[A-Za-z0-9]", "[A-Za-z0-9-]"
LABEL = rf"{_AN}({_AN}|{_ANH}{_AN}|{_ANH}{{2}}{_AN}|{_ANH}({_AN}{_ANH}|-{_AN}){_ANH}{{0,58}}{_AN})?"
HOSTNAME = rf"{LABEL}(\.{LABEL})*"
DURATION = (r"P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)(T([0-9]+H([0-9]+M([0-9]+S)?)?"
            r"|[0-9]+M([0-9]+S)?|[0-9]+S))?|T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
            r"|[0-9]+W)")


def _ipv6() -> str:
    h16 = "[0-9a-fA-F]{1,4}"
    ls32 = f"({h16}:{h16}|{IPV4})"
    forms = [f"({h16}:){{6}}{ls32}", f"::({h16}:){{5}}{ls32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1), (4, 0)):
        head = f"({h16}(:{h16}){{0,{before}}})?" if before else f"({h16})?"
        tail = f"({h16}:){{{after}}}" if after else ""
        forms.append(f"{head}::{tail}{ls32}")
    forms.append(f"({h16}(:{h16}){{0,5}})?::{h16}")
    forms.append(f"({h16}(:{h16}){{0,6}})?::")
    return "(" + "|".join(forms) + ")"


IPV6 = _ipv6()
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9a-fA-F]{2}"
_PCHAR = rf"([{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_SEGMENT = rf"{_PCHAR}*"
_SEGMENT_NZ = rf"{_PCHAR}+"
_SEGMENT_NZ_NC = rf"([{_UNRESERVED}{_SUB_DELIMS}@]|{_PCT})+"
_USERINFO = rf"([{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*"
_REG_NAME = rf"([{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*"
_HOST = rf"(\[({IPV6}|v[0-9a-fA-F]+\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\]|{IPV4}|{_REG_NAME})"
_AUTHORITY = rf"({_USERINFO}@)?{_HOST}(:[0-9]*)?"
_PATH_ABEMPTY = rf"(/{_SEGMENT})*"
_PATH_ABSOLUTE = rf"/({_SEGMENT_NZ}(/{_SEGMENT})*)?"
_QUERY = rf"({_PCHAR}|[/?])*"
_HIER = rf"(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ}(/{_SEGMENT})*)?"
URI = rf"[A-Za-z][A-Za-z0-9+.\-]*:{_HIER}(\?{_QUERY})?(#{_QUERY})?"
_RELATIVE = rf"(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ_NC}(/{_SEGMENT})*)?"
URI_REFERENCE = rf"({URI}|{_RELATIVE}(\?{_QUERY})?(#{_QUERY})?)"
# RFC 3987: an IRI is a URI whose unreserved characters also take ``ucschar`` (and whose query
# ``iprivate``); the same grammar with those classes widened.
_UCSCHAR = (r"\u00A0-\uD7FF\uF900-\uFDCF\uFDF0-\uFFEF" + "".join(
    rf"\u{{{p:X}0000}}-\u{{{p:X}FFFD}}" for p in range(1, 14)) + r"\u{E1000}-\u{EFFFD}")
_IPRIVATE = r"\uE000-\uF8FF\u{F0000}-\u{FFFFD}\u{100000}-\u{10FFFD}"


def _iri(uri: str) -> str:
    """``uri`` with ``iunreserved`` for ``unreserved``, except in IPvFuture (ASCII in IRIs)."""
    future = rf"v[0-9a-fA-F]+\.[{_UNRESERVED}"
    return uri.replace(future, "\0").replace(_UNRESERVED, _UNRESERVED + _UCSCHAR).replace("\0", future)


_IQUERY = rf"(\?({_iri(_PCHAR)}|[/?{_IPRIVATE}])*)"
IRI = _iri(URI).replace(rf"(\?{_QUERY})", _IQUERY)
IRI_REFERENCE = _iri(URI_REFERENCE).replace(rf"(\?{_QUERY})", _IQUERY)
# RFC 6570 (level 4): literals and {expressions}.
_TEMPLATE_LITERAL = rf"([!#$&(-;=?-\[\]_a-z~{_UCSCHAR}{_IPRIVATE}]|{_PCT})"
_VARCHAR = rf"([A-Za-z0-9_]|{_PCT})"
_VARSPEC = rf"{_VARCHAR}(\.?{_VARCHAR})*(:[1-9][0-9]{{0,3}}|\*)?"
URI_TEMPLATE = rf"({_TEMPLATE_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(,{_VARSPEC})*\}})*"
# ``regex`` (ECMA-262) is not a regular language (nested groups): enforced as a regular subset
# (a documented narrowing), valid with and without the ``u`` flag and for Python's ``re``:
# optional ^, then atoms, each optionally quantified (* + ? {n} {n,}), then optional $. An atom
# is a letter, digit, space, one of _ - / : , or ".", or a class of such characters and the
# ranges a-z, A-Z, 0-9, "-" last (no backslash: string formats are written without JSON escapes).
_REGEX_CLASS_ITEM = r"([A-Za-z0-9 _:/.,]|a-z|A-Z|0-9)"
_REGEX_ATOM = rf"([A-Za-z0-9 _\-/:,.]|\[\^?{_REGEX_CLASS_ITEM}+-?\])"
REGEX_SUBSET = rf"\^?({_REGEX_ATOM}([*+?]|\{{[0-9]{{1,3}},?\}})?)*\$?"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+"
EMAIL = rf"{_ATOM}(\.{_ATOM})*@({HOSTNAME}|\[{IPV4}\]|\[IPv6:{IPV6}\])"
JSON_POINTER = r"(/([^/~\"\\\x00-\x1f]|~[01])*)*"
RELATIVE_JSON_POINTER = rf"(0|[1-9][0-9]*)(#|{JSON_POINTER})"

FORMATS = {
    "date-time": DATE_TIME, "date": DATE, "time": TIME, "duration": DURATION,
    "email": EMAIL, "uuid": UUID, "ipv4": IPV4, "ipv6": IPV6, "hostname": HOSTNAME,
    "uri": URI, "uri-reference": URI_REFERENCE, "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER, "iri": IRI, "iri-reference": IRI_REFERENCE,
    "uri-template": URI_TEMPLATE, "regex": REGEX_SUBSET,
}
# Formats defined by the JSON Schema specification (draft 2020-12, section 7.3).
STANDARD_FORMATS = {
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
    "json-pointer", "relative-json-pointer", "regex",
}
# Formats with a length limit on the whole value (applied as an intersection).
FORMAT_MAX_LENGTH = {"hostname": 253}


@lru_cache(maxsize=None)
def format_node(name: str, universe) -> tuple | None:
    """The content AST for a format tamis enforces, or None (see ``is_annotation_only``)."""
    regex = FORMATS.get(name)
    if regex is None:
        return None
    return parse_regex(regex, universe=universe)


def is_annotation_only(name: str) -> bool:
    """True for a format name outside the specification's list: it asserts nothing."""
    return name not in FORMATS and name not in STANDARD_FORMATS
