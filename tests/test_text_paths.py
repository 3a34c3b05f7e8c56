"""Every way text leaves the engine agrees with the others (h79's hostile pass): the engine's stop check reads the
text the server shows; the server's streamed chunks add up to its whole answer."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.stopping import special_ids
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
