#!/usr/bin/env python3
"""Tokenizer fixtures for `crates/tokenizer`, made with Hugging Face's own code.

vLLM and SGLang turn a chat request into tokens with `transformers`:
`tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
tokenize=False, **chat_template_kwargs)`, then `tokenizer.encode(prompt,
add_special_tokens=False)`; a completion prompt is encoded with
`add_special_tokens=True`. This script builds two small model directories
(`tokenizer.json` from a byte-level BPE trained here with the `tokenizers`
library, `tokenizer_config.json` with a chat template) and records, for a
list of requests, the prompt text and the token ids `transformers` gives.
The Rust tokenizer is tested against them.

Usage (see README.md):

  /tmp/tokvenv/bin/python scripts/tokenizer/make_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Enough text for a few hundred merges: tokens then span several bytes, as a
# real tokenizer's do.
CORPUS = [
    "The router sends each request to the engine that already holds its prefix.",
    "A prefix cache keeps the attention keys and values of earlier tokens.",
    "You are a helpful assistant. Answer briefly and cite the document.",
    "What is the weather in Paris today? It is sunny and warm, about 24 degrees.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Tokens, blocks, engines, replicas, routers: the fleet serves models.",
    "Grüße aus München! Ça va? 東京の天気は晴れです。",
] * 20

CHATML_TEMPLATE = """\
{%- set ns = namespace(system=none) -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set ns.system = messages[0].content | trim -%}
{%- endif -%}
{%- if tools %}
<|im_start|>system
{% if ns.system %}{{ ns.system }}

{% endif %}# Tools
You may call these functions:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{%- elif ns.system %}
<|im_start|>system
{{ ns.system }}<|im_end|>
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' and message.tool_calls %}
<|im_start|>assistant
{%- if message.content %}
{{ message.content.strip() }}
{%- endif %}
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{%- else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}
{%- endif %}
"""

LLAMA_TEMPLATE = """\
{{- bos_token }}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant'] %}
{{- raise_exception('roles must be system, user or assistant, not ' ~ message.role) }}
{%- endif %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MODELS = {
    "chatml-bpe": {
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "config": {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": CHATML_TEMPLATE,
        },
        "bos": None,
    },
    "llama-bpe": {
        "special": ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
        "config": {
            "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                          "rstrip": False, "single_word": False, "special": True},
            "eos_token": "<|eot_id|>",
            "chat_template": LLAMA_TEMPLATE,
        },
        "bos": "<|begin_of_text|>",
    },
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, \"now\" or <later>.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}

CHAT_CASES = [
    {"name": "one user turn",
     "request": {"messages": [{"role": "user", "content": "What is the weather in Paris today?"}]}},
    {"name": "system and two turns",
     "request": {"messages": [
         {"role": "system", "content": "  You are a helpful assistant.  "},
         {"role": "user", "content": "Hello there"},
         {"role": "assistant", "content": "Hi! How can I help?"},
         {"role": "user", "content": "Tell me about prefix caches."}]}},
    {"name": "no generation prompt",
     "request": {"add_generation_prompt": False, "messages": [
         {"role": "user", "content": "Grüße aus München! 東京の天気は?"}]}},
    {"name": "tools and a tool call",
     "request": {"tools": [WEATHER_TOOL], "messages": [
         {"role": "system", "content": "Answer briefly."},
         {"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": " Let me look. ", "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24"}]}},
    {"name": "template kwargs",
     "request": {"chat_template_kwargs": {"enable_thinking": False}, "messages": [
         {"role": "user", "content": "def add(a, b): return a + b"}]}},
]

LLAMA_CASES = [
    {"name": "system and user",
     "request": {"messages": [
         {"role": "system", "content": "You are terse.\n"},
         {"role": "user", "content": "Tokens, blocks, engines?"}]}},
    {"name": "a role the template refuses",
     "request": {"messages": [{"role": "tool", "content": "x"}]}},
]

PROMPT_CASES = [
    "The router sends each request",
    "Grüße aus München!",
]


def train(special: list[str]) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def with_bos(tok: tokenizers.Tokenizer, bos: str | None) -> None:
    """A Llama-style tokenizer adds its BOS when asked for special tokens."""
    if bos is None:
        return
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                      special_tokens=[(bos, bos_id)]),
    ])


def render(hf, request: dict) -> dict:
    kwargs = dict(request.get("chat_template_kwargs") or {})
    try:
        text = hf.apply_chat_template(
            request["messages"],
            tools=request.get("tools"),
            add_generation_prompt=request.get("add_generation_prompt", True),
            tokenize=False,
            **kwargs,
        )
    except Exception as err:  # the template's own refusal
        return {"error": str(err)}
    return {"text": text, "ids": hf.encode(text, add_special_tokens=False)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "crates/tokenizer/tests/fixtures"))
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    for name, spec in MODELS.items():
        directory = out / name
        directory.mkdir(parents=True, exist_ok=True)
        tok = train(spec["special"])
        with_bos(tok, spec["bos"])
        tok.save(str(directory / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
                  **spec["config"]}
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        hf = transformers.AutoTokenizer.from_pretrained(str(directory))
        cases = CHAT_CASES if name == "chatml-bpe" else LLAMA_CASES
        expected = {
            "made_with": {"transformers": transformers.__version__,
                          "tokenizers": tokenizers.__version__},
            "chat": [{**case, "expect": render(hf, case["request"])} for case in cases],
            "prompt": [{"prompt": p, "ids": hf.encode(p, add_special_tokens=True)}
                       for p in PROMPT_CASES],
        }
        (out / f"{name}.expected.json").write_text(
            json.dumps(expected, indent=2, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(cases)} chat cases,"
              f" {len(PROMPT_CASES)} prompts")
        for case in expected["chat"]:
            e = case["expect"]
            print(f"  {case['name']}: " + (f"{len(e['ids'])} ids" if "ids" in e else f"error {e['error']!r}"))


if __name__ == "__main__":
    main()
