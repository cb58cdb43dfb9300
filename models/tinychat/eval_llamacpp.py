"""Measure how exactly a TinyChat GGUF answers fresh templated prompts (llama-cpp-python).

Rules
- Greedy decoding (temperature 0, top_k 1) through llama-cpp-python's chat
  path, which renders the GGUF's own ``tokenizer.chat_template``.
- Prompts are drawn (seeded) from gen_corpus.py's templates, with values the
  model saw in training, plus the held-out cities and a few out-of-distribution
  prompts to show what it does there.
- Prints a JSON report; the published model scores 90/90, 100/100, 50/50 and
  50/50 on the four exact-match checks.

Usage: ``python eval_llamacpp.py tiny-chat-q8_0.gguf`` (needs ``llama-cpp-python``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import gen_corpus as corpus
from llama_cpp import Llama

Messages = list[dict[str, str]]


def main() -> None:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="path of the GGUF file")
    ap.add_argument("--seed", type=int, default=99)
    a = ap.parse_args()
    llm = Llama(model_path=a.model, n_ctx=512, n_threads=2, verbose=False)
    r = random.Random(a.seed)

    def chat(msgs: Messages) -> str:
        out = llm.create_chat_completion(messages=msgs, max_tokens=64, temperature=0.0, top_k=1)
        return str(out["choices"][0]["message"]["content"])

    def parses_to(text: str, expected: dict[str, Any]) -> bool:
        try:
            return bool(json.loads(text) == expected)
        except ValueError:
            return False

    res: dict[str, Any] = {}
    t = time.time()
    # 1) weather tool call for every training city, 2 phrasings each; held-out cities
    ok = tot = 0
    for c in sorted(set(corpus.CITIES)):
        for q in r.sample(corpus.WEATHER_Q, 2):
            tot += 1
            ok += chat([{"role": "user", "content": q.format(c=c)}]) == corpus.tool_call_text(c)
    res["tool_call_seen_cities"] = f"{ok}/{tot}"
    res["tool_call_heldout_cities"] = {
        c: chat([{"role": "user", "content": f"What is the weather in {c}?"}])
        for c in corpus.HELDOUT_CITIES
    }
    # 2) JSON person (random name and age)
    ok = 0
    for _ in range(100):
        n, age = r.choice(corpus.NAMES), r.randint(1, 99)
        q = r.choice(corpus.JSON_PERSON_Q).format(n=n, a=age)
        ok += parses_to(chat([{"role": "user", "content": q}]), {"name": n, "age": age})
    res["json_person_exact"] = f"{ok}/100"
    # 3) JSON city and color
    ok = 0
    for _ in range(50):
        c, k = r.choice(corpus.CITIES), r.choice(corpus.COLORS)
        q = r.choice(corpus.JSON_CITY_Q).format(c=c, k=k)
        ok += parses_to(chat([{"role": "user", "content": q}]), {"city": c, "color": k})
    res["json_city_exact"] = f"{ok}/50"
    # 4) tool result -> sentence
    ok = 0
    for _ in range(50):
        c, tmp, cond = r.choice(corpus.CITIES), r.randint(-10, 35), r.choice(corpus.CONDITIONS)
        msgs = [
            {"role": "user", "content": f"What is the weather in {c}?"},
            {"role": "assistant", "content": corpus.tool_call_text(c)},
            {
                "role": "tool",
                "content": json.dumps({"city": c, "temperature": tmp, "condition": cond}),
            },
        ]
        ok += chat(msgs) == corpus.tool_result_answer(cond, c, tmp)
    res["tool_result_answer_exact"] = f"{ok}/50"
    # 5) out-of-distribution prompts: what does it do?
    res["ood"] = {
        q: chat([{"role": "user", "content": q}])
        for q in ["Write a poem about the sea.", "What is 2 plus 2?", "Hallo, wie geht's?"]
    }
    res["eval_s"] = round(time.time() - t, 2)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
