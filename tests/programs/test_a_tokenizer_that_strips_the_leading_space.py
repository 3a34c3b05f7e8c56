"""Field text is the tokens' text as a continuation, also for a Llama-2-style SentencePiece tokenizer whose decoder
strips the leading space of what it decodes (`Strip(" ", 1, 0)`): decoding a field's tokens alone dropped the space
of its first token ("▁billing" -> "billing"), so `s.text` ('Int:billing') disagreed with the tokens ('Int:
billing'), and token healing after a trailing space never ran (the lone "▁" decoded to ""). The same tokenizer
prepends "▁" to whatever it encodes (`Prepend` normalizer): text appended between two calls was encoded with a
space it does not have ("\nbill:" as "▁\nbill:"), so the model read 'Int: billing \nbill:'."""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import hf_paged
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from hf_paged.programs.connect import backend_for
from hf_paged.programs.healing import heal_prompt

PIECES = ["▁", "a", "b", "e", "i", "l", "n", "g", ":", "I", "t", "▁b", "bi", "▁bi", "ll", "▁bill", "in", "ing",
          "▁billing", "▁I", "nt", "▁Int"]
MERGES = [("▁", "b"), ("b", "i"), ("▁b", "i"), ("l", "l"), ("▁bi", "ll"), ("i", "n"), ("in", "g"),
          ("▁bill", "ing"), ("▁", "I"), ("n", "t"), ("▁I", "nt")]


def _llama2_like_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in PIECES:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])  # as Llama 2's tokenizer.json
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>", unk_token="<unk>")


def _model_preferring(tok, text: str, token: str):
    """A tiny random Llama whose first choice after `text` is `token`."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, eos_token_id=2, pad_token_id=2,
                                         bos_token_id=1)).eval()
    model.generation_config.eos_token_id = 2
    prompt = tok(text)["input_ids"]
    with torch.no_grad():
        hidden = model.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        model.lm_head.weight[tok.convert_tokens_to_ids(token)] = 50 * hidden / hidden.norm()
    return hf_paged.wrap(model, block_size=8, num_blocks=64)


def test_a_field_keeps_the_leading_space_its_first_token_carries():
    tok = _llama2_like_tokenizer()
    assert tok.decode(tok.convert_tokens_to_ids(["▁billing"])) == "billing"  # the decoder strips it alone
    model = _model_preferring(tok, "Int:", "▁billing")

    @hp.program
    def intent(s):
        s += "Int:" + hp.gen("intent", max_tokens=1)

    state = intent.run(model, tok)
    assert tok.convert_ids_to_tokens(state.token_ids) == ["▁Int", ":", "▁billing"]
    assert state["intent"] == " billing"
    assert state.text == "Int: billing" == tok.decode(state.token_ids, skip_special_tokens=True)
    engine = engine_of(model)
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0
    hf_paged.unwrap(model)


def test_healing_backs_up_a_trailing_space():
    tok = _llama2_like_tokenizer()
    model = _model_preferring(tok, "Int:", "▁billing")
    prompt = tok("Int: ")["input_ids"]
    assert tok.convert_ids_to_tokens(prompt)[-1] == "▁"
    healing = heal_prompt(backend_for(model, tok), prompt)
    assert healing is not None and healing.lead == " "
    assert tok.convert_tokens_to_ids("▁billing") in healing.processor.allowed.nonzero().flatten().tolist()

    @hp.program
    def intent(s):
        s += "Int: " + hp.gen("intent", max_tokens=1, heal=True)

    state = intent.run(model, tok)
    assert tok.convert_ids_to_tokens(state.token_ids) == ["▁Int", ":", "▁billing"]  # the space re-grown
    assert state["intent"] == "billing" and state.text == "Int: billing"
    hf_paged.unwrap(model)


def test_text_between_calls_gets_no_space_it_does_not_have():
    tok = _llama2_like_tokenizer()
    assert tok.convert_ids_to_tokens(tok("b", add_special_tokens=False)["input_ids"]) == ["▁b"]  # prepends
    model = _model_preferring(tok, "Int:", "▁billing")

    @hp.program
    def two(s):
        s += "Int:" + hp.gen("a", max_tokens=1)
        s += "\nbill:" + hp.gen("b", max_tokens=2)
        s += "b" + hp.select("c", ["billing", "bi"])

    state = two.run(model, tok)
    tokens = tok.convert_ids_to_tokens(state.token_ids)
    assert tokens[:8] == ["▁Int", ":", "▁billing", "<0x0A>", "bi", "ll", ":", "▁billing"]
    assert state.text == tok.decode(state.token_ids, skip_special_tokens=True)  # the text the model read
    assert state.text.startswith("Int: billing\nbill: billing")
    hf_paged.unwrap(model)
