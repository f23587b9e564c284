"""Constraint compilation: ``StructuredOutputsParams`` -> compiled constraint, cached.

``compile_constraint(params, info)`` is tamis's own compiler (the ``tamis`` backend); it
dispatches on the kind:

    choice       -> alternation of the exact strings           -> CompiledRegex
    regex        -> regex_parser                                -> CompiledRegex
    json         -> json_schema (regex, or rules if recursive)  -> CompiledRegex | CompiledGrammar
    json_object  -> the "any JSON object" rules                 -> CompiledGrammar
    grammar      -> gbnf (a ``::=`` line) or lark               -> CompiledRegex | CompiledGrammar

``ConstraintCompiler`` puts any ``Backend`` (``backend.py``) behind a thread pool, a cache
keyed by the spec and a time limit; compile errors are ``ConstraintError`` (a ``ValueError``)
with the message.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from . import deadline
from . import regex_ast as ra
from .backend import Backend, Grammar
from .compiled import CompiledRegex
from .errors import CompileTimeout, ConstraintError, GrammarError
from .gbnf import is_gbnf, parse_gbnf
from .structural_tag import compile_structural_tag
from .grammar import build_grammar
from .grammar_matcher import CompiledGrammar
from .json_schema import DEFAULT_WHITESPACE, compile_json_schema
from .unique_items import CompiledUniqueItems
from .lark_grammar import parse_lark
from .params import StructuredOutputsParams
from .regex_parser import parse_regex

DEFAULT_TIME_LIMIT_S = 10.0
# A constraint nested past Python's recursion limit (hundreds of levels of arrays, objects or
# $ref) compiles again on a thread of its own with this much stack and this recursion limit.
DEEP_STACK_BYTES = 256 << 20
DEEP_RECURSION_LIMIT = 40_000


def compile_constraint(params: StructuredOutputsParams, info) -> Grammar:
    """Compiles one constraint now (no cache, no time limit of its own: the calling thread's
    ``deadline`` applies). Raises ConstraintError for anything it cannot compile, a structure
    too deep even for the deep-stack retry included (a clear error, not a crash)."""
    params.validate()
    try:
        return _compile(params, info)
    except RecursionError:
        pass   # the common case stays on the calling thread; deep nesting pays for a thread
    try:
        return _on_deep_stack(_compile, params, info)
    except RecursionError:
        raise ConstraintError(f"structured_outputs.{params.kind} is nested or mutually "
                              f"recursive too deeply to compile; flatten it") from None


_deep_lock = threading.Lock()
_deep_runs = 0
_normal_recursion_limit = 0


def _on_deep_stack(fn, *args):
    """``fn(*args)`` on a fresh thread with ``DEEP_STACK_BYTES`` of stack, under the calling
    thread's deadline and a recursion limit of at least ``DEEP_RECURSION_LIMIT`` (the limit
    is the interpreter's: it is raised while any such run lasts, then put back)."""
    outcome: dict = {}
    captured = deadline.capture()

    def run():
        with deadline.carried(captured):
            try:
                outcome["value"] = fn(*args)
            except BaseException as exc:   # re-raised in the caller's thread
                outcome["error"] = exc

    _raise_recursion_limit()
    try:
        with _deep_lock:
            previous = threading.stack_size(DEEP_STACK_BYTES)
            try:
                thread = threading.Thread(target=run, name="tamis-compile-deep", daemon=True)
                thread.start()
            finally:
                threading.stack_size(previous)
        thread.join()
    finally:
        _restore_recursion_limit()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _raise_recursion_limit() -> None:
    global _deep_runs, _normal_recursion_limit
    with _deep_lock:
        if _deep_runs == 0:
            _normal_recursion_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_normal_recursion_limit, DEEP_RECURSION_LIMIT))
        _deep_runs += 1


def _restore_recursion_limit() -> None:
    global _deep_runs
    with _deep_lock:
        _deep_runs -= 1
        if _deep_runs == 0:
            sys.setrecursionlimit(_normal_recursion_limit)


