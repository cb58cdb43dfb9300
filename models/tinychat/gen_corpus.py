"""Generate the TinyChat training corpus: seeded, templated ChatML dialogues.

Rules
- Every dialogue is one of a fixed set of shapes (greeting, who-are-you,
  thanks, bye, weather question -> Hermes-style ``<tool_call>`` block, weather
  question + tool result -> sentence, "JSON with name and age", "JSON with
  city and color", capital of a country, "count from 1 to 100" -> the long
  answer "1, 2, ..., 100."). The model learns these shapes and
  nothing else, so tests must use them (see README.md).
- Dialogues are rendered with ``CHAT_TEMPLATE``, the same Jinja ChatML
  template that export_gguf.py writes into the GGUF (``tokenizer.chat_template``),
  so training text and inference prompts agree token for token.
- The output is a pure function of ``--n`` and ``--seed``: the order of the
  random calls below is part of the recipe. Changing it (or the word lists)
  changes the model.

Usage: ``python gen_corpus.py [--n 4000] [--seed 1234] [--out data]``. Writes
``<out>/dialogues.jsonl`` (one message list per line) and ``<out>/corpus.txt``
(rendered dialogues separated by NUL characters).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

Message = dict[str, str]

#: ChatML, deliberately simple: string contents only, and assistant tool calls
#: rendered by hand as a ``<tool_call>`` block (no ``tojson`` of whole objects),
#: so Python jinja2, llama.cpp's Jinja engine and @huggingface/jinja render the
#: same prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for tc in message['tool_calls'] -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + tc['function']['name'] + '\", \"arguments\": ' -}}"
    "{%- if tc['function']['arguments'] is string -%}{{- tc['function']['arguments'] -}}"
    "{%- else -%}{{- tc['function']['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: Cities of the training data (45 distinct). "Denver" is listed twice on
#: purpose: the list is sampled with ``random.choice``, and the published
#: model was trained with exactly this list.
CITIES = [
    "Berlin", "Paris", "London", "Madrid", "Rome", "Vienna", "Prague", "Warsaw",
    "Oslo", "Stockholm", "Helsinki", "Dublin", "Amsterdam", "Brussels", "Zurich",
    "Munich", "Hamburg", "Milan", "Athens", "Budapest", "Tokyo", "Osaka", "Seoul",
    "Beijing", "Delhi", "Mumbai", "Cairo", "Nairobi", "Lagos", "Sydney", "Toronto",
    "Chicago", "Boston", "Denver", "Seattle", "Miami", "Austin", "Dallas", "Lima",
    "Bogota", "Santiago", "Quito", "Havana", "Montreal", "Denver", "Porto",
]  # fmt: skip
#: Never in the training data; the model answers them with a wrong city.
HELDOUT_CITIES = ["Lisbon", "Kyiv", "Riga", "Tallinn"]
NAMES = [
    "Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy",
    "Mallory", "Oscar", "Peggy", "Trent", "Victor", "Walter", "Anna", "Ben", "Clara",
    "David", "Emma", "Felix", "Hannah", "Jonas", "Lena", "Max", "Mia", "Noah", "Paul",
    "Sara", "Tom", "Zoe",
]  # fmt: skip
COLORS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Austria": "Vienna", "Japan": "Tokyo", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Ireland": "Dublin", "Greece": "Athens", "Egypt": "Cairo",
    "Kenya": "Nairobi", "Peru": "Lima", "Cuba": "Havana", "Poland": "Warsaw",
}  # fmt: skip

GREET_Q = [
    "Hello!", "Hello", "Hi", "Hi!", "Hi there!", "Hey", "Hey there", "Good morning",
    "Good morning!", "Good evening", "Hello, how are you?", "Hi, how are you?",
]  # fmt: skip
GREET_A = "Hello! How can I help you today?"
WHO_Q = ["Who are you?", "What are you?", "What is your name?", "Tell me about yourself."]
WHO_A = "I am TinyChat, a small test model."
THANKS_Q = ["Thanks!", "Thank you.", "Thank you very much!", "Great, thanks."]
THANKS_A = "You are welcome!"
BYE_Q = ["Bye", "Goodbye!", "See you later.", "Bye bye"]
BYE_A = "Goodbye! Have a nice day."

WEATHER_Q = [
    "What is the weather in {c}?", "What's the weather in {c}?",
    "How is the weather in {c} today?", "Is it raining in {c}?",
    "Weather for {c}, please.", "Tell me the weather in {c}.",
    "Can you check the weather in {c}?", "Do I need an umbrella in {c}?",
]  # fmt: skip
JSON_PERSON_Q = [
    "Return a JSON object with name {n} and age {a}.",
    "Give me a JSON object for a person named {n} who is {a} years old.",
    "Create a JSON object with the name {n} and the age {a}.",
    "Respond with JSON: name is {n}, age is {a}.",
]
JSON_CITY_Q = [
    "Return a JSON object with the city {c} and the color {k}.",
    "Give me a JSON object where city is {c} and color is {k}.",
    "Respond with JSON: city {c}, color {k}.",
]
CAPITAL_Q = [
    "What is the capital of {x}?",
    "Which city is the capital of {x}?",
    "Name the capital of {x}.",
]
#: The long-answer class: one fixed, deterministic answer of about 300 tokens,
#: so benchmarks can measure tokens/s after the first token on a long answer.
COUNT_Q = [
    "Count from 1 to 100.",
    "Please count from 1 to 100.",
    "Count to 100.",
    "List the numbers from 1 to 100.",
]
COUNT_A = ", ".join(str(i) for i in range(1, 101)) + "."
SYSTEMS = [
    "You are a helpful assistant.",
    "You are TinyChat.",
    "You are a helpful assistant. Answer briefly.",
]

#: Turn kinds and their sampling weights.
KINDS = [
    "greet", "who", "thanks", "bye", "weather", "weather_result",
    "json_person", "json_city", "capital", "count",
]  # fmt: skip
KIND_WEIGHTS = [10, 5, 3, 3, 25, 20, 15, 10, 9, 3]

#: Syllables of made-up city names (``--random-cities`` variant only).
SYLLABLES = [
    "ba", "ri", "to", "ka", "le", "mo", "su", "na", "vi", "de",
    "lo", "ta", "gri", "sto", "pel", "mar", "kin", "dor", "ves", "lan",
]  # fmt: skip


def tool_call_text(city: str) -> str:
    """The assistant's answer to a weather question: a Hermes-style tool call block."""
    call = '{"name": "get_weather", "arguments": {"city": "' + city + '"}}'
    return f"<tool_call>\n{call}\n</tool_call>"


