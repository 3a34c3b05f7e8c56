"""wrap / unwrap / the patched generate: output shapes and options as stock, fallbacks, errors."""

import warnings

import pytest
import torch
from transformers import (
    GenerationConfig,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    NemotronConfig,
    NemotronForCausalLM,
    StableLmConfig,
    StableLmForCausalLM,
)

import hf_paged
from hf_paged import PagedCache, PagedConfig
from hf_paged.api.generate import PagedFallbackWarning
from hf_paged.batching.request import RequestStatus
from hf_paged.errors import (
    InvalidConfigError,
    InvalidPromptError,
    OutOfBlocksError,
    PromptTooLongError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


@pytest.fixture()
def model():
    return tiny_model("llama")


@pytest.fixture()
def batch():
    return left_pad(ragged_prompts([4, 11, 7], seed=9))


def test_wrap_is_same_object_idempotent_and_unwrap_restores(model):
    stock_generate = model.generate
    assert hf_paged.wrap(model) is model
    assert hf_paged.is_wrapped(model) and type(model).__name__ == "LlamaForCausalLM"
    engine = hf_paged.engine_of(model)
    assert hf_paged.wrap(model) is model and hf_paged.engine_of(model) is engine  # no-op
    with pytest.raises(ValueError, match="unwrap"):
        hf_paged.wrap(model, block_size=32)
    hf_paged.unwrap(model)
    assert "generate" not in model.__dict__ and model.generate == stock_generate
    assert not hf_paged.is_wrapped(model)
    with pytest.raises(ValueError, match="not wrapped"):
        hf_paged.engine_of(model)


def test_save_pretrained_unaffected(model, tmp_path):
    hf_paged.wrap(model)
    model.save_pretrained(tmp_path)
    config = (tmp_path / "config.json").read_text()
    assert "LlamaForCausalLM" in config and "hf_paged" not in config


def test_plain_forward_of_wrapped_model_keeps_stock_attention(model, batch):
    ids, mask = batch
    before = model(ids, attention_mask=mask).logits
    hf_paged.wrap(model)
    model.generate(ids, attention_mask=mask, max_new_tokens=3)
    after = model(ids, attention_mask=mask).logits
    assert torch.equal(before, after)
    assert model.config._attn_implementation == "sdpa"


def test_sampling_shapes_dtypes_and_dict_outputs(model, batch):
    ids, mask = batch
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=6, return_dict_in_generate=True,
                           output_scores=True, output_logits=True)
    hf_paged.wrap(model)
    sampled = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_p=0.9)
    assert sampled.shape == (3, ids.shape[1] + 6) and sampled.dtype == torch.long
    assert torch.equal(sampled[:, : ids.shape[1]], ids)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, return_dict_in_generate=True,
                         output_scores=True, output_logits=True)
    assert type(out) is type(stock)
    assert torch.equal(out.sequences, stock.sequences)
    assert len(out.scores) == len(stock.scores) == 6 and out.scores[0].shape == stock.scores[0].shape
    assert torch.allclose(torch.stack(out.scores), torch.stack(stock.scores), atol=1e-5)
    assert torch.allclose(torch.stack(out.logits), torch.stack(stock.logits), atol=1e-5)
    repeated = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, num_return_sequences=2)
    assert repeated.shape == (6, ids.shape[1] + 4)


def test_top_p_zero_keeps_the_most_likely_token_as_stock(model, batch):
    """`do_sample=True, top_p=0.0`: stock's TopPLogitsWarper keeps the most likely token alone (greedy); the engine
    refused it ("SamplingParams.top_p must be in (0, 1]")."""
    ids, mask = batch
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_p=0.0)
    assert torch.equal(stock, model.generate(ids, attention_mask=mask, max_new_tokens=6))
    hf_paged.wrap(model)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_p=0.0), stock)


def test_eos_and_pad_like_stock(model, batch):
    ids, mask = batch
    free = model.generate(ids, attention_mask=mask, max_new_tokens=8)
    eos = int(free[1, ids.shape[1] + 2])  # a token row 1 emits early
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=5)
    hf_paged.wrap(model)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=5)
    assert torch.equal(out, stock)


def test_streamer_receives_tokens(model):
    class Collect:
        def __init__(self):
            self.chunks = []
            self.ended = False

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.ended = True

    hf_paged.wrap(model)
    streamer = Collect()
    out = model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=5, streamer=streamer)
    assert streamer.ended and streamer.chunks[0] == [[3, 4, 5]]
    assert [c[0] for c in streamer.chunks[1:]] == out[0, 3:].tolist()


