"""Tool calling: ``tool_choice`` turned into constraints, and model output turned into
``tool_calls``.

=================  =========================================  ===========================
tool_choice        what the model is made to write            how it becomes tool_calls
=================  =========================================  ===========================
"none"             free text                                  never
"auto" (default)   free text; the template shows the tools    Hermes/SmolLM2 ``<tool_call>
                                                              {"name", "arguments"}
                                                              </tool_call>`` blocks
"required"         JSON array of {"name", "parameters"},      each element one call
                   constrained by the tools' schemas
{"type":"function" the function's ``parameters`` JSON,        the whole text is the
 "function":{...}} constrained                                arguments of that function
=================  =========================================  ===========================

Constrained arguments are always valid JSON for the schema; parsed "auto" calls are
only as good as the model.

OpenAI's legacy ``functions`` / ``function_call`` are served as tools
(``apply_legacy_functions``): ``function_call`` "none" / "auto" / ``{"name"}`` is the
matching ``tool_choice``, one call at most; the answer carries ``message.function_call``
(``delta.function_call`` when streaming) and ``finish_reason`` "function_call" where tools
would give ``tool_calls`` and "tool_calls". Earlier turns may hold an assistant
``function_call`` and ``role: "function"`` results; the template sees them as tool calls
and tool results.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from tamis.server.errors import invalid

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolPlan:
    """How one chat request uses its tools."""
    mode: str                           # "none" | "auto" | "required" | "named"
    schema: dict | None = None          # JSON schema the output must follow, if any
    function_name: str | None = None    # for "named"
    parallel: bool = True


def apply_legacy_functions(body) -> bool:
    """Rewrites a body's legacy ``functions`` / ``function_call`` as ``tools`` /
    ``tool_choice``; True when the body used them. 400 when mixed with tools."""
    if body.functions is None:
        if body.function_call is not None:
            raise invalid("`function_call` needs `functions`", "function_call")
        return False
    if body.tools is not None or body.tool_choice is not None:
        raise invalid("send `tools`/`tool_choice` or the legacy `functions`/`function_call`, "
                      "not both", "functions")
    from tamis.server.protocol import ChatTool

    body.tools = [ChatTool(function=function) for function in body.functions]
    choice = body.function_call
    if isinstance(choice, dict):
        if not isinstance(choice.get("name"), str):
            raise invalid('function_call must be "none", "auto" or {"name": ...}',
                          "function_call")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    body.tool_choice = choice
    body.parallel_tool_calls = False
    return True


def legacy_message(message: dict) -> dict:
    """A legacy turn as the template expects it: an assistant ``function_call`` becomes one
    tool call, a ``function`` role message a ``tool`` result."""
    call = message.pop("function_call", None)
    if isinstance(call, dict) and not message.get("tool_calls"):
        message["tool_calls"] = [{"id": make_tool_call_id(), "type": "function",
                                  "function": call}]
    if message.get("role") == "function":
        message["role"] = "tool"
    return message


def as_function_call(calls: list[dict]) -> dict:
    """The legacy ``function_call`` of a message: its first call's name and arguments."""
    return dict(calls[0]["function"])


