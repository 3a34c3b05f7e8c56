"""Programs on the engine: greedy `gen` equals stock greedy `generate`, `select` equals stock log-probabilities,
forks share blocks and run together, a program that raises frees everything, `run_batch` equals one by one."""

from __future__ import annotations

import time

import pytest
import torch

from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of


def _stock_greedy(model, tok, ids: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.eos_token_id)
    new = out[0, len(ids):].tolist()
    return new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new


def _stock_logprob(model, context: list[int], choice: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([context + choice[:-1]])).logits[0].float()
    rows = torch.log_softmax(logits, -1)[len(context) - 1:]
    return rows.gather(1, torch.tensor(choice)[:, None]).sum().item()


@hp.program
def two_fields(s, topic):
    s += "Topic: " + topic + "\nFirst: " + hp.gen("first", max_tokens=12)
    s += "\nSecond: " + hp.gen("second", max_tokens=12)


def test_greedy_gen_equals_stock_generate_on_the_same_text(model_tok):
    model, tok = model_tok
    state = two_fields.run(model, tok, topic="paged attention for everyone")
    first_prompt = tok("Topic: paged attention for everyone\nFirst: ")["input_ids"]
    first = _stock_greedy(model, tok, first_prompt, 12)
    second_prompt = first_prompt + first + tok("\nSecond: ")["input_ids"]  # the text as the program wrote it
    second = _stock_greedy(model, tok, second_prompt, 12)
    assert state.token_ids == second_prompt + second
    assert state["first"] == tok.decode(first) and state["second"] == tok.decode(second)
    assert state.text == "Topic: paged attention for everyone\nFirst: " + state["first"] + "\nSecond: " + \
        state["second"]
    first, second = state.calls
    assert first.kind == second.kind == "gen" and first.finish_reason == "length"
    assert second.tokens.cached >= 40  # the text before it was not computed again (pinned prefix, full blocks)
    assert second.tokens.prefilled < 8 + len("\nSecond: ") + 1


def test_select_equals_brute_force_stock_log_probabilities(model_tok):
    model, tok = model_tok
    g = torch.Generator().manual_seed(3)
    words = ["yes", "no", "maybe", "billing", "complaint", "other", "a", "zebra crossing"]

    @hp.program
    def pick(s, context, choices, normalize):
        s += context + hp.select("pick", choices, normalize=normalize)

    for case in range(8):
        context = f"Case {case}: {'x' * int(torch.randint(1, 30, (1,), generator=g))}? "
        choices = [words[i] for i in torch.randperm(len(words), generator=g)[:3].tolist()]
        normalize = "mean" if case % 2 else "sum"
        state = pick.run(model, tok, context=context, choices=choices, normalize=normalize)
        record = state.calls[0]
        ctx = tok(context)["input_ids"]
        for choice in choices:
            ids = tok(choice, add_special_tokens=False)["input_ids"]
            expected = _stock_logprob(model, ctx, ids) / (len(ids) if normalize == "mean" else 1)
            assert record.scores[choice] == pytest.approx(expected, abs=1e-4)
        best = max(choices, key=lambda c: record.scores[c])
        assert state["pick"] == best and state.text == context + best


def test_select_ties_go_to_the_first_choice(model_tok):
    model, tok = model_tok

    @hp.program
    def pick(s):
        s += "Pick one: " + hp.select("pick", ["same", "other", "same!"])

    state = pick.run(model, tok)
    scores = state.calls[0].scores
    assert state["pick"] == max(scores, key=scores.get)  # max() keeps the first of equal keys, as select does


def test_forks_share_the_prefix_blocks_and_run_in_the_same_steps(model_tok, monkeypatch):
    model, tok = model_tok
    engine = engine_of(model)
    snapshots = []
    engine.add_step_listener(lambda _: snapshots.append({rid: list(seq.block_ids)
                                                          for rid, seq in engine.kv.seqs.items()}))
    # Each fork submits from its own thread: on a loaded machine one fork's 10 tokens could all run before the next
    # fork's thread submitted (1 run in 12 failed). The forks' first step waits (bounded) until all three are
    # submitted, so they run together whatever the threads' timing.
    gate = _StepGate(engine, monkeypatch)

    @hp.program
    def branches(s):
        s += "A long shared prefix that fills several blocks of eight tokens. " + hp.gen("head", max_tokens=3)
        forks = s.fork(3)  # (the head has ended here)
        gate.wait_for(3)
        for f in forks:
            f += " Option: " + hp.gen("option", max_tokens=10)

    state = branches.run(model, tok)
    assert len(state["option"]) == 3 and len(state.forks) == 3
    assert gate.waited == [3]
    # every fork's table starts with the same 8 blocks (64 tokens of prefix: the same physical blocks, shared)
    first_tables = {}
    for tables in snapshots:
        for rid, table in tables.items():
            first_tables.setdefault(rid, table)
    forks = [t for t in first_tables.values() if len(t) > 8]
    assert len(forks) == 3 and len(_common_prefix(forks)) >= 8
    # and they ran batched: all three in one step
    together = max((len(tables) for tables in snapshots), default=0)
    assert together == 3
    assert state.tokens().cached >= 3 * 64