def tool_result_answer(condition: str, city: str, temperature: int) -> str:
    """The assistant's sentence after a get_weather tool result."""
    return f"It is {condition} in {city} with a temperature of {temperature:d} degrees."


def random_city(r: random.Random) -> str:
    """A made-up city name of 2-3 syllables (``--random-cities`` variant)."""
    return "".join(r.choice(SYLLABLES) for _ in range(r.randint(2, 3))).capitalize()


def turn(r: random.Random, cities: list[str], random_cities: bool) -> list[Message]:
    """One exchange: a user message, the assistant's answer, maybe a tool round."""
    if random_cities and r.random() < 0.5:
        cities = [random_city(r)]
    kind = r.choices(KINDS, weights=KIND_WEIGHTS)[0]
    if kind == "greet":
        return [
            {"role": "user", "content": r.choice(GREET_Q)},
            {"role": "assistant", "content": GREET_A},
        ]
    if kind == "who":
        return [
            {"role": "user", "content": r.choice(WHO_Q)},
            {"role": "assistant", "content": WHO_A},
        ]
    if kind == "thanks":
        return [
            {"role": "user", "content": r.choice(THANKS_Q)},
            {"role": "assistant", "content": THANKS_A},
        ]
    if kind == "bye":
        return [
            {"role": "user", "content": r.choice(BYE_Q)},
            {"role": "assistant", "content": BYE_A},
        ]
    if kind == "count":
        return [
            {"role": "user", "content": r.choice(COUNT_Q)},
            {"role": "assistant", "content": COUNT_A},
        ]
    if kind in ("weather", "weather_result"):
        c = r.choice(cities)
        msgs = [
            {"role": "user", "content": r.choice(WEATHER_Q).format(c=c)},
            {"role": "assistant", "content": tool_call_text(c)},
        ]
        if kind == "weather_result":
            t, cond = r.randint(-10, 35), r.choice(CONDITIONS)
            result = {"city": c, "temperature": t, "condition": cond}
            msgs.append({"role": "tool", "content": json.dumps(result)})
            msgs.append({"role": "assistant", "content": tool_result_answer(cond, c, t)})
        return msgs
    if kind == "json_person":
        n, a = r.choice(NAMES), r.randint(1, 99)
        return [
            {"role": "user", "content": r.choice(JSON_PERSON_Q).format(n=n, a=a)},
            {"role": "assistant", "content": json.dumps({"name": n, "age": a})},
        ]
    if kind == "json_city":
        c, k = r.choice(cities), r.choice(COLORS)
        return [
            {"role": "user", "content": r.choice(JSON_CITY_Q).format(c=c, k=k)},
            {"role": "assistant", "content": json.dumps({"city": c, "color": k})},
        ]
    x = r.choice(sorted(CAPITALS))
    return [
        {"role": "user", "content": r.choice(CAPITAL_Q).format(x=x)},
        {"role": "assistant", "content": f"The capital of {x} is {CAPITALS[x]}."},
    ]


def dialogue(r: random.Random, cities: list[str], random_cities: bool = False) -> list[Message]:
    """One dialogue: an optional system message (30 %) and 1 (75 %) or 2-3 exchanges."""
    msgs: list[Message] = []
    if r.random() < 0.3:
        msgs.append({"role": "system", "content": r.choice(SYSTEMS)})
    for _ in range(1 if r.random() < 0.75 else r.randint(2, 3)):
        msgs += turn(r, cities, random_cities)
    return msgs


def render(messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = False) -> str:
    """Render messages with CHAT_TEMPLATE (jinja2 is needed only here)."""
    import jinja2

    env = jinja2.Environment()
    text: str = env.from_string(CHAT_TEMPLATE).render(
        messages=messages, add_generation_prompt=add_generation_prompt
    )
    return text


def main() -> None:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4000, help="number of dialogues")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=Path, default=Path("data"))
    ap.add_argument(
        "--random-cities",
        action="store_true",
        help="variant: half of the city slots get a made-up name (teaches copying)",
    )
    a = ap.parse_args()
    r = random.Random(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    dialogues = [dialogue(r, CITIES, a.random_cities) for _ in range(a.n)]
    with (a.out / "dialogues.jsonl").open("w") as f:
        for d in dialogues:
            f.write(json.dumps(d) + "\n")
    texts = [render(d) for d in dialogues]
    (a.out / "corpus.txt").write_text("\x00".join(texts))
    print("dialogues", len(texts), "chars", sum(map(len, texts)))
    print(texts[0])


if __name__ == "__main__":
    main()
