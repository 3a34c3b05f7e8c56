"""The OpenAI endpoints as the official `openai` client sees them."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from hf_paged import SamplingParams
from hf_paged.batching.request import RequestStatus

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def engine_greedy(engine, prompt_ids, max_new_tokens):
    """What the engine alone gives for these ids (greedy): the server must return exactly this text."""
    out = engine.loop.submit([prompt_ids], [SamplingParams(max_new_tokens=max_new_tokens)])
    result = next(iter(out.result().values()))
    assert result.status is RequestStatus.FINISHED
    return result


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-lm"]


def test_completion_matches_the_engine_and_reports_usage(client, engine, tiny_lm):
    tokenizer = tiny_lm.tokenizer
    prompt = "def fibonacci(n):\n    "
    ids = tokenizer(prompt)["input_ids"]
    reference = engine_greedy(engine, ids, 24)
    out = client.completions.create(model="tiny-lm", prompt=prompt, max_tokens=24, temperature=0)
    assert out.object == "text_completion" and len(out.choices) == 1
    assert out.choices[0].text == tokenizer.decode(reference.generated_tokens, skip_special_tokens=True)
    assert out.choices[0].finish_reason in ("length", "stop")
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == len(reference.generated_tokens)
    assert out.usage.total_tokens == len(ids) + len(reference.generated_tokens)


def test_cached_prompt_tokens_are_reported(client):
    # 320+ bytes: many full blocks; its own first line, so no earlier test's cached block shares its start
    prompt = "# cached-tokens test\n" + "import os\nimport sys\n" * 8
    first = client.completions.create(model="tiny-lm", prompt=prompt, max_tokens=4, temperature=0)
    second = client.completions.create(model="tiny-lm", prompt=prompt, max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 * ((second.usage.prompt_tokens - 1) // 16) - 16 and cached > 0
    assert first.choices[0].text == second.choices[0].text


def test_chat_completion_uses_the_chat_template(client, engine, tiny_lm):
    tokenizer = tiny_lm.tokenizer
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "hello"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    reference = engine_greedy(engine, ids, 16)
    out = client.chat.completions.create(model="tiny-lm", messages=messages, max_completion_tokens=16, temperature=0)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tokenizer.decode(reference.generated_tokens, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(ids)


def test_streaming_chat_gives_the_same_text_and_usage(client):
    kwargs = dict(model="tiny-lm", messages=[{"role": "user", "content": "for i in"}], max_tokens=20, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streaming_completion_text_and_n(client):
    stream = client.completions.create(model="tiny-lm", prompt="class ", max_tokens=12, n=2, temperature=0.9,
                                       seed=3, stream=True)
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1}
    whole = client.completions.create(model="tiny-lm", prompt="class ", max_tokens=12, n=2, temperature=0.9, seed=3,
                                      extra_body={"return_token_ids": True})
    assert [c.index for c in whole.choices] == [0, 1]
    assert [c.text for c in whole.choices] == [texts[0], texts[1]]  # the seed makes sampling reproducible
    assert whole.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in whole.choices)


def test_several_prompts_in_one_completion(client):
    out = client.completions.create(model="tiny-lm", prompt=["def a():", "def b():"], max_tokens=5, n=2,
                                    temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text and out.choices[2].text == out.choices[3].text


def test_stop_sequence_ends_the_text_before_it(client):
    free = client.completions.create(model="tiny-lm", prompt="def main():\n", max_tokens=40, temperature=0)
    text = free.choices[0].text
    stop = text[5:7]
    assert stop and stop in text
    cut = client.completions.create(model="tiny-lm", prompt="def main():\n", max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny-lm", prompt="def main():\n", max_tokens=40, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text[: text.index(stop)]


def test_json_schema_output_parses_and_validates(client):
    for _ in range(2):  # the second request reuses the compiled schema
        out = client.chat.completions.create(
            model="tiny-lm", messages=[{"role": "user", "content": "a person"}], max_tokens=120, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        )
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)


def test_strict_json_schema_gives_the_declared_keys_only(client):
    """OpenAI's `strict: true`: objects get exactly their declared keys (the h54 pass saw `{"a" : 0, "assing" :
    "assing" }` from a schema without `additionalProperties`, strict on)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}
    for seed in range(4):
        out = client.chat.completions.create(
            model="tiny-lm", messages=[{"role": "user", "content": "x"}], max_tokens=60, seed=seed, temperature=1.0,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}},
        )
        assert out.choices[0].finish_reason == "stop"
        assert set(json.loads(out.choices[0].message.content)) == {"a"}


def test_retrieve_a_model_by_id(client):
    assert client.models.retrieve("tiny-lm").id == "tiny-lm"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("hf-paged/other")


def test_guided_grammar(client):
    """vLLM's `guided_grammar` extra: a Lark grammar; the text is a sentence of it."""
    import lark

    grammar = 'start: "SELECT " NAME ("," NAME)* " FROM " NAME ";"\nNAME: /[a-z]{1,6}/'
    out = client.completions.create(model="tiny-lm", prompt="-- query\n", max_tokens=60, temperature=0,
                                    extra_body={"guided_grammar": grammar})
    assert out.choices[0].finish_reason == "stop"
    lark.Lark(grammar).parse(out.choices[0].text)


def test_json_object_regex_and_choice(client):
    out = client.completions.create(model="tiny-lm", prompt="x = ", max_tokens=60, temperature=0,
                                    extra_body={"guided_choice": ["alpha", "beta"]})
    assert out.choices[0].text in ("alpha", "beta")
    out = client.completions.create(model="tiny-lm", prompt="x = ", max_tokens=10, temperature=0,
                                    extra_body={"guided_regex": "[0-9]{3}"})
    assert len(out.choices[0].text) == 3 and out.choices[0].text.isdigit()
    out = client.chat.completions.create(model="tiny-lm", messages=[{"role": "user", "content": "{"}], max_tokens=200,
                                         temperature=0, response_format={"type": "json_object"})
    content = out.choices[0].message.content
    assert content.startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_concurrent_clients_share_steps(server, engine):
    import concurrent.futures

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    steps_before = engine.metrics.num_steps

    def one(i):
        return client.completions.create(model="tiny-lm", prompt=f"def f{i}():", max_tokens=30, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    assert all(o.usage.completion_tokens == 30 for o in outs)
    assert engine.metrics.num_steps - steps_before < 8 * 30  # batched: far fewer steps than tokens


def test_guided_whitespace_pattern_sets_the_json_whitespace(client):
    schema = {**SCHEMA, "properties": {"name": {"type": "string", "maxLength": 8},
                                       "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
    out = client.completions.create(model="tiny-lm", prompt="A person as JSON: ", max_tokens=80, temperature=0,
                                    extra_body={"guided_json": schema, "guided_whitespace_pattern": ""})
    text = out.choices[0].text
    assert out.choices[0].finish_reason == "stop"
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)  # no space between tokens
