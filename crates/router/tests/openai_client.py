"""Drives llmgw's router with the official `openai` package.

Run by crates/router/tests/it/t20_openai_client.rs with ROUTER_URL (no keys),
KEYED_ROUTER_URL (keys team-a: qwen, team-b: embed) and REFERENCE_ENGINE_URL
(an engine with the weights of the `resumed` model, asked directly). Prints
one line per check and exits 1 if any failed.
"""

import json
import os
import sys
import traceback
import urllib.error
import urllib.request

import openai
from openai import OpenAI

ROUTER = os.environ["ROUTER_URL"]
KEYED = os.environ["KEYED_ROUTER_URL"]
REFERENCE = os.environ["REFERENCE_ENGINE_URL"]
client = OpenAI(base_url=ROUTER + "/v1", api_key="unused", max_retries=0, timeout=30)
results = []


def check(fn):
    try:
        fn()
        results.append(True)
        print(f"ok   {fn.__name__}")
    except Exception:  # noqa: BLE001 - every failure is reported, not raised
        results.append(False)
        print(f"FAIL {fn.__name__}\n{traceback.format_exc()}")
    sys.stdout.flush()


def expect_status(exc_type, status, fn):
    try:
        fn()
    except exc_type as e:
        assert e.status_code == status, (e.status_code, e.body)
        return e
    raise AssertionError(f"expected {exc_type.__name__} {status}")


def models_are_listed():
    ids = {m.id for m in client.models.list().data}
    assert {"qwen", "embed", "cut", "nowhere"} <= ids, ids


def chat_by_alias():
    r = client.chat.completions.create(
        model="q", messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert r.object == "chat.completion", r
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "length", r.choices[0].finish_reason
    assert r.usage.completion_tokens == 5, r.usage


def chat_stream_with_unknown_fields():
    # ignore_eos is not an OpenAI field: it must reach the engine unchanged.
    stream = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, chunks
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], finishes
    assert chunks[-1].usage.completion_tokens == 7, chunks[-1]


def completions():
    r = client.completions.create(model="qwen", prompt="Once upon", max_tokens=4)
    assert r.object == "text_completion" and r.choices[0].text, r
    pieces = list(client.completions.create(model="qwen", prompt="Once upon", max_tokens=4, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices), pieces


def embeddings():
    r = client.embeddings.create(model="embed", input=["one", "two"])
    assert len(r.data) == 2, r
    assert len(r.data[0].embedding) == 384, len(r.data[0].embedding)


def unknown_model_is_404():
    e = expect_status(
        openai.NotFoundError,
        404,
        lambda: client.chat.completions.create(model="gpt-none", messages=[{"role": "user", "content": "x"}]),
    )
    assert e.code == "model_not_found", e.body


def unplaced_model_is_503_with_explanation():
    e = expect_status(
        openai.InternalServerError,
        503,
        lambda: client.chat.completions.create(model="nowhere", messages=[{"role": "user", "content": "x"}]),
    )
    assert "0/3 nodes fit nowhere profile tp8" in e.message, e.message
    assert e.code == "no_ready_replica", e.body


def malformed_json_is_400():
    req = urllib.request.Request(
        ROUTER + "/v1/chat/completions",
        data=b'{"model": "qwen", "messages": [',
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 400, e.code
        body = json.load(e)
        assert body["error"]["code"] == "invalid_json", body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        return
    raise AssertionError("malformed JSON was accepted")


def oversized_body_is_413():
    e = expect_status(
        openai.APIStatusError,
        413,
        lambda: client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "x" * 100_000}]
        ),
    )
    assert e.code == "request_too_large", e.body


def stream_cut_midway_ends_with_error_event():
    stream = client.chat.completions.create(
        model="cut", messages=[{"role": "user", "content": "hello"}], max_tokens=30, stream=True
    )
    received = 0
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += 1
    except openai.APIError as e:
        assert "stopped mid-answer" in e.message, e.message
        assert received >= 1, "the cut came before any content"
        return
    raise AssertionError(f"the stream ended without an error after {received} chunks")


def streams_resumed_elsewhere_read_as_one_answer():
    # `resumed` has two replicas, one of which cuts every stream after three
    # tokens: streams that start there are finished by the other. Twenty
    # streams make it all but certain that some start there; each must read
    # exactly as one uninterrupted answer.
    reference = OpenAI(base_url=REFERENCE + "/v1", api_key="unused", max_retries=0, timeout=30)
    for i in range(20):
        messages = [{"role": "user", "content": f"resume {i}"}]
        stream = client.chat.completions.create(
            model="resumed",
            messages=messages,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, ids, usage, finish = "", set(), None, None
        for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage:
                usage = chunk.usage
            if chunk.choices:
                choice = chunk.choices[0]
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        whole = reference.chat.completions.create(model="resumed", messages=messages, max_tokens=20)
        assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
        assert finish == whole.choices[0].finish_reason, (finish, whole.choices[0].finish_reason)
        assert len(ids) == 1, ids
        assert usage.completion_tokens == whole.usage.completion_tokens, (usage, whole.usage)
        assert usage.prompt_tokens == whole.usage.prompt_tokens, (usage, whole.usage)


def api_keys():
    wrong = OpenAI(base_url=KEYED + "/v1", api_key="sk-wrong", max_retries=0, timeout=30)
    e = expect_status(openai.AuthenticationError, 401, lambda: wrong.models.list())
    assert e.code == "invalid_api_key", e.body
    team_a = OpenAI(base_url=KEYED + "/v1", api_key="sk-team-a", max_retries=0, timeout=30)
    r = team_a.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.choices[0].message.content
    e = expect_status(
        openai.PermissionDeniedError, 403, lambda: team_a.embeddings.create(model="embed", input="x")
    )
    assert e.code == "model_not_allowed", e.body
    team_b = OpenAI(base_url=KEYED + "/v1", api_key="sk-team-b", max_retries=0, timeout=30)
    assert [m.id for m in team_b.models.list().data] == ["embed"]


for f in [
    models_are_listed,
    chat_by_alias,
    chat_stream_with_unknown_fields,
    completions,
    embeddings,
    unknown_model_is_404,
    unplaced_model_is_503_with_explanation,
    malformed_json_is_400,
    oversized_body_is_413,
    stream_cut_midway_ends_with_error_event,
    streams_resumed_elsewhere_read_as_one_answer,
    api_keys,
]:
    check(f)

passed = sum(results)
failed = len(results) - passed
print(f"openai client checks: {passed} ok, {failed} failed")
sys.exit(1 if failed else 0)
