"""The processors over tokenizers that are not GPT-2's (`family_tokenizers`: Llama-like SentencePiece BPE with byte
fallback, Qwen-like byte-level BPE with chat specials and added tokens, T5-like Unigram without byte fallback).

Soundness: random token paths the masks allow, walked to EOS, decode (alone and after a prompt) to text the
constraint accepts, multi-byte characters split over byte tokens included. Completeness: valid texts, in the
tokenizer's own segmentation, character by character and byte by byte, are allowed at every step, with EOS
exactly where the text is complete. Special tokens are never allowed but EOS; added normal tokens are text.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import lark
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, models
from transformers import PreTrainedTokenizerFast

from hf_paged.errors import TokenizerError, UnsatisfiableSchemaError
from hf_paged.processors import (
    ChoiceLogitsProcessor,
    GrammarLogitsProcessor,
    JSONSchemaLogitsProcessor,
    RegexLogitsProcessor,
)
from hf_paged.processors.index.vocabulary import token_bytes_map
from tests.processors.family_tokenizers import FAMILIES, qwen_like, t5_like

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "n": {"type": "number"},
        "k": {"enum": ["中文", "café", 3]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}
REGEX = r"(é|中|😀|[a-c]){1,3}-[0-9]{2}"
CHOICES = ["café", "中文", "😀 ok", "no"]
LARK = r"""
start: pair ("," pair)*
pair: KEY "=" VAL
KEY: /[a-cé]{1,3}/
VAL: /[0-9]{1,2}/ | "中" | "\"" /[a-z ]{0,3}/ "\""
"""
_PARSER = lark.Lark(LARK, parser="earley", lexer="dynamic_complete")
VALID = {
    "schema": [
        '{"name": "café", "n": -1.5e3}',
        '{"name": "中😀", "n": 0, "k": "中文"}',
        '{"name":"a\\nb","n":2,"k":3,"tags":["x","é"]}',
    ],
    "regex": ["é中-12", "😀a-00", "abc-99"],
    "choice": CHOICES,
    "lark": ["a=1", 'é=中,b="x y"', "ab=12"],
}


def make(kind: str, tok, **kwargs):
    if kind == "schema":
        return JSONSchemaLogitsProcessor(SCHEMA, tok, **kwargs)
    if kind == "regex":
        return RegexLogitsProcessor(REGEX, tok, **kwargs)
    if kind == "choice":
        return ChoiceLogitsProcessor(CHOICES, tok, **kwargs)
    return GrammarLogitsProcessor(LARK, tok, **kwargs)


def accepts(kind: str, text: str) -> bool:
    try:
        if kind == "schema":
            jsonschema.validate(json.loads(text), SCHEMA)
        elif kind == "regex":
            return re.fullmatch(REGEX, text) is not None
        elif kind == "choice":
            return text in CHOICES
        else:
            _PARSER.parse(text)
    except (ValueError, jsonschema.ValidationError, lark.exceptions.LarkError):
        return False
    return True


def allowed_ids(proc, request_id: str, generated: list[int], width: int) -> list[int]:
    scores = torch.zeros(1, width)
    proc.process_rows([request_id], [generated], scores)
    return torch.isfinite(scores[0]).nonzero().flatten().tolist()


def decoded_after_prompt(tok, generated: list[int]) -> str:
    """The generated text as it reads after a prompt (no dummy-prefix space dropped at its start)."""
    prompt = tok("hi there", add_special_tokens=False)["input_ids"]
    full, head = tok.decode(prompt + generated), tok.decode(prompt)
    assert full.startswith(head)
    return full[len(head) :]


@pytest.mark.parametrize("kind", ["schema", "regex", "choice", "lark"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_walks_decode_to_accepted_text(family, kind):
    tok = FAMILIES[family]()
    mapping, special, _ = token_bytes_map(tok)
    proc = make(kind, tok)
    eos = set(proc.vocab.eos_token_ids)
    width = len(tok) + 5  # padded embedding rows: never allowed
    rng = random.Random(0)
    finished = 0
    for walk in range(15):
        request_id, generated = f"walk-{walk}", []
        for _ in range(200):
            allowed = allowed_ids(proc, request_id, generated, width)
            assert allowed and max(allowed) < len(tok)
            assert not (set(allowed) & special) - eos  # special tokens: only EOS, ever
            ends = [t for t in allowed if t in eos]
            if ends and (rng.random() < 0.5 or len(ends) == len(allowed)):
                break
            generated.append(rng.choice([t for t in allowed if t not in eos]))
        else:
            continue
        if proc.error(request_id) is not None:  # a dead end of a vocabulary without byte fallback (t5_like)
            assert family == "t5_like"
            continue
        raw = b"".join(mapping[t] for t in generated)
        text = raw.decode("utf-8")  # whole characters even when byte tokens split them
        assert accepts(kind, text), (family, kind, text)
        assert decoded_after_prompt(tok, generated) == text
        finished += 1
        proc.release(request_id)
    assert finished >= 10


def segmentations(tok, text: str, mapping: dict[int, bytes]) -> dict[str, list[int]]:
    """The tokenizer's own encoding (without the dummy-prefix piece), one piece per character where the vocabulary
    has it, and one byte token per byte where it has them all."""
    own = tok(text, add_special_tokens=False)["input_ids"]
    if own and mapping.get(own[0]) == b" ":
        own = own[1:]
    segs = {"own": own}
    vocab = tok.get_vocab()
    if all(c in vocab and vocab[c] in mapping for c in text):
        segs["chars"] = [vocab[c] for c in text]
    singles = {raw[0]: i for i, raw in sorted(mapping.items(), reverse=True) if len(raw) == 1}
    if all(b in singles for b in text.encode()):
        segs["bytes"] = [singles[b] for b in text.encode()]
    return segs


@pytest.mark.parametrize("kind", ["schema", "regex", "choice", "lark"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_valid_texts_are_allowed_with_eos_exactly_at_their_end(family, kind):
    tok = FAMILIES[family]()
    mapping, _, _ = token_bytes_map(tok)
    proc = make(kind, tok)
    eos = proc.vocab.eos_token_ids[0]
    checked = 0
    for text in VALID[kind]:
        if family == "t5_like" and "\\" in text:
            continue  # (t5_like cannot spell a backslash)
        for name, ids in segmentations(tok, text, mapping).items():
            if b"".join(mapping.get(i, b"\0") for i in ids) != text.encode():
                continue  # an <unk>, or a dummy-prefix space merged into the first piece (llama_like: "▁{")
            request_id = f"{text}-{name}"
            for k, token in enumerate(ids):
                assert proc.allows(request_id, ids[:k], token), (family, text, name, k)
                complete = accepts(kind, b"".join(mapping[i] for i in ids[:k]).decode("utf-8", "replace"))
                assert proc.allows(request_id, ids[:k], eos) == (k > 0 and complete), (family, text, name, k)
            assert proc.allows(request_id, ids, eos)
            proc.release(request_id)
            checked += 1
    assert checked >= len(VALID[kind]) - (family == "t5_like" and kind == "schema")


def test_added_tokens_read_as_the_decoder_reads_them():
    """A byte-level decoder turns an added token's content into bytes like any token's: "ĠX" reads " X", and "é"
    (a byte-level character: the lone byte 0xE9) reads as that byte. Both were taken as their literal UTF-8, so
    " X" could not use its token and "é" allowed a token that decodes to U+FFFD."""
    tok = qwen_like.__wrapped__()  # a fresh one: tokens are added to it
    tok.add_tokens([AddedToken("ĠX", special=False, normalized=False), AddedToken("é", special=False)])
    space_x, lone_e9 = tok.convert_tokens_to_ids(["ĠX", "é"])
    mapping, _, _ = token_bytes_map(tok)
    assert mapping[space_x] == b" X" and tok.decode([space_x]) == " X"
    assert mapping[lone_e9] == b"\xe9" and tok.decode([lone_e9]) == "\ufffd"
    assert mapping[tok.convert_tokens_to_ids("\n\n")] == b"\n\n"  # contents the decoder cannot read: their UTF-8
    assert mapping[tok.convert_tokens_to_ids("<tool>")] == b"<tool>"
    proc = ChoiceLogitsProcessor([" X", "é"], tok)
    first = allowed_ids(proc, "r", [], len(tok))
    assert space_x in first and lone_e9 not in first
    assert proc.allows("r", [space_x], tok.eos_token_id)


def test_specials_are_never_text_and_added_normal_tokens_are():
    tok = qwen_like()
    start, end, tool = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<tool>"])
    proc = ChoiceLogitsProcessor(["<|im_start|>", "<tool>"], tok)
    first = allowed_ids(proc, "r", [], len(tok))
    assert tool in first and start not in first  # the special token is no text; its characters are
    spelled = tok("<|im_start|>", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert start not in spelled and all(proc.allows("r", spelled[:k], t) for k, t in enumerate(spelled))
    # several EOS ids (a generation config's list): each allowed exactly where the text is complete
    multi = RegexLogitsProcessor("ab", tok, eos_token_id=[tok.eos_token_id, end])
    ab = tok("ab", add_special_tokens=False)["input_ids"]
    assert not set(allowed_ids(multi, "m", [], len(tok))) & {tok.eos_token_id, end}
    assert set(allowed_ids(multi, "m", ab, len(tok))) == {tok.eos_token_id, end}
    assert set(allowed_ids(multi, "m", [*ab, end], len(tok))) == {tok.eos_token_id, end}  # ended: EOS only


def test_a_tokenizer_whose_decode_cleans_up_spaces_is_named(caplog):
    """A Unigram tokenizer with `clean_up_tokenization_spaces=True` decodes `a .` as `a.`: the processors match the
    former, so building one says how to decode (BPE ones are not named: transformers 5 ignores the option there)."""
    tok = t5_like.__wrapped__()
    tok.clean_up_tokenization_spaces = True
    ids = tok("a .", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "a." and tok.decode(ids, clean_up_tokenization_spaces=False) == "a ."
    bpe = qwen_like.__wrapped__()
    bpe.clean_up_tokenization_spaces = True
    with caplog.at_level("WARNING", logger="hf_paged.processors.index.vocabulary"):
        RegexLogitsProcessor("a .", tok)
        RegexLogitsProcessor("a .", bpe)
    assert len(caplog.records) == 1 and "clean_up_tokenization_spaces=False" in caplog.records[0].getMessage()


def test_logits_narrower_than_the_vocabulary_are_refused():
    """A model whose lm_head has fewer rows than the tokenizer's ids (tokens added without resizing): the ids past
    its width were silently dropped (a mask allowing only those left a row of -inf)."""
    tok = qwen_like()
    proc = ChoiceLogitsProcessor(["<tool>"], tok)
    with pytest.raises(TokenizerError, match=r"304.*resize_token_embeddings"):
        proc(torch.tensor([[1, 2]]), torch.zeros(1, len(tok) - 2))
    with pytest.raises(TokenizerError, match="columns"):
        proc.process_rows(["r"], [[]], torch.zeros(1, 100))
    # special ids past the width are never allowed: no column needed for them
    t5 = t5_like()
    assert proc.vocab.min_logits_width == len(tok)
    wide = torch.zeros(1, len(tok) + 30)
    proc.reset()
    proc(torch.tensor([[1, 2]]), wide)
    allowed = torch.isfinite(wide[0]).nonzero().flatten().tolist()
    assert tok.convert_tokens_to_ids("<tool>") in allowed and max(allowed) < len(tok)  # "<" too: its spelling
    assert RegexLogitsProcessor("ab", t5).vocab.min_logits_width == len(t5)
    padded = qwen_like.__wrapped__()  # a special token added past a model's rows: never allowed, so never needed
    padded.add_special_tokens({"additional_special_tokens": ["<|pad|>"]})
    choice = ChoiceLogitsProcessor(["ab"], padded)
    assert choice.vocab.min_logits_width == len(padded) - 1
    narrow = torch.zeros(1, len(padded) - 1)
    choice(torch.tensor([[1, 2]]), narrow)
    assert torch.isfinite(narrow[0]).any()


def test_a_byte_no_token_holds_is_cut_from_the_automaton():
    """`"a\\"b"` needs a backslash after `"a`, which t5_like has in no token: `a` was allowed after `"` and the row
    was stuck there (a mask of -inf: greedy took token 0, `<pad>`; sampling drew from NaN). Now `a` is refused."""
    tok = t5_like()
    proc = JSONSchemaLogitsProcessor({"enum": ['a"b', "c"]}, tok)
    quote, c = tok.convert_tokens_to_ids(['"', "c"])
    assert set(allowed_ids(proc, "r", [quote], len(tok))) == {c}
    assert proc.allows("r", [quote, c, quote], tok.eos_token_id)
    with pytest.raises(UnsatisfiableSchemaError, match=r"no token of this one holds .* \(0x5c\)"):
        _ = RegexLogitsProcessor(r"a\\b", tok).compiled  # (compiled on first use)


def test_a_dead_end_of_the_vocabulary_ends_the_document():
    """`b` is in the vocabulary only inside `xb`, so after `a` nothing spells the rest of `ab`: the row's mask was all
    -inf. Now only EOS is allowed there and `error` says why."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("a", -1.0), ("c", -1.0), ("xb", -2.0)]
    raw = Tokenizer(models.Unigram(pieces, unk_id=2))
    raw.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    proc = RegexLogitsProcessor("ab|c", tok)
    assert set(allowed_ids(proc, "r", [], len(tok))) == {3, 4}
    scores = torch.zeros(1, len(tok))
    proc.process_rows(["r"], [[3]], scores)
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [tok.eos_token_id]
    assert "no token of the vocabulary" in proc.error("r") and not proc.is_complete("r")
    # stock generate's path, and the resample path (`allows`), agree
    rows = torch.zeros(1, len(tok) + 4)
    proc(torch.tensor([[5, 4]]), torch.zeros(1, len(tok) + 4))
    proc(torch.tensor([[5, 4, 3]]), rows)
    assert torch.isfinite(rows[0]).nonzero().flatten().tolist() == [tok.eos_token_id]
    assert proc.allows("s", [3], tok.eos_token_id) and not proc.allows("s", [3], 5)


