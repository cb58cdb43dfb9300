"""The token ids napllm-lmsp decodes for a conversation are llama.cpp's own (docs/lmsp.md 9.2).

llama-server renders a chat with the model's template, removes a BOS text
the template writes first when the tokenizer adds BOS itself (an EOS text
last, likewise), and tokenizes with the vocabulary's special tokens added
and special-token text parsed (`common_tokenize(vocab, prompt, true,
true)`). Its ids for a conversation are compared here with what
napllm-lmsp's engine decodes, using llama.cpp's C API through llama_cpp as
the reference (`llama_chat_apply_template`, `llama_tokenize` with
`add_special` and `parse_special`): no llama-server is needed. A template
that starts with `{{ bos_token }}` made napllm-lmsp's prompt start with two
BOS tokens (the rendered text's, parsed as a special token, and the
tokenizer's); the model variant below, whose vocabulary adds BOS and whose
template writes it, shows that kind.
"""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

import llama_cpp as ll
from tests.service.conftest import MODEL

from napllm.lmsp import InputText, MessageItemIn
from napllm.lmsp_service.batching import piece_decoder
from napllm.lmsp_service.engine import Engine
from napllm.lmsp_service.prompt import chat_messages, render_prompt

#: A conversation: a system prompt, turns before, non-ASCII and special-token text.
ITEMS = [
    MessageItemIn(role="system", content=[InputText(text="Be brief.")]),
    MessageItemIn(role="user", content=[InputText(text="Hello there, café ☕")]),
    MessageItemIn(role="assistant", content=[InputText(text="Hi. <|im_end|> What now?")]),
    MessageItemIn(role="user", content=[InputText(text="Tell me about robots.\n\nThanks")]),
]

#: A chat template that writes BOS first, padded to the length of TinyChat's own.
_BOS_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def _bos_model(directory: Path) -> Path:
    """A copy of TinyChat whose vocabulary adds BOS and whose template writes it."""
    import gguf
    import numpy as np

    path = directory / "tiny-chat-bos.gguf"
    shutil.copyfile(MODEL, path)
    reader = gguf.GGUFReader(path, "r+")
    add_bos = reader.fields["tokenizer.ggml.add_bos_token"]
    add_bos.parts[add_bos.data[0]][0] = True
    field = reader.fields["tokenizer.chat_template"]
    old = bytes(field.parts[field.data[0]])
    padding = len(old) - len(_BOS_TEMPLATE.encode()) - 4
    assert padding >= 0
    new = (_BOS_TEMPLATE + "{#" + " " * padding + "#}").encode()
    field.parts[field.data[0]][:] = np.frombuffer(new, dtype=np.uint8)
    reader.data.flush()
    return path


def llama_cpp_ids(model_path: Path, messages: list[dict[str, Any]]) -> list[int]:
    """The ids llama.cpp's own template code and tokenizer give (llama-server's path)."""
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(model_path).encode(), params)
    assert model
    try:
        template = ll.llama_model_chat_template(model, None)
        chat = (ll.llama_chat_message * len(messages))()
        keep = []
        for i, message in enumerate(messages):
            role, content = message["role"].encode(), message["content"].encode()
            keep += [role, content]
            chat[i].role, chat[i].content = role, content
        buffer = ctypes.create_string_buffer(1 << 16)
        size = ll.llama_chat_apply_template(
            template, chat, len(messages), True, buffer, len(buffer)
        )
        assert 0 < size <= len(buffer)
        text = buffer.raw[:size]
        vocab = ll.llama_model_get_vocab(model)
        tokens = (ll.llama_token * (len(text) + 8))()
        count = ll.llama_tokenize(vocab, text, len(text), tokens, len(tokens), True, True)
        assert count > 0
        return list(tokens[:count])
    finally:
        ll.llama_model_free(model)


@pytest.fixture(scope="module", params=["tinychat", "a template writing BOS"])
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "tinychat":
        return MODEL
    return _bos_model(tmp_path_factory.mktemp("bos-model"))


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Engine]:
    engine = Engine(model_path, "tinychat", n_ctx=512, n_threads=1, slots=1)
    yield engine
    engine.close()


def test_the_engine_decodes_llama_cpps_own_ids_for_a_conversation(
    model_path: Path, engine: Engine
) -> None:
    messages = chat_messages(ITEMS)
    ids = engine.tokenize(render_prompt(engine.template, messages, None))
    assert ids == llama_cpp_ids(model_path, messages)
    bos = ids[0]
    if engine.template.add_bos:
        assert ids.count(bos) == 1  # one BOS, not the template's and the tokenizer's


def test_bytes_that_never_form_utf8_read_as_llama_server_writes_them() -> None:
    # With the same ids, napllm-lmsp's text differed from llama-server's
    # whenever the model sampled a lone byte token (TinyChat's token 115 is
    # the byte 0xB4): the bytes were dropped, llama-server writes U+FFFD
    # (its JSON is dumped with nlohmann's `error_handler_t::replace`).
    decoder = piece_decoder()
    pieces = [b"L", b"\xb4", b"Dallas", b"\xc3", b"\xa9", b"\xe2\x82", b"a", b"\xe2\x82"]
    text = "".join(decoder.decode(piece) for piece in pieces) + decoder.decode(b"", final=True)
    assert text == "L\ufffdDallasé\ufffda\ufffd"