def test_an_assisted_streamer_gets_stock_shaped_chunks(model):
    """Stock's assisted decoding puts each accepted draft as one `[1, k]` tensor; the engine put one 1-D tensor per
    token (a streamer written for stock's shapes broke; found by a hostile pass, session 30)."""

    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value)

        def end(self):
            pass

    prompt = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 3, 4]])
    kwargs = dict(max_new_tokens=12, prompt_lookup_num_tokens=3)
    stock_streamer = Collect()
    stock = model.generate(prompt, streamer=stock_streamer, **kwargs)
    hf_paged.wrap(model)
    streamer = Collect()
    out = model.generate(prompt, streamer=streamer, **kwargs)
    assert torch.equal(out, stock)
    for collected in (stock_streamer, streamer):
        assert all(c.dim() == 2 and c.shape[0] == 1 for c in collected.chunks[1:])
        assert torch.cat(collected.chunks[1:], dim=1).tolist() == [out[0, prompt.shape[1]:].tolist()]
    hf_paged.unwrap(model)


def test_unsupported_modes_fall_back_with_one_warning(model, batch):
    ids, mask = batch
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=5, num_beams=2)
    hf_paged.wrap(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, num_beams=2)
    fallbacks = [w for w in caught if issubclass(w.category, PagedFallbackWarning)]
    assert len(fallbacks) == 1 and "beam search" in str(fallbacks[0].message)
    assert torch.equal(out, stock)


def test_synthid_watermarking_falls_back_and_generate_batch_refuses_it(model, batch):
    """SynthID's processor keeps one state for the batch (a context per row, advanced once a call): called once per
    row and step, it mixed the rows, and a batch of 2 came out with another watermark than stock's (found by a
    hostile pass, session 30)."""
    from transformers.generation.configuration_utils import SynthIDTextWatermarkingConfig

    ids, mask = batch
    config = SynthIDTextWatermarkingConfig(ngram_len=3, keys=[11, 22, 33, 44])
    sampled = dict(max_new_tokens=6, do_sample=True, watermarking_config=config)
    torch.manual_seed(0)
    stock = model.generate(ids, attention_mask=mask, **sampled)
    hf_paged.wrap(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        out = model.generate(ids, attention_mask=mask, **sampled)
    fallbacks = [w for w in caught if issubclass(w.category, PagedFallbackWarning)]
    assert len(fallbacks) == 1 and "SynthID" in str(fallbacks[0].message)
    assert torch.equal(out, stock)
    with pytest.raises(UnsupportedGenerationError, match="SynthID"):
        model.generate_batch([[3, 4, 5]], GenerationConfig(max_new_tokens=2, watermarking_config=config))
    hf_paged.unwrap(model)


def test_beam_search_through_paged_cache_argument(model, batch):
    ids, mask = batch
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3)
    cache = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=256))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3, cache=cache)
    assert torch.equal(out, stock)
    cache.check_integrity()


