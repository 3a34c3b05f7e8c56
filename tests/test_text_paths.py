"""Every way text leaves the engine agrees with the others (h79's hostile pass): the engine's stop check reads the
text the server shows; the server's streamed chunks add up to its whole answer."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.stopping import special_ids
from hf_paged.processors.index.vocabulary import bytes_to_unicode
from hf_paged.serving.logprobs import TokenPieces
from hf_paged.serving.text import TextStream
from tests.processors.toy_tokenizers import byte_level_tokenizer
from tests.tiny_models import DECODER


class Force(LogitsProcessor):
    """Writes `ids`, one a step, then the last of them again and again."""

    def __init__(self, ids: list[int], prompt_len: int) -> None:
        self.ids, self.prompt_len = ids, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = min(input_ids.shape[1] - self.prompt_len, len(self.ids) - 1)
        out = torch.full_like(scores, float("-inf"))
        out[:, self.ids[step]] = 0.0
        return out


def _engine(vocab: int) -> Engine:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**DECODER, "vocab_size": vocab}))
    return Engine(model.eval(), PagedConfig(block_size=16, num_blocks=64))


def _run(engine: Engine, prompt: list[int], params: SamplingParams):
    rid = engine.add_request(prompt, params)
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return engine.pop_output(rid)


def test_a_stop_string_around_a_special_token_ends_the_request():
    """"a", <|end|> (special: the client's text skips it), "b": the server's text reads "ab" and cut there at the
    stop string "ab", but the engine's check read "a<|end|>b" and ran on to max_new_tokens (vLLM's stop check reads
    the text with special tokens skipped). A stop string that is a special token's text still stops too."""
    tok = byte_level_tokenizer()
    a, b = tok("a", add_special_tokens=False).input_ids[0], tok("b", add_special_tokens=False).input_ids[0]
    end = tok.convert_tokens_to_ids("<|end|>")
    assert end not in tok.all_special_ids  # (an added special token that all_special_ids does not list)
    engine = _engine(len(tok))
    prompt = tok("xy", add_special_tokens=False).input_ids
    forced = [a, end, b, a, a]
    params = SamplingParams(max_new_tokens=12, stop_strings=["ab"], tokenizer=tok,
                            logits_processors=[Force(forced, len(prompt))])
    out = _run(engine, prompt, params)
    assert out.finish_reason == "stop" and out.generated_tokens == [a, end, b]
    stream = TextStream(tok, ["ab"])
    assert stream.push(out.generated_tokens) + stream.finish() == "" and stream.stopped

    params = SamplingParams(max_new_tokens=12, stop_strings=["<|end|>"], tokenizer=tok,
                            logits_processors=[Force(forced, len(prompt))])
    out = _run(engine, prompt, params)
    assert out.finish_reason == "stop" and out.generated_tokens == [a, end]


def test_special_tokens_do_not_hide_a_stop_string_from_the_window():
    """The window of tokens the check decodes counts the tokens that show text: ten special tokens between "a" and
    "b" still leave "ab" inside it."""
    tok = byte_level_tokenizer()
    a, b = tok("a", add_special_tokens=False).input_ids[0], tok("b", add_special_tokens=False).input_ids[0]
    end = tok.convert_tokens_to_ids("<|end|>")
    engine = _engine(len(tok))
    prompt = tok("xy", add_special_tokens=False).input_ids
    forced = [a] + [end] * 10 + [b, a]
    params = SamplingParams(max_new_tokens=20, stop_strings=["ab"], tokenizer=tok,
                            logits_processors=[Force(forced, len(prompt))])
    out = _run(engine, prompt, params)
    assert out.finish_reason == "stop" and out.generated_tokens == forced[:-1]


def test_chat_bytes_of_an_added_special_token_are_null():
    """Chat's `bytes` joined are the content's bytes: a special token the content skips has null bytes (OpenAI's
    null), also one that `all_special_ids` does not list (<|end|> here; before, its 7 bytes were given)."""
    tok = byte_level_tokenizer()
    pieces = TokenPieces(tok)
    end, a = tok.convert_tokens_to_ids("<|end|>"), tok("a", add_special_tokens=False).input_ids[0]
    assert pieces.chat_bytes(end) is None and pieces.chat_bytes(tok.eos_token_id) is None
    assert pieces.chat_bytes(a) == [ord("a")]
    assert special_ids(tok) == {tok.eos_token_id, tok.pad_token_id, end}


class Recording:
    """A streamer that keeps what it is given; `fail_at`: the put that raises (counted from 1)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.puts: list[list] = []
        self.ends, self.fail_at = 0, fail_at

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())
        if len(self.puts) == self.fail_at:
            raise KeyError("a streamer bug")

    def end(self) -> None:
        self.ends += 1


def _wrapped():
    import hf_paged
    from tests.tiny_models import tiny_model

    return hf_paged.wrap(tiny_model("llama"), num_blocks=64)


def test_the_streamer_gets_the_rows_stock_gives_it():
    """num_return_sequences=2: stock puts the expanded prompt ([2, len]: a TextStreamer then refuses the batch, as
    stock's does) and one [2] tensor a step; the prompt went in unexpanded ([1, len]) before."""
    from tests.tiny_models import tiny_model

    ids = torch.tensor([[5, 6, 7]])
    got = {}
    for name, model in (("stock", tiny_model("llama")), ("paged", _wrapped())):
        streamer = Recording()
        model.generate(ids, max_new_tokens=3, do_sample=True, num_return_sequences=2, streamer=streamer)
        got[name] = streamer
    assert got["paged"].puts[0] == got["stock"].puts[0] == [[5, 6, 7], [5, 6, 7]]
    assert [len(p) for p in got["paged"].puts[1:]] == [len(p) for p in got["stock"].puts[1:]] == [2, 2, 2]
    assert got["paged"].ends == got["stock"].ends == 1


def test_the_streamer_ends_once_also_when_generate_raises():
    """A put that raises (or Ctrl-C in one) ends the call; the streamer still gets its one `end()`, so a
    TextIteratorStreamer's reader thread is released (stock leaves it waiting forever; end() was skipped here too)."""
    model = _wrapped()
    streamer = Recording(fail_at=3)
    try:
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6, do_sample=False, streamer=streamer)
    except KeyError:
        pass
    else:
        raise AssertionError("the streamer's error did not reach the caller")
    assert streamer.ends == 1 and len(streamer.puts) == 3
    out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6, do_sample=False)  # the model still works
    assert out.shape == (1, 9)


