"""Build the peers' bundle that ``bench/device/carried.sh`` assembles on the GPU machine.

Run here (a machine with PyPI), never in CI:

    python3 bench/device/make_bundle.py [--work /tmp/wh] [--parts .gpu_bundle]

It downloads ``vllm==0.26.0`` for the GPU machine's Python 3.12, drops FA2's 123 MB library
(Hopper runs FA3; vLLM imports FA2 only when it is there), xz-compresses the rest, and
downloads every wheel vLLM and tamis's server need that the GPU machine's image lacks
(the closure of ``Requires-Dist`` without extras, minus ``IMAGE_PACKAGES``). With SmolLM2's
tokenizer files (for W3's detokenizing server), they go into one tar, split into parts of
56 MiB (each uploaded on its own, with the working tree, under a 64 MiB limit):
``.gpu_bundle/pN/partN-1`` and ``.gpu_bundle/pN/bundle.sha``. Downloads and the
compressed vLLM stay under ``--work``, so a rerun redoes only what changed.
"""
from __future__ import annotations

import argparse
import email.parser
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

VLLM = "vllm==0.26.0"
FA2_LIBRARY = "vllm_flash_attn/_vllm_fa2_C.abi3.so"
PART_BYTES = 56 * 1024 * 1024   # the working tree (~2 MB) travels in the same 64 MiB
# Already installed on the GPU machine's image: not bundled.
IMAGE_PACKAGES = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
certifi charset-normalizer click cloudpickle cmake colorama filelock frozenlist fsspec h11
hf-xet httpcore httpx huggingface-hub idna jinja2 markdown-it-py markupsafe mdurl ml-dtypes
msgpack multidict networkx ninja numba numpy nvidia-ml-py packaging pandas pillow pip
prometheus-client propcache protobuf psutil py-cpuinfo pygments pyyaml regex requests rich
safetensors scipy sentencepiece setuptools six sympy tiktoken tokenizers torch torchaudio
torchvision tqdm transformers triton typer typing-extensions urllib3 uvloop wheel xxhash
yarl zipp shellingham llvmlite mpmath einops pybind11
""".split())
# Required by vLLM's metadata but not imported by its offline path with the flags
# carried.sh sets (FlashInfer sampler off, FA3 attention), or already on the image under
# another wheel: 525 MB that would not fit the uploads.
EXCLUDE = set("""
flashinfer-python tokenspeed-triton tokenspeed-mla nvidia-cutlass-dsl
nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core
opencv-python-headless tilelang z3-solver pynvvideocodec nccl-extensions
nvidia-cudnn-frontend torchcodec cuda-bindings cuda-core cuda-pathfinder grpcio
fastsafetensors
""".split())
# Server extras of tamis and what vLLM imports at start beyond its Requires-Dist.
EXTRA = ["fastapi", "uvicorn", "starlette", "pydantic", "pycountry", "openai==2.54.0",
         "outlines-core", "lark", "jsonschema", "gguf"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64"]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def download(spec: str, dest: Path) -> None:
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    try:
        subprocess.run(args + [spec], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError:
        # pure-python sdists-only packages: let pip build a wheel here
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(dest), spec], check=True)


def requirements(wheel: Path) -> list[str]:
    """The names of a wheel's unconditional requirements (markers for Linux/CPython 3.12)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(zf.read(meta).decode())
    names = []
    for req in message.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        if marker and not marker_holds(marker):
            continue
        names.append(normalize(re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0]))
    return names


def marker_holds(marker: str) -> bool:
    from packaging.markers import Marker
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "extra": "",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "os_name": "posix"}
    return Marker(marker).evaluate(env)


def wheel_name(path: Path) -> str:
    return normalize(path.name.split("-")[0])


def close_dependencies(vllm_wheel: Path, deps: Path) -> None:
    """Download the requirement closure of vLLM and EXTRA that the image lacks."""
    wanted = requirements(vllm_wheel) + EXTRA
    seen: set[str] = set()
    while wanted:
        spec = wanted.pop()
        name = normalize(re.split(r"[<>=!~]", spec)[0])
        if name in seen or name in IMAGE_PACKAGES | EXCLUDE or name == "vllm":
            continue
        seen.add(name)
        wheel = next((p for p in deps.glob("*.whl") if wheel_name(p) == name), None)
        if wheel is None:
            download(spec, deps)
            wheel = next(p for p in deps.glob("*.whl") if wheel_name(p) == name)
        wanted += requirements(wheel)
    print(f"{len(seen)} dependency wheels: {sorted(seen)}")


def strip_fa2(vllm_wheel: Path, out: Path) -> None:
    """vLLM's wheel unpacked without FA2, as an xz tarball (kept at ``out`` for reruns)."""
    if out.exists():
        return
    unpacked = out.parent / "vllm_unpacked"
    shutil.rmtree(unpacked, ignore_errors=True)
    with zipfile.ZipFile(vllm_wheel) as zf:
        zf.extractall(unpacked)
    (unpacked / "vllm" / FA2_LIBRARY).unlink()
    subprocess.run(f"tar cf - -C {unpacked} . | xz -T2 -6 > {out}", shell=True, check=True)


def smol_tokenizer(dest: Path) -> None:
    """SmolLM2's tokenizer and chat template (converted from the embedded GGUF)."""
    from tamis.engine.embedded import default_model_path
    source = default_model_path()
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(path, dest / path.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/wh")
    parser.add_argument("--parts", default=".gpu_bundle")
    args = parser.parse_args()
    work = Path(args.work)
    bundle = work / "bundle"
    shutil.rmtree(bundle / "smol_tokenizer", ignore_errors=True)
    (bundle / "vllm_nofa2.tar.xz").unlink(missing_ok=True)
    for wheel in (bundle / "deps").glob("*.whl"):   # left by an earlier run's wider closure
        if wheel_name(wheel) in EXCLUDE:
            wheel.unlink()
    (bundle / "deps").mkdir(parents=True, exist_ok=True)
    download(VLLM, work)
    vllm_wheel = next(work.glob("vllm-*.whl"))
    close_dependencies(vllm_wheel, bundle / "deps")
    smol_tokenizer(bundle / "smol_tokenizer")
    strip_fa2(vllm_wheel, work / "vllm_nofa2.tar.xz")
    shutil.copy(work / "vllm_nofa2.tar.xz", bundle / "vllm_nofa2.tar.xz")
    tar_path = work / "bundle.tar"
    with tarfile.open(tar_path, "w") as tar:
        for path in sorted(bundle.iterdir()):
            tar.add(path, arcname=path.name)
    split(tar_path, Path(args.parts))


def split(tar_path: Path, parts_dir: Path) -> None:
    data = tar_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    parts = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
    for index, part in enumerate(parts):
        folder = parts_dir / f"p{index + 1}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / f"part{index}").write_bytes(part)
        (folder / "bundle.sha").write_text(f"{digest}  bundle.tar {len(parts)}\n")
    print(f"{len(parts)} parts of {tar_path.stat().st_size:,} bytes under {parts_dir}")


if __name__ == "__main__":
    main()
