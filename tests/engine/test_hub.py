"""Hub model ids against a loopback server speaking the Hub's HTTP API (HF_ENDPOINT):
download into the cache, revisions, sharded checkpoints, HF_TOKEN for gated repositories,
HF_HUB_OFFLINE, and the errors for missing, gated, unknown-revision and unreachable."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hub_server import FakeHub, FakeRepo, folder_files
from safetensors.torch import load, save

from tamis import LLM, SamplingParams
from tamis.engine.hub import HubModelError, is_hub_model_id
from tamis.engine.loader import load_model, resolve_model_path

torch.set_num_threads(1)   # 2 threads stall on OpenMP barriers when the CPUs are shared

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
PROMPTS = ["The capital of France is", "1, 2, 3,"]
TOKEN = "hf_test_token"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A private Hub cache and no ambient Hub settings (token, offline, endpoint)."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return cache


@pytest.fixture
def tiny_files(tiny_checkpoint):
    return folder_files(tiny_checkpoint("llama"))


@pytest.fixture
def serve(monkeypatch):
    """``serve({repo id: FakeRepo}) -> FakeHub``, running, with HF_ENDPOINT pointing at it."""
    hubs: list[FakeHub] = []

    def start(repos: dict[str, FakeRepo]) -> FakeHub:
        hubs.append(FakeHub(repos).__enter__())
        monkeypatch.setenv("HF_ENDPOINT", hubs[-1].url)
        return hubs[-1]

    yield start
    for hub in hubs:
        hub.stop()


def greedy_tokens(model, **engine_args) -> list[list[int]]:
    llm = LLM(model, kv_cache_memory_bytes="16MiB", max_model_len=256, **engine_args)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def sharded(files: dict[str, bytes]) -> dict[str, bytes]:
    """The checkpoint split into two shards named by an index, plus a decoy
    consolidated file the index does not name (it must not be downloaded)."""
    tensors = load(files.pop("model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        files[shard] = save({k: tensors[k] for k in keys}, metadata={"format": "pt"})
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    files["consolidated.safetensors"] = b"not a checkpoint"
    return files


# ---------------------------------------------------------------- model ids

@pytest.mark.parametrize("text, expected", [
    ("org/name", True), ("gpt2", True), ("Qwen/Qwen2.5-0.5B-Instruct", True),
    ("/abs/path", False), ("./rel", False), ("~/model", False), ("a/b/c", False),
    ("org--name", False), ("org/..", False), ("model.gguf/", False),
])
def test_hub_model_id_shape(text, expected):
    assert is_hub_model_id(text) is expected


# ---------------------------------------------------------------- downloads

def test_hub_id_generates_like_the_local_folder_then_loads_offline(
        monkeypatch, serve, hub_cache, tiny_checkpoint, tiny_files):
    hub = serve({"org/tiny": FakeRepo()})
    hub.repos["org/tiny"].add_commit(tiny_files, "main")
    expected = greedy_tokens(str(tiny_checkpoint("llama")))
    assert greedy_tokens("org/tiny", revision="main") == expected
    assert sorted(set(hub.downloaded())) == sorted(tiny_files)     # once each, into the cache
    assert (hub_cache / "models--org--tiny" / "refs" / "main").is_file()

    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    requests_before = len(hub.requests)
    assert greedy_tokens("org/tiny") == expected
    assert len(hub.requests) == requests_before


def test_revision_and_sharded_checkpoint(serve, hub_cache, tmp_path, tiny_checkpoint,
                                         tiny_files):
    repo = FakeRepo()
    repo.add_commit({"config.json": tiny_files["config.json"]}, "main")   # no weights on main
    v1 = repo.add_commit(sharded(dict(tiny_files)), "v1")
    hub = serve({"org/tiny": repo})
    download_dir = tmp_path / "models"

    folder = resolve_model_path("org/tiny", revision="v1", download_dir=download_dir)
    assert folder.name == v1 and download_dir in folder.parents
    assert "consolidated.safetensors" not in hub.downloaded()
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} <= set(
        hub.downloaded())

    config = SimpleNamespace(model="org/tiny", revision="v1", download_dir=str(download_dir),
                             dtype="auto", load_format="auto", quantization=None, seed=0,
                             attention_backend="torch")
    from_hub = load_model(config, "cpu")[0].state_dict()
    local = load_model(SimpleNamespace(**{**vars(config), "model": str(tiny_checkpoint("llama"))}),
                       "cpu")[0].state_dict()
    assert all(torch.equal(from_hub[name], local[name]) for name in local)


def test_hub_tokenizer_at_its_own_revision(serve, hub_cache, tiny_checkpoint, tiny_files):
    tokenizer_files = {k: v for k, v in tiny_files.items() if not k.endswith(".safetensors")}
    repo = FakeRepo()
    release = repo.add_commit(tokenizer_files, "release")
    serve({"org/tokenizer": repo})
    from tamis.engine.loader import tokenizer_path

    config = SimpleNamespace(tokenizer="org/tokenizer", tokenizer_revision="release",
                             download_dir=None)
    folder = tokenizer_path(config, model_dir=tiny_checkpoint("llama"))
    assert folder.name == release and (folder / "tokenizer.json").is_file()
    assert tokenizer_path(SimpleNamespace(tokenizer=None), model_dir=Path("/m")) == Path("/m")


# ---------------------------------------------------------------- errors

def test_missing_repo_and_revision_name_the_model(serve, hub_cache, tiny_files):
    repo = FakeRepo()
    repo.add_commit(tiny_files, "main")
    serve({"org/tiny": repo})
    with pytest.raises(HubModelError, match="'org/missing' is neither a local path nor a "
                                            "repository on the Hugging Face Hub"):
        resolve_model_path("org/missing")
    with pytest.raises(HubModelError, match="revision 'nope' of model 'org/tiny' does not exist"):
        resolve_model_path("org/tiny", revision="nope")


def test_repo_without_safetensors_says_so(serve, hub_cache, tiny_files):
    repo = FakeRepo()
    repo.add_commit({"config.json": tiny_files["config.json"], "pytorch_model.bin": b"pickle"},
                    "main")
    hub = serve({"org/bin-only": repo})
    with pytest.raises(HubModelError, match="'org/bin-only' .* has no \\*.safetensors weights"):
        resolve_model_path("org/bin-only")
    assert hub.downloaded() == ["config.json"]


def test_gated_repo_needs_hf_token(monkeypatch, serve, hub_cache, tiny_files):
    repo = FakeRepo(token=TOKEN)
    repo.add_commit(tiny_files, "main")
    hub = serve({"org/gated": repo})
    with pytest.raises(HubModelError, match=r"'org/gated' is gated .* accept its licence at "
                                            r"http://127\.0\.0\.1:\d+/org/gated .* HF_TOKEN"):
        resolve_model_path("org/gated")
    assert not hub.downloaded()
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubModelError, match="gated"):
        resolve_model_path("org/gated")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert (resolve_model_path("org/gated") / "config.json").is_file()


def test_offline_or_unreachable_without_cache(monkeypatch, serve, hub_cache, tiny_files):
    repo = FakeRepo()
    repo.add_commit(tiny_files, "main")
    hub = serve({"org/tiny": repo})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubModelError, match="'org/tiny' .* HF_HUB_OFFLINE is set"):
        resolve_model_path("org/tiny")
    assert not hub.requests
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.stop()
    with pytest.raises(HubModelError, match=r"cannot download model 'org/tiny' .* Hub at "
                                            r"http://127\.0\.0\.1:\d+ cannot be reached"):
        resolve_model_path("org/tiny")


def test_offline_with_partial_cache_says_so(monkeypatch, serve, hub_cache, tiny_files):
    """Metadata cached by a tokenizer-only download does not pass for the whole model."""
    from tamis.engine.hub import download_tokenizer

    repo = FakeRepo()
    repo.add_commit(tiny_files, "main")
    hub = serve({"org/tiny": repo})
    download_tokenizer("org/tiny")
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubModelError, match="'org/tiny' .* is missing from .* in part.* HF_HUB_OFFLINE"):
        resolve_model_path("org/tiny")


def test_serve_exits_with_the_message_and_no_traceback(serve, hub_cache, tiny_files):
    repo = FakeRepo(token=TOKEN)
    repo.add_commit(tiny_files, "main")
    serve({"org/gated": repo})
    env = {**os.environ, "TAMIS_ASYNC_SCHEDULING": "0"}
    result = subprocess.run([sys.executable, "-m", "tamis.cli", "serve", "org/gated",
                             "--device", "cpu", "--port", "0"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "tamis serve: model 'org/gated' is gated" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_flags_reach_the_config():
    import argparse

    from tamis.engine.arg_utils import add_engine_args
    from tamis.engine.config import EngineConfig

    args = add_engine_args(argparse.ArgumentParser()).parse_args(
        ["--model", "org/name", "--revision", "v2", "--tokenizer-revision", "t1",
         "--download-dir", "/models"])
    config = EngineConfig.from_cli_args(args)
    assert (config.model, config.revision, config.tokenizer_revision, config.download_dir) == (
        "org/name", "v2", "t1", "/models")
    with pytest.raises(ValueError, match="--revision"):
        EngineConfig(revision="")


def test_generate_reports_the_hub_error(serve, hub_cache, capsys):
    from tamis.cli import main

    serve({})
    assert main(["generate", "--model", "org/missing", "--device", "cpu", "hello"]) == 2
    assert "tamis generate: model 'org/missing' is neither a local path" in capsys.readouterr().err
