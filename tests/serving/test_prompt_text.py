"""`echo: true` shows a text prompt as it was sent (OpenAI's and vLLM's echo): not "<|bos|>" + its decode, so a client
can cut its completion off with `text[len(prompt):]`; the added BOS keeps its entry, with no text."""

from __future__ import annotations

from hf_paged.serving.prompt_text import prompt_text
from tests.serving.test_logprobs import ok, streamed

PROMPT = "Once upon a time"


def test_echo_with_generation_starts_with_the_prompt_as_sent(server):
    plain = ok(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})["choices"][0]
    echoed = ok(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "echo": True,
                                            "logprobs": 1})["choices"][0]
    assert echoed["text"] == PROMPT + plain["text"]  # was "<|bos|>Once upon a time..."
    lp = echoed["logprobs"]
    assert lp["tokens"][0] == "<|bos|>" and lp["token_logprobs"][0] is None
    offsets, text = lp["text_offset"], echoed["text"]
    assert offsets[:2] == [0, 0]  # the BOS has no text: "O" starts at 0
    for token, offset in zip(lp["tokens"][1:], offsets[1:]):  # each piece is the text at its offset
        assert text[offset:offset + len(token)] == token
    streamed_text = "".join(c["choices"][0]["text"] for c in streamed(
        server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "echo": True})
        if c["choices"])
    assert streamed_text == echoed["text"]


def test_echo_scoring_shows_the_text_prompt_as_sent(server, tiny_lm):
    body = {"max_tokens": 0, "echo": True, "logprobs": 0}
    by_index = [ok(server, "/v1/completions", {**body, "prompt": prompt})["choices"][0]
                for prompt in (PROMPT, tiny_lm.tokenizer(PROMPT)["input_ids"])]
    assert by_index[0]["text"] == PROMPT
    assert by_index[1]["text"] == "<|bos|>" + PROMPT  # token ids are echoed as they decode, special tokens too
    assert by_index[0]["logprobs"]["token_logprobs"] == by_index[1]["logprobs"]["token_logprobs"]
    assert by_index[0]["logprobs"]["text_offset"][:2] == [0, 0]
    assert by_index[1]["logprobs"]["text_offset"][:2] == [0, 7]


def test_prompt_text_without_an_offset_mapping_takes_special_ids_as_added(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    ids = tokenizer(PROMPT)["input_ids"]

    class Slow:  # no return_offsets_mapping (a slow tokenizer)
        all_special_ids = tokenizer.all_special_ids

        def __call__(self, text, **kwargs):
            if kwargs.get("return_offsets_mapping"):
                raise NotImplementedError("return_offsets_mapping is not available when using Python tokenizers")
            return tokenizer(text, **kwargs)

    assert prompt_text(Slow(), PROMPT, ids).textless == frozenset({0})
    assert prompt_text(tokenizer, PROMPT, ids).textless == frozenset({0})
    assert prompt_text(tokenizer, PROMPT, ids[1:]).textless == frozenset()  # not its tokenization: special ids (none)
