"""`echo: true` shows a text prompt as it was sent (OpenAI's and vLLM's echo): not "<|bos|>" + its decode, so a client
can cut its completion off with `text[len(prompt):]`; the added BOS keeps its entry, with no text."""

from __future__ import annotations

from hf_paged.serving.logprobs import TokenPieces, completion_logprobs
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


def test_text_offsets_of_characters_split_over_byte_tokens(server, tiny_lm):
    """Each token's offset is where its character starts (the h54 pass saw offsets counted in U+FFFD pieces, past the
    end of the text and going backwards); every piece of one character starts at that character."""
    want = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]  # BOS (no text), then 3 bytes each of 日, 本, 語
    body = {"max_tokens": 0, "echo": True, "logprobs": 1}
    sent = ok(server, "/v1/completions", {**body, "prompt": "日本語"})["choices"][0]
    assert sent["text"] == "日本語" and sent["logprobs"]["text_offset"] == want
    ids = tiny_lm.tokenizer("日本語")["input_ids"]
    by_ids = ok(server, "/v1/completions", {**body, "prompt": ids})["choices"][0]
    assert by_ids["text"] == "<|bos|>日本語" and by_ids["logprobs"]["text_offset"] == [0] + [o + 7 for o in want[1:]]
    generated = ok(server, "/v1/completions", {**body, "prompt": "日本", "max_tokens": 2})["choices"][0]
    offsets = generated["logprobs"]["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] <= len(generated["text"])


def test_text_offsets_without_an_offset_mapping_count_whole_characters(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    ids = tokenizer("a日b")["input_ids"]

    class Slow:
        all_special_ids = tokenizer.all_special_ids

        def __call__(self, text, **kwargs):
            raise NotImplementedError("return_offsets_mapping is not available when using Python tokenizers")

    text = prompt_text(Slow(), "a日b", ids)
    assert text.offsets(ids, TokenPieces(tokenizer).bytes) == [0, 0, 1, 1, 1, 2]


def test_byte_pieces_get_their_own_labels(tiny_lm):
    """A completions `tokens` item / `top_logprobs` key for a piece of a character is OpenAI's "bytes:\\x.." spelling:
    two such tokens never share the key "\ufffd" (the later, less likely one overwrote the earlier)."""
    from hf_paged.batching.logprobs import TopLogprob
    from hf_paged.serving.logprobs import LogprobEntry

    pieces = TokenPieces(tiny_lm.tokenizer)
    assert pieces.label(230) == "bytes:\\xe6" and pieces.label(72) == "H"
    entry = LogprobEntry(230, -1.0, [TopLogprob(230, -1.0), TopLogprob(151, -2.0), TopLogprob(72, -3.0)], 0)
    out = completion_logprobs([entry], pieces)
    assert out["tokens"] == ["bytes:\\xe6"]
    assert out["top_logprobs"] == [{"bytes:\\xe6": -1.0, "bytes:\\x97": -2.0, "H": -3.0}]
    eos = tiny_lm.tokenizer.eos_token_id
    assert pieces.chat_bytes(eos) is None and pieces.chat_bytes(72) == [72]  # OpenAI: null for no bytes form