def test_a_character_split_over_byte_tokens_is_finished_before_anything_else():
    """llama_like spells 中 as <0xE4><0xB8><0xAD> when it likes: after a lead byte only continuation bytes may come
    (never EOS, never a token starting with another lead byte or ASCII)."""
    tok = FAMILIES["llama_like"]()
    mapping, _, _ = token_bytes_map(tok)
    proc = RegexLogitsProcessor("(中|é)+", tok)
    lead, middle = tok.convert_tokens_to_ids(["<0xE4>", "<0xB8>"])
    for generated in ([lead], [lead, middle]):
        allowed = allowed_ids(proc, "r", generated, len(tok))
        assert allowed and all(0x80 <= mapping[t][0] < 0xC0 for t in allowed)
    assert proc.allows("r", [lead, middle, tok.convert_tokens_to_ids("<0xAD>")], tok.eos_token_id)


def test_empty_and_duplicate_pieces():
    """An empty piece is never allowed (it would never move the automaton); two pieces of the same bytes (`a` and
    its byte-fallback `<0x61>`) are both allowed wherever one is."""
    vocab = {"<unk>": 0, "</s>": 1, "": 2, "a": 3, "b": 4, "ab": 5, "▁a": 6, "<0x61>": 7}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], byte_fallback=True, unk_token="<unk>"))
    raw.add_special_tokens(["<unk>", "</s>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>")
    proc = RegexLogitsProcessor("ab|a", tok)
    assert allowed_ids(proc, "r", [], 8) == [3, 5, 7]
    assert allowed_ids(proc, "r", [7], 8) == [1, 4]


def tiny_llama(tok, num_padded_rows: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok) + num_padded_rows,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(
    ("family", "kind", "num_padded_rows"),
    [
        ("llama_like", "schema", 0),
        ("llama_like", "regex", 9),
        ("qwen_like", "schema", 11),
        ("qwen_like", "choice", 0),
        ("t5_like", "regex", 5),
    ],
)
def test_generate_on_a_llama_of_the_tokenizer(family, kind, num_padded_rows):
    """Three left-padded rows, stock and wrapped `generate`: greedy outputs token-identical, sampled (stock) ones
    accepted; no padded row is ever produced."""
    import hf_paged

    tok = FAMILIES[family]()
    batch = {"input_ids": torch.tensor([[tok.eos_token_id, 7, 8, 9], [10, 11, 12, 13], [tok.eos_token_id] * 3 + [14]])}
    batch["attention_mask"] = (torch.arange(4) >= torch.tensor([[1], [0], [3]])).long()
    model = tiny_llama(tok, num_padded_rows)
    outputs = {}
    for mode in ("greedy", "sampled", "wrapped"):
        if mode == "wrapped":
            hf_paged.wrap(model)
        torch.manual_seed(0)
        try:
            out = model.generate(
                **batch,
                logits_processor=[make(kind, tok)],
                max_new_tokens=48,
                do_sample=mode == "sampled",
                top_k=0,
                pad_token_id=tok.eos_token_id,
            )
        finally:
            if mode == "wrapped":
                hf_paged.unwrap(model)
        outputs[mode] = out[:, 4:].tolist()
    assert outputs["greedy"] == outputs["wrapped"]
    finished = 0
    for row in outputs["greedy"] + outputs["sampled"]:
        assert max(row) < len(tok)
        if tok.eos_token_id in row:
            text = tok.decode(row[: row.index(tok.eos_token_id)])
            assert accepts(kind, text), (family, kind, text)
            finished += 1
    assert finished >= 3