def make_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def plan_tools(tools, tool_choice, parallel_tool_calls: bool = True) -> ToolPlan:
    """Validates ``tools``/``tool_choice`` and returns the plan (400 on a bad pairing)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise invalid("`tool_choice` needs `tools` to be set", "tool_choice")
        return ToolPlan("none")
    if tool_choice is None or tool_choice == "auto":
        return ToolPlan("auto", parallel=parallel_tool_calls)
    if tool_choice == "none":
        return ToolPlan("none")
    if tool_choice == "required":
        return ToolPlan("required", _required_schema(tools, parallel_tool_calls),
                        parallel=parallel_tool_calls)
    name = _named_choice(tool_choice)
    by_name = {tool.function.name: tool for tool in tools}
    if name not in by_name:
        raise invalid(f"tool_choice names function {name!r}, which is not in `tools` "
                      f"(have: {sorted(by_name)})", "tool_choice")
    return ToolPlan("named", _parameters(by_name[name]), function_name=name, parallel=False)


def _named_choice(tool_choice) -> str:
    if (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
            and isinstance(tool_choice.get("function"), dict)
            and isinstance(tool_choice["function"].get("name"), str)):
        return tool_choice["function"]["name"]
    raise invalid('tool_choice must be "none", "auto", "required" or '
                  '{"type": "function", "function": {"name": ...}}', "tool_choice")


def _parameters(tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _required_schema(tools, parallel: bool) -> dict:
    one_call = [{
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                       "parameters": _parameters(tool)},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    } for tool in tools]
    schema = {"type": "array", "minItems": 1,
              "items": one_call[0] if len(one_call) == 1 else {"anyOf": one_call}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def tool_call(name: str, arguments: str, call_id: str | None = None) -> dict:
    return {"id": call_id or make_tool_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def extract_tool_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[dict]]:
    """Final text -> (content, tool_calls) for a finished choice."""
    if plan.mode == "named":
        return None, [tool_call(plan.function_name, text)]
    if plan.mode == "required":
        return None, _required_calls(text)
    if plan.mode == "auto":
        content, calls = parse_hermes(text)
        return content, calls if plan.parallel else calls[:1]
    return text, []


def _required_calls(text: str) -> list[dict]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return []  # only when generation stopped early (max_tokens): finish_reason says so
    return [tool_call(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
            for item in items if isinstance(item, dict) and "name" in item]


def parse_hermes(text: str) -> tuple[str | None, list[dict]]:
    """Splits ``text`` into leading content and ``<tool_call>{json}</tool_call>`` calls.

    A block whose JSON does not parse, or lacks ``name``, is left in the content: the
    caller sees what the model wrote rather than a silently dropped call.
    """
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    calls = []
    for match in _TOOL_CALL_RE.finditer(text, start):
        call = _parse_call_json(match.group(1))
        if call is None:
            return text, []
        calls.append(call)
    content = text[:start].strip()
    return (content or None), calls


def _parse_call_json(raw: str) -> dict | None:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return tool_call(obj["name"], arguments)


class ToolStreamer:
    """Turns streamed text deltas into chat ``delta`` fields for one choice.

    ``feed(delta_text)`` and ``finish()`` return a list of partial delta dicts
    (``{"content": ...}`` or ``{"tool_calls": [...]}``). Named calls stream their
    arguments as they come; "required" and "auto" calls are emitted whole once complete,
    while "auto" content streams except for text that may start a ``<tool_call>`` tag.
    """

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self._sent = 0          # chars of self.text already emitted as content
        self._num_calls = 0
        self._named_id = make_tool_call_id()
        self.emitted_calls = False

    def feed(self, delta: str) -> list[dict]:
        self.text += delta
        if self.plan.mode == "named":
            return self._named_delta(delta)
        if self.plan.mode == "auto":
            return self._auto_content()
        if self.plan.mode == "required":
            return []
        return [{"content": delta}] if delta else []

    def finish(self) -> list[dict]:
        if self.plan.mode == "required":
            return self._calls_delta(_required_calls(self.text))
        if self.plan.mode != "auto":
            return []
        content, calls = parse_hermes(self.text)
        if not calls:
            rest = self.text[self._sent:]
            self._sent = len(self.text)
            return [{"content": rest}] if rest else []
        if not self.plan.parallel:
            calls = calls[:1]
        head = (content or "")[self._sent:] if content else ""
        deltas = [{"content": head}] if head else []
        return deltas + self._calls_delta(calls)

    def _named_delta(self, delta: str) -> list[dict]:
        if self._num_calls == 0:
            self._num_calls = 1
            self.emitted_calls = True
            return [{"tool_calls": [{"index": 0, "id": self._named_id, "type": "function",
                                     "function": {"name": self.plan.function_name,
                                                  "arguments": delta}}]}]
        if not delta:
            return []
        return [{"tool_calls": [{"index": 0, "function": {"arguments": delta}}]}]

    def _auto_content(self) -> list[dict]:
        start = self.text.find(TOOL_CALL_START)
        if start >= 0:
            safe_end = start
        else:
            safe_end = len(self.text) - _partial_tag_suffix(self.text, TOOL_CALL_START)
        if safe_end <= self._sent:
            return []
        piece = self.text[self._sent:safe_end]
        self._sent = safe_end
        return [{"content": piece}]

    def _calls_delta(self, calls: list[dict]) -> list[dict]:
        if not calls:
            return []
        chunks = []
        for call in calls:
            chunks.append({"index": self._num_calls, **call})
            self._num_calls += 1
        self.emitted_calls = True
        return [{"tool_calls": chunks}]


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
