"""Hugging Face Hub model ids: a repository snapshot in the local Hub cache.

``download_model(repo_id, revision, download_dir) -> Path`` returns the snapshot folder
of a model repository (config, tokenizer files, safetensors weights), downloading what
the cache lacks; ``download_tokenizer`` does the same for tokenizer files alone. The
cache is huggingface_hub's (``HF_HOME`` / ``HF_HUB_CACHE``, or ``download_dir``), so a
checkpoint fetched by transformers or vLLM is not fetched again.

The environment is read at each call, not when huggingface_hub was imported:
``HF_TOKEN`` (private or gated repositories), ``HF_ENDPOINT`` (a mirror),
``HF_HUB_OFFLINE=1`` (the cache only, no network).

Every failure raises ``HubModelError`` naming the model id and saying what to do:
repository missing or private, gated, revision missing, offline and not cached, Hub
unreachable and not cached.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
# Everything a model folder needs besides its weights: config, generation config,
# tokenizer (fast JSON, sentencepiece, tiktoken, BPE merges / vocab), chat template.
METADATA_PATTERNS = ("*.json", "*.jinja", "*.model", "*.tiktoken", "merges.txt", "vocab.txt")
WEIGHT_PATTERNS = ("*.safetensors",)
SAFETENSORS_INDEX = "model.safetensors.index.json"

# huggingface_hub's repo id rule: "name" or "namespace/name", word characters, '-', '.'.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?")


class HubModelError(FileNotFoundError):
    """A Hub model id could not be turned into a local snapshot; the message says why
    and what to do. A FileNotFoundError, like a missing local model path, so callers
    that report one report both."""


def is_hub_model_id(model: str) -> bool:
    """True for a string shaped like ``name`` or ``org/name`` (not a path spelling:
    no leading '/', '.', '~', no '..' or '--')."""
    return bool(_REPO_ID.fullmatch(model)) and ".." not in model and "--" not in model


def download_model(repo_id: str, revision: str | None = None,
                   download_dir: str | os.PathLike | None = None) -> Path:
    """The snapshot folder of model ``repo_id`` at ``revision`` (None = the default
    branch). Metadata comes first; the weights fetched are those the safetensors index
    names (a repository may carry duplicate consolidated files), else every
    ``*.safetensors``. Raises HubModelError."""
    folder = _snapshot(repo_id, revision, download_dir, METADATA_PATTERNS)
    if not (folder / "config.json").is_file():
        raise HubModelError(f"model {repo_id!r} (revision {revision or 'main'}) has no "
                            f"config.json: it is not a Hugging Face transformers checkpoint")
    commit = folder.name   # pin the weights to the metadata's commit, and skip a lookup
    folder = _snapshot(repo_id, commit, download_dir, _weight_patterns(folder), revision)
    if not any(folder.glob("*.safetensors")):
        raise HubModelError(f"model {repo_id!r} (revision {revision or 'main'}) has no "
                            f"*.safetensors weights; for a GGUF repository, download its .gguf "
                            f"file and pass that path")
    return folder


def download_tokenizer(repo_id: str, revision: str | None = None,
                       download_dir: str | os.PathLike | None = None) -> Path:
    """The snapshot folder of ``repo_id`` with its tokenizer files only. Raises HubModelError."""
    return _snapshot(repo_id, revision, download_dir, METADATA_PATTERNS)


def _weight_patterns(folder: Path) -> tuple[str, ...]:
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        return tuple(sorted(set(json.loads(index.read_text())["weight_map"].values())))
    return WEIGHT_PATTERNS


def _offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) as set now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in ("1", "on", "yes", "true")


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _snapshot(repo_id: str, revision: str | None, download_dir, patterns,
              asked_revision: str | None = None) -> Path:
    """``snapshot_download`` with its failures turned into HubModelError.
    ``asked_revision`` is the revision the user gave, for messages, when ``revision`` is
    the commit it resolved to."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = _offline()
    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=download_dir, endpoint=_endpoint(),
            local_files_only=offline, allow_patterns=list(patterns))
    except (HfHubHTTPError, LocalEntryNotFoundError) as exc:
        raise _explain(exc, repo_id, asked_revision or revision, download_dir, offline) from None
    return Path(folder)


def _explain(exc: Exception, repo_id: str, revision: str | None, download_dir,
             offline: bool) -> HubModelError:
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    endpoint = _endpoint()
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):
        return HubModelError(
            f"model {repo_id!r} is gated on the Hugging Face Hub: accept its licence at "
            f"{endpoint}/{repo_id} with your account, then set HF_TOKEN to a token of that "
            f"account (or run `hf auth login`)")
    if isinstance(exc, RepositoryNotFoundError):
        return HubModelError(
            f"model {repo_id!r} is neither a local path nor a repository on the Hugging Face "
            f"Hub ({endpoint}): check the spelling, or set HF_TOKEN if the repository is private")
    if isinstance(exc, RevisionNotFoundError):
        return HubModelError(
            f"revision {revision!r} of model {repo_id!r} does not exist on the Hugging Face "
            f"Hub: pass an existing branch, tag or commit hash with --revision")
    if status in (401, 403):
        return HubModelError(
            f"the Hugging Face Hub refused access to model {repo_id!r} (HTTP {status}): set "
            f"HF_TOKEN to a token that can read it")
    cache = download_dir or "the Hugging Face cache (HF_HOME)"
    if isinstance(exc, LocalEntryNotFoundError) and offline:
        return HubModelError(
            f"model {repo_id!r} (revision {revision or 'main'}) is missing from {cache} (in "
            f"whole or in part) and HF_HUB_OFFLINE is set: download it once with network access, or unset "
            f"HF_HUB_OFFLINE")
    if isinstance(exc, LocalEntryNotFoundError):
        return HubModelError(
            f"cannot download model {repo_id!r} (revision {revision or 'main'}): the Hugging "
            f"Face Hub at {endpoint} cannot be reached and the model is not in {cache}; check "
            f"the network, proxy and HF_ENDPOINT ({_first_line(exc)})")
    return HubModelError(f"the Hugging Face Hub failed to serve model {repo_id!r}: "
                         f"{_first_line(exc)}")


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


__all__ = ["HubModelError", "download_model", "download_tokenizer", "is_hub_model_id"]
