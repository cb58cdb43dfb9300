"""Build TinyChat for WebLLM: weights, config, tokenizer and the WebGPU model library.

Usage (from the repository root, Debian 12, see README.md in this folder)::

    python3 models/tinychat/webllm/build_webllm.py \\
        --mlc-llm <git dir of mlc-ai/mlc-llm> --tvm <git dir of apache/tvm> --work <scratch dir>

Run it with the interpreter of a virtual environment that has
``requirements-build.txt`` installed; ``emcc`` (Debian's ``emscripten``)
and ``make`` must be on PATH. The source locations may also be given as
``MLC_LLM_GIT`` and ``TVM_GIT``; only ``git archive`` of the pinned
commits is used, so bare clones are fine.

Steps (everything temporary goes to ``--work``):

1. TVM's WebAssembly runtime bitcode (``wasm_runtime``, ``tvmjs_support``,
   ``webgpu_runtime``): the apache-tvm wheel's ``web/`` and runtime
   sources, with ``include/``, ``src/support`` and ``3rdparty/compiler-rt``
   of apache/tvm at :data:`TVM_TAG`. ``TVM_ROOT`` is relative, so no path of
   the build machine ends up in the library.
2. mlc-llm's ``mlc_wasm_runtime.bc`` from its ``web/`` at :data:`MLC_COMMIT`.
3. ``gguf_to_llama.py``: the committed GGUF as a Hugging Face checkpoint.
4. mlc-llm's ``gen_config``, ``convert_weight`` and ``compile`` (float32
   weights ``q0f32``, conversation template ``chatml_nosystem``, context
   512, prefill chunk 128, batch 1, target ``webgpu``), each in a child
   process prepared by ``mlc_compat.install`` (``argsort_probs`` from
   ``ranksort.py``).
5. The files WebLLM reads are copied next to this script and
   ``SHA256SUMS`` is rewritten.

Exit status 0 on success; a failing step raises (``CalledProcessError``,
``SystemExit`` with a message).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
GGUF = ROOT / "models" / "tinychat" / "tiny-chat-q8_0.gguf"

#: mlc-ai/mlc-llm commit whose Python compiler and web runtime are used.
MLC_COMMIT = "8405e6974f9c664e1b3a48ed2630c05d82b5da72"
#: apache/tvm tag matching the apache-tvm wheel of requirements-build.txt.
TVM_TAG = "v0.25.0"
#: The model library's file name (WebLLM's `model_lib`).
LIBRARY = "tinychat-webgpu.wasm"
#: What WebLLM reads, written next to this script.
ARTIFACTS = (
    "mlc-chat-config.json",
    "tensor-cache.json",
    "params_shard_0.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    LIBRARY,
)
GEN_CONFIG = [
    "--quantization", "q0f32",
    "--conv-template", "chatml_nosystem",
    "--context-window-size", "512",
    "--prefill-chunk-size", "128",
    "--max-batch-size", "1",
]  # fmt: skip


def run(cmd: list[str], **kwargs: object) -> None:
    """Run ``cmd``, echoing it; raises ``CalledProcessError`` on failure."""
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def git_extract(git_dir: Path, ref: str, paths: list[str], dest: Path) -> None:
    """Extract ``paths`` of ``ref`` from the git repository ``git_dir`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / ".archive.tar"
    run(["git", "-C", str(git_dir), "archive", "-o", str(archive), ref, *paths])
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()


def tvm_web_runtime(work: Path, tvm_git: Path) -> Path:
    """Step 1: a TVM source home with the runtime bitcode built; returns its folder."""
    site = Path(sysconfig.get_paths()["purelib"])
    home = work / "tvm-home"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(site / "tvm" / "web", home / "web")
    shutil.copytree(site / "tvm" / "src" / "runtime", home / "src" / "runtime")
    ffi = home / "3rdparty" / "tvm-ffi"
    for part in ("src", "include", "3rdparty/dlpack"):
        shutil.copytree(site / "tvm_ffi" / part, ffi / part)
    parts = ["include", "src/support", "3rdparty/compiler-rt"]
    git_extract(tvm_git, f"refs/tags/{TVM_TAG}", parts, home)
    names = ("wasm_runtime", "tvmjs_support", "webgpu_runtime")
    targets = [f"dist/wasm/{name}.bc" for name in names]
    run(["make", "TVM_ROOT=..", f"-j{os.cpu_count() or 1}", *targets], cwd=home / "web")
    return home


def mlc_sources(work: Path, mlc_git: Path, tvm_home: Path) -> Path:
    """Step 2: mlc-llm's python/ and web/ with ``mlc_wasm_runtime.bc``; returns the folder."""
    mlc = work / "mlc-llm"
    shutil.rmtree(mlc, ignore_errors=True)
    git_extract(mlc_git, MLC_COMMIT, ["python", "web"], mlc)
    # Relative, like TVM_ROOT above: no path of this machine in the library.
    source = os.path.relpath(tvm_home, mlc / "web")
    run(["make", f"TVM_SOURCE_DIR={source}", "dist/wasm/mlc_wasm_runtime.bc"], cwd=mlc / "web")
    return mlc


def mlc(command: str, args: list[str], mlc_dir: Path, tvm_home: Path) -> None:
    """Step 4: one mlc_llm command in a child process prepared by ``mlc_compat``."""
    env = dict(os.environ)
    env.update(
        SKIP_LOADING_MLCLLM_SO="1",
        MLC_LLM_SOURCE_DIR=str(mlc_dir),
        TVM_HOME=str(tvm_home),
    )
    run([sys.executable, str(Path(__file__)), "--mlc-step", str(mlc_dir), command, *args], env=env)


def mlc_step(argv: list[str]) -> int:
    """Child process: ``--mlc-step <mlc-llm dir> <command> <args...>``."""
    sys.path.insert(0, str(HERE))
    import mlc_compat

    mlc_compat.install(Path(argv[0]) / "python")
    from mlc_llm.support import logging

    logging.enable_logging()
    command, rest = argv[1], argv[2:]
    module = {
        "gen_config": "mlc_llm.cli.gen_config",
        "convert_weight": "mlc_llm.cli.convert_weight",
        "compile": "mlc_llm.cli.compile",
    }[command]
    import importlib

    importlib.import_module(module).main(rest)
    return 0


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--mlc-step"]:
        return mlc_step(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlc-llm", type=Path, default=os.environ.get("MLC_LLM_GIT"))
    ap.add_argument("--tvm", type=Path, default=os.environ.get("TVM_GIT"))
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    if args.mlc_llm is None or args.tvm is None:
        ap.error("give --mlc-llm and --tvm (or MLC_LLM_GIT and TVM_GIT)")
    if shutil.which("emcc") is None:
        raise SystemExit("emcc is missing: apt-get install emscripten")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    tvm_home = tvm_web_runtime(work, args.tvm.resolve())
    mlc_dir = mlc_sources(work, args.mlc_llm.resolve(), tvm_home)
    hf, model = work / "hf", work / "mlc"
    shutil.rmtree(model, ignore_errors=True)
    run([sys.executable, str(HERE / "gguf_to_llama.py"), str(GGUF), str(hf)])
    mlc("gen_config", [str(hf), *GEN_CONFIG, "-o", str(model)], mlc_dir, tvm_home)
    convert = ["--quantization", "q0f32", "--model-type", "llama", "--device", "cpu"]
    mlc("convert_weight", [str(hf), *convert, "-o", str(model)], mlc_dir, tvm_home)
    config = str(model / "mlc-chat-config.json")
    mlc("compile", [config, "--device", "webgpu", "-o", str(model / LIBRARY)], mlc_dir, tvm_home)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in ARTIFACTS:
        shutil.copyfile(model / name, out / name)
        lines.append(f"{sha256(out / name)}  {name}\n")
    (out / "SHA256SUMS").write_text("".join(lines))
    print(f"wrote {len(ARTIFACTS)} files and SHA256SUMS to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