class _StepGate:
    """Holds the next engine step, once armed, until `n` requests of the loop's callers are in flight (submitted
    and not ended), at most 60 s; `waited` records how many there were."""

    def __init__(self, engine, monkeypatch) -> None:
        self.engine, self.n, self.waited = engine, 0, []
        step = engine.step

        def gated(*args, **kwargs):
            if self.n:
                deadline = time.monotonic() + 60
                while engine.loop.num_in_flight < self.n and time.monotonic() < deadline:
                    time.sleep(0.005)
                self.waited.append(engine.loop.num_in_flight)
                self.n = 0
            return step(*args, **kwargs)

        monkeypatch.setattr(engine, "step", gated)

    def wait_for(self, n: int) -> None:
        self.n = n


def _common_prefix(tables: list[list[int]]) -> list[int]:
    common = tables[0]
    for table in tables[1:]:
        n = 0
        while n < min(len(common), len(table)) and common[n] == table[n]:
            n += 1
        common = common[:n]
    return common


def test_a_program_that_raises_aborts_its_requests_and_frees_its_blocks(model_tok):
    model, tok = model_tok
    engine = engine_of(model)

    @hp.program
    def broken(s):
        s += "Some prefix text for the forks. " + hp.gen("head", max_tokens=2)
        for f in s.fork(2):
            f += hp.gen("long", max_tokens=300)
        raise RuntimeError("the program failed mid-way")

    before = engine.metrics.num_generated_tokens
    with pytest.raises(RuntimeError, match="mid-way"):
        broken.run(model, tok)
    engine.check_integrity()
    assert not engine.live_requests() and engine.cache.pool.num_used_blocks == 0
    assert engine.metrics.num_generated_tokens - before < 2 + 2 * 300  # the long gens were cut off


def test_a_failing_call_names_its_field_and_frees_everything(model_tok):
    model, tok = model_tok

    def refuse(value):
        raise KeyError("no such thing")

    @hp.program
    def bad(s):
        s += "Hi " + hp.gen("greeting", max_tokens=3, validator=refuse, max_retries=1)
        s += hp.gen("never", max_tokens=3)

    with pytest.raises(hp.ValidatorError, match="'greeting'") as info:
        bad.run(model, tok)
    assert isinstance(info.value.__cause__, KeyError)


def test_run_batch_equals_runs_one_by_one(model_tok):
    model, tok = model_tok
    topics = ["cats", "dogs and birds", "the weather today", "KV caches", "x", "continuous batching"]
    one_by_one = [two_fields.run(model, tok, topic=t).text for t in topics]
    states = two_fields.run_batch(model, tok, [{"topic": t} for t in topics])
    assert [s.text for s in states] == one_by_one
    hits = sum(s.tokens().cached for s in states) / sum(s.tokens().prompt for s in states)
    assert hits > 0.3


def test_gen_stop_strings_and_constraints(model_tok):
    model, tok = model_tok

    @hp.program
    def shaped(s):
        s += "Number: " + hp.gen("n", regex=r"[0-9]{3}", max_tokens=5)
        s += "\nPet: " + hp.gen("pet", choices=["cat", "dog"])
        s += "\nFree: " + hp.gen("free", max_tokens=30, stop=["e", "a"])

    state = shaped.run(model, tok)
    assert state["n"].isdigit() and len(state["n"]) == 3
    assert state["pet"] in ("cat", "dog")
    assert "e" not in state["free"] and "a" not in state["free"]
    assert state.text.endswith("\nFree: " + state["free"])