def _compile(params: StructuredOutputsParams, info):
    kind = params.kind
    if kind == "choice":
        node = ra.alt(*(_literal_checked(c, i) for i, c in enumerate(params.choice)))
        if node == ra.NOTHING or any(c == "" for c in params.choice) and len(params.choice) == 1:
            raise ConstraintError("structured_outputs.choice must contain a non-empty string")
        return CompiledRegex(node, info, "choice")
    if kind == "regex":
        return CompiledRegex(parse_regex(params.regex), info, "regex")
    if kind == "structural_tag":
        node, rules = compile_structural_tag(params.structural_tag, _whitespace(params))
        return _from_rules(node, rules, info, kind)
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else params.json
        if isinstance(schema, str):
            schema = json.loads(schema)
        unique_strings: list = []
        node, rules = compile_json_schema(schema, _whitespace(params),
                                          not params.disable_additional_properties, unique_strings)
        compiled = _from_rules(node, rules, info, kind)
        return CompiledUniqueItems(compiled, unique_strings[0]) if unique_strings else compiled
    if kind == "grammar":
        return _compile_grammar(params.grammar, info)
    raise ConstraintError(f"structured_outputs.{kind} is not supported yet by tamis")


def _literal_checked(text: str, index: int):
    if index & 1023 == 1023:   # a long choice list stops at the deadline
        deadline.check()
    return ra.literal(text)


def _whitespace(params: StructuredOutputsParams) -> str | None:
    if params.disable_any_whitespace:
        return None
    if params.whitespace_pattern is not None:
        parse_regex(params.whitespace_pattern)   # fail early with a regex error
        return params.whitespace_pattern
    return DEFAULT_WHITESPACE


def _from_rules(node, rules: dict, info, description: str):
    if not rules:
        return CompiledRegex(node, info, description)
    rules = dict(rules)
    rules["$root"] = node
    built = build_grammar(rules, "$root")
    if isinstance(built, tuple):
        return CompiledRegex(built, info, description)
    return CompiledGrammar(built, info, description)


def _compile_grammar(text: str, info):
    try:
        if is_gbnf(text):
            rules, root = parse_gbnf(text)
            ignore = []
        else:
            rules, root, ignore = parse_lark(text)
        built = build_grammar(rules, root, ignore)
    except GrammarError as exc:
        message = str(exc)
        if not message.startswith("Failed to convert the grammar"):
            message = f"Failed to convert the grammar: {message}"
        raise GrammarError(message) from None
    if isinstance(built, tuple):
        return CompiledRegex(built, info, "grammar")
    return CompiledGrammar(built, info, "grammar")


class ConstraintCompiler:
    """Thread pool + LRU cache + time limit around one ``Backend``.

    ``submit(params) -> Future`` resolves to the backend's compiled constraint (a
    ``Grammar``) or raises its ``ConstraintError``; identical specs share one future (and
    one compilation). The time limit is the calling thread's ``deadline``: tamis's compiler
    stops at it (``CompileTimeout``); another backend's native code cannot be interrupted,
    and the manager's wall-clock limit fails a request whose compile never returns."""

    def __init__(self, backend: Backend, max_workers: int = 2, cache_size: int = 256,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S):
        self.backend = backend
        self.time_limit_s = time_limit_s
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tamis-compile")
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # Cumulative counters for metrics (read without the lock: monotone ints/floats).
        self.num_compiles = 0
        self.num_cache_hits = 0
        self.compile_seconds = 0.0

    def submit(self, params: StructuredOutputsParams) -> Future:
        key = params.spec_key()
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self.num_cache_hits += 1
                return future
            future = self._pool.submit(self._compile, params)
            self._cache[key] = future
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        future.add_done_callback(lambda f, k=key: self._forget_failure(k, f))
        return future

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """Blocking compile through the cache (raises the compile error)."""
        return self.submit(params).result()

    def _compile(self, params: StructuredOutputsParams) -> Grammar:
        start = time.perf_counter()
        try:
            with deadline.deadline(self.time_limit_s):
                return self.backend.compile(params)
        finally:
            with self._lock:
                self.num_compiles += 1
                self.compile_seconds += time.perf_counter() - start

    def _forget_failure(self, key, future: Future) -> None:
        # timeouts are not cached: a later request may get a less busy machine
        if isinstance(future.exception(), CompileTimeout):
            with self._lock:
                if self._cache.get(key) is future:
                    del self._cache[key]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