def test_errors_name_the_problem_and_the_setting(model, batch):
    ids, mask = batch
    cache = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=3))
    with pytest.raises(OutOfBlocksError, match=r"need \d+ blocks of 4 tokens, 3 of 3 free: raise PagedConfig.num_blocks"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, cache=cache)
    hf_paged.wrap(model, num_blocks=8, block_size=4)
    engine = hf_paged.engine_of(model)
    with pytest.raises(PromptTooLongError, match="maximum of 512 positions"):
        model.generate(torch.ones(1, 600, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(PromptTooLongError, match="raise PagedConfig.num_blocks"):
        model.generate(torch.ones(1, 40, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(InvalidPromptError, match=r"row 0: token ids \[500\] are outside the vocabulary"):
        model.generate(torch.tensor([[1, 500, 2]]), max_new_tokens=2)
    with pytest.raises(InvalidPromptError, match=r"token ids \[-3\]"):
        model.generate(torch.tensor([[1, -3, 2]]), max_new_tokens=2)
    with pytest.raises(InvalidPromptError, match="all padding"):
        model.generate(torch.tensor([[1, 2]]), attention_mask=torch.tensor([[0, 0]]), max_new_tokens=2)
    assert engine.stats()["steps"] == 0  # raised before any work
    hf_paged.unwrap(model)


@pytest.mark.parametrize(("overrides", "field"), [({"max_cache_bytes": 10**15}, "max_cache_bytes"),
                                                  ({"num_blocks": 10**12}, "num_blocks"),
                                                  ({"max_cache_bytes": 10**14, "kv_cache_dtype": "int8"},
                                                   "max_cache_bytes")])
def test_a_pool_beyond_the_machine_is_refused_up_front(model, overrides, field):
    asked = rf"PagedConfig.{field}=\d+ asks for \d+ bytes .* device has \d+ bytes"
    with pytest.raises(InvalidConfigError, match=asked):
        PagedCache(model.config, PagedConfig(**overrides))
    hf_paged.wrap(model, **overrides)  # nothing is allocated by wrap: the first generate refuses
    with pytest.raises(ValueError, match=rf"lower {field}"):  # a ValueError too
        model.generate(torch.tensor([[3, 4]]), max_new_tokens=1)


def test_unsupported_model_is_rejected_with_reason():
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=32))
    with pytest.raises(UnsupportedModelError, match="gpt_neox.*cache.update"):
        hf_paged.wrap(neox)
    with pytest.raises(TypeError, match="PagedConfig"):
        hf_paged.wrap(tiny_model("llama"), {"block_size": 16})


@pytest.mark.parametrize("config_class, model_class", [(StableLmConfig, StableLmForCausalLM),
                                                        (NemotronConfig, NemotronForCausalLM)])
def test_families_whose_layers_drop_the_attention_kwargs_are_refused_at_wrap(config_class, model_class):
    """Their decoder layers call self_attn without **kwargs: wrapped, every generate failed in the engine."""
    config = config_class(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, intermediate_size=32)
    with pytest.raises(UnsupportedModelError, match=f"{config.model_type}.*self_attn without"):
        hf_paged.wrap(model_class(config))


def test_wrap_errors_are_typed(model):
    with pytest.raises(UnsupportedModelError, match="got str; load it first"):
        hf_paged.wrap("my-org/my-model")
    with pytest.raises(InvalidConfigError, match="config must be a hf_paged.PagedConfig, got dict"):
        hf_paged.wrap(model, {"block_size": 16})
    with pytest.raises(InvalidConfigError, match=r"unknown PagedConfig field\(s\) \['blocksize'\] \(did you mean "
                                                 r"'blocksize' -> 'block_size'\?\)"):
        hf_paged.wrap(model, blocksize=16)
    with pytest.raises(TypeError):  # what it was before it was typed
        hf_paged.wrap(model, blocksize=16)
    with pytest.raises(ValueError, match="block_size must be a power of two"):  # PagedConfig's own check
        hf_paged.wrap(model, block_size=3)
    hf_paged.wrap(model, block_size=8)
    with pytest.raises(InvalidConfigError, match="already wrapped with a different PagedConfig"):
        hf_paged.wrap(model, block_size=32)


def test_rewrap_with_an_explicit_config_that_differs_is_refused(model):
    """`wrap(m, PagedConfig(block_size=16))` on a model wrapped with block_size=32 kept 32 silently: a config equal
    to the defaults was taken for no config at all."""
    hf_paged.wrap(model, block_size=32)
    with pytest.raises(InvalidConfigError, match=r"already wrapped with a different PagedConfig \(block_size: 32 -> "
                                                 r"16\); call hf_paged.unwrap\(model\) first"):
        hf_paged.wrap(model, PagedConfig(block_size=16))
    with pytest.raises(InvalidConfigError, match=r"\(block_size: 32 -> 16\)"):
        hf_paged.wrap(model, PagedConfig())  # explicit defaults differ too
    assert hf_paged.wrap(model) is model  # no config asked: the model keeps its settings
    assert hf_paged.wrap(model, PagedConfig(block_size=32)) is model  # the same settings
    assert hf_paged.engine_of(model).config.block_size == 32


def test_help_of_wrap_lists_what_it_raises():
    doc = hf_paged.wrap.__doc__
    raises = doc[doc.index("Raises:"):]
    for name in ("UnsupportedModelError", "InvalidConfigError", "ValueError, TypeError"):
        assert f"\n        {name}:" in raises


def test_generate_batch_refuses_ids_that_are_not_this_models(model):
    hf_paged.wrap(model, block_size=4, num_blocks=8)
    for inputs, message in [([[3, 4], [1, 500, 2]], r"input 1 of generate_batch: token ids \[500\] are outside"),
                            ([[1, -3, 2]], r"input 0 of generate_batch: token ids \[-3\] are outside"),
                            ([[3, 4], []], "input 1 of generate_batch: empty prompt"),
                            (["hello"], r"input 0 of generate_batch is not a list of token ids \(str\)"),
                            ([[1.5, 2]], r"not a list of token ids \(list\)")]:
        with pytest.raises(InvalidPromptError, match=message):
            model.generate_batch(inputs, max_new_tokens=2)
    assert hf_paged.engine_of(model).stats()["steps"] == 0  # raised before any work
    # valid ids of a prompt that cannot fit stay a per-request failure: the other requests run
    outs = model.generate_batch([torch.tensor([3, 4, 5]), [3] * 40], max_new_tokens=2)
    first, too_long = outs.values()
    assert first.status is RequestStatus.FINISHED and len(first.generated_tokens) == 2
    assert too_long.status is RequestStatus.FAILED and "raise PagedConfig.num_blocks" in too_long.error


def test_request_status_prints_its_name(model):
    hf_paged.wrap(model)
    out = model.generate_batch([[3, 4, 5]], max_new_tokens=2)["req_0"]
    assert str(out.status) == f"{out.status}" == "FINISHED"
    assert repr(out.status) == "RequestStatus.FINISHED" and "status=RequestStatus.FINISHED" in repr(out)
    assert out.status == 3 and out.status.is_finished  # still an IntEnum


def test_generate_names_the_rows_whose_constrained_document_was_cut_short():
    from hf_paged import IncompleteDocumentWarning, JSONSchemaLogitsProcessor
    from tests.batching.test_constrained_engine import SCHEMA, model_and_tokenizer

    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    ids = torch.tensor([tok("a pet: ")["input_ids"]] * 2)
    hf_paged.wrap(model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(ids, logits_processor=[proc], max_new_tokens=4, pad_token_id=tok.eos_token_id)
            cut = [str(w.message) for w in caught if issubclass(w.category, IncompleteDocumentWarning)]
            assert len(cut) == 1 and "row(s) [0, 1]" in cut[0] and "max_new_tokens=4" in cut[0]
            caught.clear()
            model.generate(ids, logits_processor=[proc], max_new_tokens=60, pad_token_id=tok.eos_token_id,
                           eos_token_id=tok.eos_token_id)
            assert not [w for w in caught if issubclass(w.category, IncompleteDocumentWarning)]
    finally:
        hf_paged.unwrap(model)


def test_a_deep_copy_after_generate_is_wrapped_with_its_own_engine():
    """TRL's reference models and EMA copies deep-copy the model: after a first generate that raised (an engine holds
    threads and locks)."""
    import copy

    model = hf_paged.wrap(tiny_model("llama"))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    expected = model.generate(ids, max_new_tokens=4, do_sample=False)
    twin = copy.deepcopy(model)
    assert hf_paged.is_wrapped(twin) and twin.generate.__self__ is twin
    assert torch.equal(twin.generate(ids, max_new_tokens=4, do_sample=False), expected)
    assert hf_paged.engine_of(twin) is not hf_paged.engine_of(model)
    hf_paged.unwrap(twin)
    assert "generate" not in twin.__dict__


def test_pickling_a_wrapped_model_says_what_to_save_instead():
    """It wrote a file that could never be loaded (before the first generate), or failed on a lambda (after)."""
    import io

    model = hf_paged.wrap(tiny_model("llama"))
    with pytest.raises(TypeError, match="state_dict"):
        torch.save(model, io.BytesIO())


def test_unwrap_while_another_thread_generates_says_so():
    import threading
    import time

    model = hf_paged.wrap(tiny_model("llama"))
    started, box = threading.Event(), {}

    class Slow:  # a streamer that says when the call is under way, and slows it down
        def put(self, value):
            started.set()
            time.sleep(0.01)

        def end(self):
            pass

    def worker():
        try:
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=200, do_sample=False, streamer=Slow())
        except Exception as exc:  # noqa: BLE001 -- handed to the test
            box["error"] = exc

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert started.wait(60)
    hf_paged.unwrap(model)
    thread.join(60)
    assert not thread.is_alive()
    assert "unwrapped" in str(box.get("error"))