def test_program_misuse_raises_typed_errors(model_tok):
    model, tok = model_tok
    with pytest.raises(TypeError, match=r"two_fields.run\(model, tokenizer"):
        two_fields(None, topic="x")
    with pytest.raises(TypeError, match="one mapping"):
        two_fields.run_batch(model, tok, ["cats"])
    with pytest.raises(hp.FieldConstraintError, match="one constraint"):
        hp.gen("x", regex="a", choices=["a"])
    with pytest.raises(hp.FieldConstraintError, match="non-empty list"):
        hp.select("x", [])
    with pytest.raises(hp.FieldConstraintError, match="max_tokens"):
        hp.gen("x", max_tokens=0)
    with pytest.raises(hp.FieldConstraintError, match="without a validator"):
        hp.gen("x", max_retries=2)
    with pytest.raises(ValueError, match="does not compile|regex"):
        hp.gen("x", regex="(unclosed")

    @hp.program
    def adds_a_number(s):
        s += 5

    with pytest.raises(TypeError, match="str"):
        adds_a_number.run(model, tok)


def test_run_batch_keeps_going_when_one_instance_raises(model_tok):
    model, tok = model_tok

    @hp.program
    def maybe_fails(s, n):
        s += f"Item {n}: " + hp.gen("x", max_tokens=6)
        if n == 2:
            raise ValueError("instance 2 refuses")
        s += " then " + hp.gen("y", max_tokens=6)

    results = maybe_fails.run_batch(model, tok, [{"n": n} for n in range(5)], raise_errors=False)
    assert isinstance(results[2], ValueError)
    assert all(isinstance(r, hp.ProgramState) and "y" in r for i, r in enumerate(results) if i != 2)
    with pytest.raises(ValueError, match="instance 2 refuses") as info:
        maybe_fails.run_batch(model, tok, [{"n": n} for n in range(4)])
    assert any("run_batch instance 2" in note for note in info.value.__notes__)


def test_a_state_takes_no_calls_after_its_program_returned(model_tok):
    model, tok = model_tok

    @hp.program
    def short(s):
        s += "Hello " + hp.gen("x", max_tokens=2)

    state = short.run(model, tok)
    with pytest.raises(hp.ProgramError, match="has returned"):
        state += hp.gen("late", max_tokens=2)


def test_gen_with_a_schema_or_a_grammar(model_tok):
    model, tok = model_tok
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}

    @hp.program
    def structured(s):
        s += "Doc: " + hp.gen("doc", schema=schema, max_tokens=16)
        s += "\nExpr: " + hp.gen("expr", grammar='start: "(" start ")" | "x"', max_tokens=9)

    state = structured.run(model, tok)
    assert state["doc"] in ({"ok": True}, {"ok": False})  # a schema field's value is the parsed document
    expr = state["expr"]
    if state.calls[1].valid:
        assert expr == "(" * expr.count("(") + "x" + ")" * expr.count("(")
    else:  # cut short by max_tokens inside the nesting: recorded as incomplete
        assert state.calls[1].finish_reason == "length_incomplete"


def test_a_field_of_a_fork_of_a_fork_reads_from_the_root(model_tok):
    """`st["b"]` raised KeyError for a field set two forks down, and its message listed no fork field."""
    model, tok = model_tok

    @hp.program
    def nested(s):
        s += "Q:"
        for f in s.fork(2):
            f += hp.gen("a", max_tokens=2)
            for g in f.fork(2):
                g += hp.gen("b", max_tokens=2)

    state = nested.run(model, tok)
    assert len(state["a"]) == 2 and [len(inner) for inner in state["b"]] == [2, 2]
    assert all(isinstance(v, str) for inner in state["b"] for v in inner)
    with pytest.raises(KeyError, match=r"fields so far: \['a', 'b'\]"):
        state["zz"]


@pytest.mark.parametrize("regex", [r"[0-9]{10}", r"[a-z ]{20}"])
def test_a_constrained_field_cut_short_keeps_max_tokens(model_tok, regex):
    """A constrained field is asked for one token more than `max_tokens` (room for EOS or its literal's first
    token); when the value itself was not closed, that spare token ended up in the value."""
    model, tok = model_tok

    @hp.program
    def short(s):
        s += "x = " + hp.gen("v", max_tokens=3, regex=regex)

    record = short.run(model, tok).calls[0]
    assert len(tok(record.value, add_special_tokens=False).input_ids) <= 3
    assert record.finish_reason == "length_incomplete" and record.valid is False
