"""A loopback HTTP server speaking the part of the Hugging Face Hub API that
``huggingface_hub.snapshot_download`` uses, for tests (point ``HF_ENDPOINT`` at ``url``).

    GET  /api/models/{repo}/revision/{rev}     repo info: {"id", "sha", "siblings"}
    GET  /api/models/{repo}/tree/{commit}      [{"type": "file", "path", "size", "oid"}]
    HEAD /{repo}/resolve/{rev}/{path}          X-Repo-Commit, ETag, Content-Length
    GET  /{repo}/resolve/{rev}/{path}          the file's bytes, same headers

Errors carry the Hub's ``X-Error-Code`` header, which huggingface_hub maps to its
exception types: ``RepoNotFound`` (404), ``GatedRepo`` (403, a gated repository asked
without its token), ``RevisionNotFound`` (404), ``EntryNotFound`` (404).
Every request path is recorded in ``requests`` (method, path) for assertions.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_INFO = re.compile(r"/api/models/(?P<repo>.+?)/revision/(?P<rev>[^/]+)")
_TREE = re.compile(r"/api/models/(?P<repo>.+?)/tree/(?P<rev>[^/]+)")
_RESOLVE = re.compile(r"/(?P<repo>.+?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")


@dataclass
class FakeRepo:
    """Files per commit and the refs (branches, tags) naming commits. A gated repository
    answers only requests bearing ``Authorization: Bearer {token}``."""
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    token: str | None = None

    def add_commit(self, files: dict[str, bytes], *refs: str) -> str:
        """Stores ``files`` as a new commit named by ``refs``; returns its hash."""
        digest = hashlib.sha1()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name])
        commit = digest.hexdigest()
        self.commits[commit] = dict(files)
        for ref in refs:
            self.refs[ref] = commit
        return commit

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` (recursively), keyed by its '/'-separated relative path."""
    return {path.relative_to(folder).as_posix(): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """``with FakeHub(repos) as hub:`` serves ``repos`` ({repo id: FakeRepo}) at ``hub.url``."""

    def __init__(self, repos: dict[str, FakeRepo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stops serving and closes the port (later connections are refused)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def downloaded(self) -> list[str]:
        """The files fetched with GET, in request order."""
        return [_RESOLVE.fullmatch(path)["file"] for method, path in self.requests
                if method == "GET" and _RESOLVE.fullmatch(path)]


def _handler_for(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:   # keep test output quiet
            pass

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            for pattern, route in ((_INFO, self._info), (_TREE, self._tree),
                                   (_RESOLVE, self._resolve)):
                match = pattern.fullmatch(path)
                if match:
                    return route(match, send_body)
            self._error(404, "EntryNotFound")

        def _repo_commit(self, match) -> tuple[FakeRepo, str] | None:
            """The repository and commit asked for, or None after sending the error."""
            repo = hub.repos.get(match["repo"])
            if repo is None:
                return self._error(404, "RepoNotFound")
            if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
                return self._error(403, "GatedRepo")
            commit = repo.commit_of(match["rev"])
            if commit is None:
                return self._error(404, "RevisionNotFound")
            return repo, commit

        def _info(self, match, send_body: bool) -> None:
            found = self._repo_commit(match)
            if found:
                repo, commit = found
                self._json({"id": match["repo"], "sha": commit, "private": False,
                            "gated": "manual" if repo.token else False,
                            "siblings": [{"rfilename": name} for name in repo.commits[commit]]},
                           send_body)

        def _tree(self, match, send_body: bool) -> None:
            found = self._repo_commit(match)
            if found:
                repo, commit = found
                self._json([{"type": "file", "path": name, "size": len(data),
                             "oid": git_blob_id(data)}
                            for name, data in repo.commits[commit].items()], send_body)

        def _resolve(self, match, send_body: bool) -> None:
            found = self._repo_commit(match)
            if not found:
                return
            repo, commit = found
            data = repo.commits[commit].get(match["file"])
            if data is None:
                return self._error(404, "EntryNotFound", commit)
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{git_blob_id(data)}"')
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if send_body:
                self.wfile.write(data)

        def _json(self, value, send_body: bool) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            if commit is not None:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return None

    return Handler
