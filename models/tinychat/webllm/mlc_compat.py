"""Run mlc-llm's model compiler (Python sources at a pinned commit) on the apache-tvm wheel.

``build_webllm.py`` imports this module in the process that runs one
``mlc_llm`` command (``gen_config``, ``convert_weight``, ``compile``).
:func:`install` prepares that process; nothing of mlc-llm or TVM is
copied or edited on disk, everything below is done to the imported
modules at run time:

- mlc-llm's package ``__init__`` imports its serving engine, which needs
  ``libmlc_llm`` (a C++ library not built here). The package is registered
  from its folder without running that ``__init__``; only the compiler
  modules are imported.
- mlc-llm at that commit was written against mlc's own TVM fork. The names
  apache-tvm 0.25 keeps elsewhere are made available where mlc-llm looks
  (:func:`_tvm_names`); TVMScript functions default to schedulable TIR
  (``s_tir``), which the fork's parser did implicitly.
- ``DetectTokenizerInfo`` is a C++ function of ``libmlc_llm``; it is
  answered from ``tokenizer.json`` here (:func:`tokenizer_info`).
- Weights are read with safetensors' numpy API, so PyTorch is not needed
  (float32 checkpoints only), and converted on the CPU without probing GPUs.
- ``argsort_probs``, the sort WebLLM runs over the vocabulary's
  probabilities for every token (even at temperature 0), is compiled from
  :mod:`ranksort` instead of TVM's GPU merge sort (see that module).

Every replacement checks that the thing it replaces exists, so a different
mlc-llm or TVM fails here loudly instead of compiling something else.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def _require(module: types.ModuleType, name: str) -> None:
    if not hasattr(module, name):
        raise RuntimeError(f"{module.__name__}.{name} is missing: not the pinned mlc-llm/TVM")


def _register_package(python_dir: Path) -> None:
    """Make ``import mlc_llm.<sub>`` work without executing ``mlc_llm/__init__.py``."""
    folder = python_dir / "mlc_llm"
    if not (folder / "__init__.py").is_file():
        raise RuntimeError(f"{folder} is not mlc-llm's Python package")
    package = types.ModuleType("mlc_llm")
    package.__path__ = [str(folder)]
    package.__file__ = str(folder / "__init__.py")
    package.__package__ = "mlc_llm"
    sys.modules["mlc_llm"] = package
    package.__version__ = importlib.import_module("mlc_llm.libinfo").__version__


def _tvm_names() -> None:
    """Names mlc-llm reads from the places TVM's fork had them."""
    import tvm
    import tvm.ir
    import tvm.support
    import tvm_ffi.registry
    import tvm_ffi.structural
    from tvm import relax

    for name in ("Constant", "StringImm", "PrimType", "Op", "ExprWithOp", "Range"):
        if not hasattr(relax, name) and hasattr(tvm.ir, name):
            setattr(relax, name, getattr(tvm.ir, name))
    if not hasattr(relax, "prim_value"):
        relax.prim_value = relax.PrimValue
    for name in ("structural_equal", "structural_hash"):
        if not hasattr(tvm.ir, name):
            setattr(tvm.ir, name, getattr(tvm_ffi.structural, name))
    # tvm.contrib.<tool> became tvm.support.<tool>.
    import tvm.contrib

    for name in ("cc", "emcc", "ndk", "tar", "utils", "xcode", "clang", "nvcc", "rocm"):
        module = importlib.import_module(f"tvm.support.{name}")
        sys.modules[f"tvm.contrib.{name}"] = module
        setattr(tvm.contrib, name, module)
    # Object types registered by libmlc_llm (not loaded) stay plain Python classes.
    _require(tvm_ffi.registry, "_SKIP_UNKNOWN_OBJECTS")
    tvm_ffi.registry._SKIP_UNKNOWN_OBJECTS = True


def _schedulable_tir_by_default() -> None:
    """``@T.prim_func`` without ``s_tir=`` parses as schedulable TIR, as in TVM's fork."""
    import tvm.tirx.script.parser.entry as entry
    import tvm.tirx.script.parser.parser as parser

    params = list(inspect.signature(entry.prim_func).parameters.values())
    defaults = [p.default for p in params if p.default is not inspect.Parameter.empty]
    names = [p.name for p in params if p.default is not inspect.Parameter.empty]
    defaults[names.index("s_tir")] = True
    entry.prim_func.__defaults__ = tuple(defaults)
    original = parser.find_decorator_annotation

    def find_decorator_annotation(node, annotation, default=True):  # type: ignore[no-untyped-def]
        return original(node, annotation, True if annotation == "s_tir" else default)

    parser.find_decorator_annotation = find_decorator_annotation