def _offsets(tokenizer, ids: list[int], sizes: list[int]) -> list[int]:
    """The text offsets the server gives `ids` pushed in deltas of `sizes` (its TextStream beside, as the server)."""
    from hf_paged.batching.logprobs import TokenLogprobs
    from hf_paged.serving.logprobs import EntryStream

    text, entries, at = TextStream(tokenizer), EntryStream(tokenizer), 0
    for size in sizes:
        delta = ids[at : at + size]
        entries.push(delta, [TokenLogprobs(i, -1.0, []) for i in delta], len(text.text))
        text.push(delta)
        at += size
    return [e.offset for e in entries.take(0, final=True)]


def test_a_token_after_an_invalid_byte_starts_after_its_replacement_character():
    """A byte that no later byte completes stays a U+FFFD of the text ("a\\ufffdbc"): the token after it starts
    after it (offset 2); it was given 1, the text before it with its U+FFFD stripped as if the byte were a cut
    character. A character cut across two tokens still gives both tokens its start."""
    tok = byte_level_tokenizer()
    char_of = bytes_to_unicode()  # byte -> the byte-level alphabet's character (one token each)

    def ids_of_bytes(raw: bytes) -> list[int]:
        return tok.convert_tokens_to_ids([char_of[b] for b in raw])

    a, bc = ids_of_bytes(b"a"), ids_of_bytes(b"bc")
    invalid, nichi = ids_of_bytes(b"\xff"), ids_of_bytes("日".encode())
    lead, not_after_it = ids_of_bytes(b"\xc5"), ids_of_bytes(b"\xd4")  # a lead byte, then no continuation of it
    ids = a + invalid + bc + nichi + a + lead + not_after_it + a
    assert tok.decode(ids) == "a\ufffdbc日a\ufffd\ufffda"
    for sizes in ([1] * len(ids), [2, 1, 3, 1, 1, 3], [len(ids)]):
        assert _offsets(tok, ids, sizes) == [0, 1, 2, 3, 4, 4, 4, 5, 6, 7, 8], sizes
    # echo of a prompt sent as these ids (no offset mapping: its decode does not tokenize back to them)
    from hf_paged.serving.logprobs import TokenPieces
    from hf_paged.serving.prompt_text import prompt_text

    prompt = ids_of_bytes(b"\xe6\x97") + a + invalid + bc + lead + not_after_it + a
    echo = prompt_text(tok, prompt, prompt)
    assert echo.text == "\ufffda\ufffdbc\ufffd\ufffda"
    assert echo.offsets(prompt, TokenPieces(tok).bytes) == [0, 0, 1, 2, 3, 4, 5, 6, 7]  # ("a" was given 0, "d4" 5)


def test_the_output_reads_after_the_prompt_so_a_leading_space_stays():
    """SentencePiece (Llama's decoder strips the decoded text's first space): the prompt "a", the output "▁", "name"
    reads " name" after it, as vLLM's detokenizer (started from the prompt's last tokens) and the prompt + output's
    decode give; the output decoded alone read "name". The offsets count from that text."""
    from tests.serving.test_text_stream import _llama_like

    tok = _llama_like()
    ids = tok("a name", add_special_tokens=False).input_ids
    prompt, output = ids[:1], ids[1:]
    assert tok.decode(output) == "name" and tok.decode(ids) == "a name"
    stream = TextStream(tok, context=prompt)
    assert "".join(stream.push([i]) for i in output) + stream.finish() == " name"
    from hf_paged.batching.logprobs import TokenLogprobs
    from hf_paged.serving.logprobs import EntryStream

    for sizes in ([1, 1], [2]):
        text, entries, at = TextStream(tok, context=prompt), EntryStream(tok, context=prompt), 0
        for size in sizes:
            delta = output[at : at + size]
            entries.push(delta, [TokenLogprobs(i, -1.0, []) for i in delta], len(text.text))
            text.push(delta)
            at += size
        assert [e.offset for e in entries.take(0, final=True)] == [0, 1], sizes


def test_only_the_last_replacement_character_is_a_cut_character():
    """f9 (invalid), e2 (a lead byte that e6 cuts off), then e6 97 84 ("敄" in three tokens): the tokens of 敄 all
    start at its character (2), not at the first of the U+FFFDs before it."""
    tok = byte_level_tokenizer()
    char_of = bytes_to_unicode()
    ids = tok.convert_tokens_to_ids([char_of[b] for b in b"a\xf9\xe2\xe6\x95\x84z"])
    assert tok.decode(ids) == "a\ufffd\ufffd敄z"
    assert _offsets(tok, ids, [1] * len(ids)) == [0, 1, 2, 3, 3, 3, 4]
