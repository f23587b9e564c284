"""``$ref`` inside one schema document: the document's index (base URIs, ``$id``,
``$anchor``), references resolved to the subschema they name (JSON pointers, anchors,
embedded ``$id`` documents), and reference cycles turned into grammar rules.

A ``$ref`` to anything outside the document (a remote URI) is refused with ``SchemaError``."""
from __future__ import annotations

from urllib.parse import unquote, urldefrag, urljoin

from .errors import SchemaError
from .json_keywords import ANNOTATIONS, SCHEMA_KEYWORDS, SCHEMA_MAPS


class SchemaReferences:
    """``$ref`` for ``_SchemaCompiler``, a mixin: the host provides ``root`` (the document),
    ``rules`` (the grammar rules being built), ``value(schema, path, depth)`` and
    ``_merge(a, b, path)``, and calls ``_index_document()`` once before compiling."""

    def _index_document(self) -> None:
        self._active: set[str] = set()       # references being compiled (a cycle comes back here)
        self._recursive: set[str] = set()    # references found to be cycles: compiled as rules
        self._ref_cache: dict[str, tuple] = {}
        self._unrollings: dict[str, int] = {}  # cycles merged into an allOf (json_merge)
        self._ids: dict[str, object] = {}
        self._anchors: dict[str, object] = {}
        self._base_of: dict[int, str] = {}
        root = self.root
        declared = root.get("$schema", "") if isinstance(root, dict) else ""
        self._draft4 = isinstance(declared, str) and ("draft-04" in declared or "draft-03" in declared)
        self._index(root, root.get("$id", "") if isinstance(root, dict) else "")

    def _index(self, schema, base: str, is_schema: bool = True) -> None:
        """Records each node's base URI; registers $id/$anchor only on nodes that are schemas
        (reached through schema keywords), so an "$id" inside an unknown keyword's value is
        not taken for an identifier."""
        if isinstance(schema, dict):
            if is_schema and isinstance(schema.get("$id"), str):
                base = urljoin(base, schema["$id"])
                self._ids[urldefrag(base)[0]] = schema
            if is_schema and isinstance(schema.get("$anchor"), str):
                self._anchors[urldefrag(base)[0] + "#" + schema["$anchor"]] = schema
            legacy = schema.get("id") if self._draft4 else None
            if is_schema and isinstance(legacy, str) and legacy.startswith("#") and len(legacy) > 1:
                # draft 4's plain-name fragment ("id": "#name"), what $anchor became
                self._anchors.setdefault(urldefrag(base)[0] + legacy, schema)
            self._base_of[id(schema)] = base
            for key, sub in schema.items():
                if key in ("enum", "const", "default", "examples"):
                    continue
                if is_schema and key in SCHEMA_MAPS and isinstance(sub, dict):
                    self._base_of[id(sub)] = base
                    for value in sub.values():
                        self._index(value, base, True)
                else:
                    self._index(sub, base, is_schema and key in SCHEMA_KEYWORDS)
        elif isinstance(schema, list):
            for sub in schema:
                self._index(sub, base, is_schema)

    def _ids_root(self) -> str:
        """The document's own base URI as ``_ids`` keys it ("" without a root ``$id``)."""
        root = self.root.get("$id", "") if isinstance(self.root, dict) else ""
        return urldefrag(root)[0] if isinstance(root, str) else ""

    def _resolve(self, ref: str, schema, path: str):
        if not isinstance(ref, str):
            raise SchemaError("$ref must be a string", path)
        base = self._base_of.get(id(schema), "")
        target_uri = urljoin(base, ref) if base else ref
        doc_uri, fragment = urldefrag(target_uri)
        if doc_uri and doc_uri != urldefrag(base)[0] and doc_uri not in self._ids:
            raise SchemaError(f"remote $ref {ref!r} is not supported (only references inside "
                              "the schema document)", path)
        doc = self._ids.get(doc_uri, self.root) if doc_uri else self._document_of(base)
        if not fragment:
            return doc, target_uri
        if fragment.startswith("/"):
            return self._pointer(doc, fragment, ref, path), doc_uri + "#" + fragment
        anchor = self._anchors.get(doc_uri + "#" + fragment)
        if anchor is None:
            raise SchemaError(f"$ref {ref!r}: anchor not found", path)
        return anchor, doc_uri + "#" + fragment

    def _document_of(self, base: str):
        return self._ids.get(urldefrag(base)[0], self.root)

    def _pointer(self, doc, fragment: str, ref: str, path: str):
        node = doc
        for raw in fragment.split("/")[1:]:
            # a URI fragment: percent-decoded first, then JSON-pointer escapes (RFC 6901, 6)
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"$ref {ref!r} does not resolve inside the schema", path)
        return node

    def _ref(self, schema: dict, path: str, depth: int) -> tuple:
        target, key = self._resolve(schema["$ref"], schema, path)
        siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
        if siblings:
            if not isinstance(target, dict):
                target = {} if target is True else {"not": {}}
            merged = self._merge({k: v for k, v in target.items()}, siblings, path)
            return self.value(merged, path, depth + 1)
        return self._named(key, target, key, depth)

    def _named(self, key: str, target, path: str, depth: int) -> tuple:
        """The node of ``target`` (at ``path``) known as ``key``: compiled once; met again while
        it is being compiled, it is a cycle and becomes the grammar rule ``key``."""
        if key in self.rules or key in self._recursive and key in self._active:
            return ("rule", key)
        if key in self._active:
            self._recursive.add(key)
            return ("rule", key)
        if key in self._ref_cache:
            return self._ref_cache[key]
        self._active.add(key)
        try:
            node = self.value(target, path, depth + 1)
        finally:
            self._active.discard(key)
        if key in self._recursive:
            self.rules[key] = node
            node = ("rule", key)
        self._ref_cache[key] = node
        return node