def _bool_function_attributes() -> None:
    """``T.func_attr({"tirx.noalias": T.bool(True)})`` stores a Python bool.

    The fork accepted a TIR boolean constant there; apache-tvm 0.25's passes
    read the attribute as a bool and reject the constant. The builder's FFI
    call is wrapped (``func_attr`` looks it up on every call).
    """
    import tvm.tirx
    from tvm.tirx.script.builder import ir as builder

    ffi = builder._ffi_api
    _require(ffi, "FuncAttrs")
    original = ffi.FuncAttrs

    def func_attrs(attrs):  # type: ignore[no-untyped-def]
        if isinstance(attrs, dict):
            attrs = {
                key: bool(value.value)
                if isinstance(value, tvm.tirx.IntImm) and value.dtype == "bool"
                else value
                for key, value in attrs.items()
            }
        return original(attrs)

    ffi.FuncAttrs = func_attrs


def tokenizer_info(path: str) -> str:
    """``TokenizerInfo`` JSON for the tokenizer folder ``path`` (mlc-llm's field names).

    Byte-level BPE when the decoder is (or contains) ``ByteLevel``; a prefix
    space when the normalizer prepends ``▁``; stripped decode when the
    decoder strips. Raises ``FileNotFoundError`` without ``tokenizer.json``.
    """
    data = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))

    def parts(node: object) -> Iterator[dict]:
        if isinstance(node, dict):
            yield node
            for child in node.get("decoders") or node.get("normalizers") or []:
                yield from parts(child)

    decoders = list(parts(data.get("decoder")))
    normalizers = list(parts(data.get("normalizer")))
    byte_level = any(d.get("type") == "ByteLevel" for d in decoders)
    return json.dumps(
        {
            "token_postproc_method": "byte_level" if byte_level else "byte_fallback",
            "prepend_space_in_encode": any(
                n.get("type") == "Prepend" and n.get("prepend") == "\u2581" for n in normalizers
            ),
            "strip_space_in_decode": any(d.get("type") == "Strip" for d in decoders),
        }
    )


def _tokenizer_info_in_python() -> None:
    tokenizers = importlib.import_module("mlc_llm.tokenizers.tokenizers")
    _require(tokenizers.Tokenizer, "detect_tokenizer_info")
    tokenizers.Tokenizer.detect_tokenizer_info = staticmethod(
        lambda path: tokenizers.TokenizerInfo.from_json(tokenizer_info(str(path)))
    )


def load_safetensor_shard(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) for every tensor of a safetensors file, without PyTorch."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as shard:
        for name in shard.keys():  # noqa: SIM118 (safe_open is not iterable)
            yield name, shard.get_tensor(name)


def _numpy_weights() -> None:
    for name in ("mlc_llm.loader.utils", "mlc_llm.loader.huggingface_loader"):
        module = importlib.import_module(name)
        _require(module, "load_safetensor_shard")
        module.load_safetensor_shard = load_safetensor_shard


def _cpu_only() -> None:
    """Weights are converted on the CPU: no probing of GPUs in child interpreters.

    mlc-llm asks a fresh ``python -m mlc_llm.cli.check_device`` per device
    kind, which would not have this module's preparation.
    """
    auto_device = importlib.import_module("mlc_llm.support.auto_device")
    _require(auto_device, "_RESULT_CACHE")
    auto_device._RESULT_CACHE["cpu:0"] = True
    for kind in auto_device.AUTO_DETECT_DEVICES:
        if kind != "cpu":
            auto_device._RESULT_CACHE[f"{kind}:0"] = False


def _rank_count_sampler_sort() -> None:
    from ranksort import attach_argsort_probs

    sampler = importlib.import_module("mlc_llm.compiler_pass.attach_sampler")
    _require(sampler, "_attach_argsort_func")
    sampler._attach_argsort_func = attach_argsort_probs


def install(python_dir: Path) -> None:
    """Prepare this process to run mlc-llm's compiler from ``python_dir`` (its ``python/``)."""
    sys.path.insert(0, str(python_dir))
    _tvm_names()
    _schedulable_tir_by_default()
    _bool_function_attributes()
    _register_package(python_dir)
    _tokenizer_info_in_python()
    _numpy_weights()
    _cpu_only()
    _rank_count_sampler_sort()
