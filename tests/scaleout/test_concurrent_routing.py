"""Choices counted when they are made (book / confirm / move / unbook), exact ties at random, and a chat template's
constant start as no affinity: the policy, the Ray adapter (no cluster) and the gateway's probe of the template."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest
from tests.scaleout.test_ray_router import FakeId, FakeReplica

BS = 16
PREAMBLE = list(range(1, 25))  # 24 blocks every prompt starts with (the live check's template: 384 tokens)
SHARED_START = 376  # what the gateway finds for that template: 23 full blocks (the 24th differs for other chats)
PROMPT = 1308  # the live check's prompt: preamble + an 800-token system prompt + a question (82 blocks)


def prompt(system: int, question: int) -> list[int]:
    """Chained digests of the live check's prompt: the preamble, the system's 57 blocks, then the question's."""
    return [*PREAMBLE, *(system * 1000 + i for i in range(57)), system * 1000 + 100 + question]


def chat(rid, system: int, question: int, shared: int = SHARED_START) -> RouteRequest:
    return RouteRequest(rid, prompt(system, question), PROMPT, 8, num_shared_tokens=shared)


def two_replicas(seed: int = 0) -> CacheAwareRouter:
    router = CacheAwareRouter(RouterConfig(block_size=BS), seed=seed)
    router.add_replica("A")
    router.add_replica("B")
    return router


# -- policy ------------------------------------------------------------------------------------------------------
def test_four_concurrent_new_system_prompts_spread_two_and_two():
    router = two_replicas()
    chosen = []
    for system in range(4):  # all four chosen before any replica accepted one (no on_routed in between)
        request = chat(f"r{system}", system, 0)
        decision = router.route(request)
        router.book(request, decision.replica_ids[0])
        chosen.append((decision.replica_ids[0], decision.reason))
    assert chosen == [("B", RouteReason.NO_MATCH), ("A", RouteReason.LOW_GAIN),
                      ("B", RouteReason.LOW_GAIN), ("A", RouteReason.LOW_GAIN)]
    router.check_integrity()
    # Each system's next question follows its first: the booked (still unaccepted) blocks are affinity
    for system in range(4):
        decision = router.route(chat(f"q{system}", system, 1))
        assert (decision.replica_ids[0], decision.reason) == (chosen[system][0], RouteReason.AFFINITY)


def test_without_booking_concurrent_choices_do_not_see_each_other():
    router = two_replicas()
    # route() alone changes nothing but the draws: every new system prompt sees two idle replicas
    first = [router.route(chat(f"r{s}", s, 0)).reason for s in range(4)]
    assert first == [RouteReason.NO_MATCH] * 4
    assert router.load_of("A") == router.load_of("B") == 0


def test_exact_ties_go_to_a_random_replica_the_same_for_the_same_seed():
    def firsts(seed):
        router = two_replicas(seed)
        return [router.route(RouteRequest(i, (), 0)).replica_ids[0] for i in range(40)]

    assert set(firsts(0)) == {"A", "B"}  # not always the first known (the sort is stable)
    assert firsts(0) == firsts(0) and firsts(0) != firsts(1)


def test_a_template_preamble_is_no_affinity_from_the_first_request():
    router = two_replicas()
    router.report("A", keys=set(PREAMBLE), load_tokens=0)  # A served one chat: it holds the preamble, B nothing
    router.report("B", keys=set(), load_tokens=0)
    told = router.route(chat("r1", 1, 0))
    assert told.reason is RouteReason.LOW_GAIN and told.prefix_key is None
    # Not told the template's start, the preamble alone (29% of the prompt) counted as affinity: the old behaviour
    untold = router.route(chat("r2", 1, 0, shared=0))
    assert (untold.replica_ids[0], untold.reason) == ("A", RouteReason.AFFINITY)
    # A real match beyond the template's start is still affinity
    router.report("A", keys={*PREAMBLE, *prompt(1, 0)[:-1]}, load_tokens=0)
    deep = router.route(chat("r3", 1, 1))
    assert (deep.replica_ids[0], deep.reason) == ("A", RouteReason.AFFINITY)


def test_a_booking_confirmed_elsewhere_moves_there():
    router = two_replicas()
    request = chat("r", 0, 0)
    router.book(request, "A")
    assert router.route(chat("q", 0, 1)).replica_ids[0] == "A" and router.load_of("A") == PROMPT + 8
    router.on_routed(request, "B")  # Serve sent it to another rank (A was full)
    router.check_integrity()
    assert router.load_of("A") == 0 and router.load_of("B") == PROMPT + 8
    assert router.work_share("B") == 1.0
    follow = router.route(chat("q", 0, 1))
    assert (follow.replica_ids[0], follow.reason) == ("B", RouteReason.AFFINITY)
    router.on_finished("r")
    assert router.load_of("B") == 0
    router.check_integrity()


def test_unbook_undoes_a_choice_exactly():
    router = two_replicas()
    request = chat("r", 0, 0)
    router.book(request, "A")
    router.book(request, "B")  # chosen again (Serve asks again after every rank failed): moved, not doubled
    assert router.load_of("A") == 0 and router.load_of("B") == PROMPT + 8
    router.check_integrity()
    assert router.unbook("r") and not router.unbook("r")
    assert router.load_of("B") == 0 and router.mean_request_tokens == 0
    assert router.work_share("A") == router.work_share("B") == 0
    assert router.route(chat("q", 0, 1)).reason is RouteReason.NO_MATCH  # its blocks are no longer believed held
    router.book(request, "A")
    router.on_finished("r")  # ended before it was accepted: the same as unbook
    assert router.load_of("A") == 0 and router.route(chat("q", 0, 1)).reason is RouteReason.NO_MATCH
    router.check_integrity()


def test_a_confirmed_booking_is_not_undone_and_counts_once():
    router = two_replicas()
    request = chat("r", 0, 0)
    decision = router.route(request)
    router.book(request, "A")
    router.on_routed(request, "A", decision)
    router.on_routed(request, "A", decision)  # told twice
    assert not router.unbook("r") and router.load_of("A") == PROMPT + 8
    assert sum(router.num_routed.values()) == 1
    router.check_integrity()


def test_on_routed_alone_books_and_confirms_as_before():
    router = two_replicas()
    request = chat("r", 0, 0)
    router.on_routed(request, "B", router.route(request))
    assert router.load_of("B") == PROMPT + 8 and router.route(chat("q", 0, 1)).replica_ids[0] == "B"
    router.check_integrity()


def test_a_removed_replica_takes_its_bookings_along():
    router = two_replicas()
    router.book(chat("r", 0, 0), "A")
    router.remove_replica("A")
    router.check_integrity()
    assert not router.unbook("r")
    router.on_routed(chat("r", 0, 0), "A")  # accepted by a replica removed meanwhile: nothing to remember
    router.check_integrity()


# -- the Ray adapter -------------------------------------------------------------------------------------------


@dataclass
class FakeMeta:
    internal_request_id: str


@dataclass
class FakePending:
    metadata: FakeMeta
    kwargs: dict
    future: asyncio.Future


def adapter_and_replicas():
    pytest.importorskip("ray")
    from hf_paged.scaleout.ray_router import HfPagedRequestRouter

    router = object.__new__(HfPagedRequestRouter)  # no Serve controller: only the state our methods use
    router.initialize_state(block_size=BS)
    replicas = [FakeReplica(FakeId("A")), FakeReplica(FakeId("B"))]
    return router, replicas


def pending(loop, rid: str, system: int, question: int):
    from hf_paged.scaleout.prompt_key import RoutingInfo

    info = RoutingInfo(tuple(prompt(system, question)), PROMPT, 8, SHARED_START)
    return FakePending(FakeMeta(rid), {"routing": info}, loop.create_future())


def test_the_adapter_books_each_choice_so_concurrent_ones_spread():
    router, replicas = adapter_and_replicas()

    async def run():
        loop = asyncio.get_running_loop()
        requests = [pending(loop, f"r{s}", s, 0) for s in range(4)]
        ranks = [await router.choose_replicas(replicas, pr) for pr in requests]  # none accepted yet
        return requests, [rank[0][0].replica_id.unique_id for rank in ranks]

    requests, firsts = asyncio.run(run())
    assert sorted(firsts) == ["A", "A", "B", "B"]
    policy = router.policy
    policy.check_integrity()
    # r0 accepted where chosen; r1 went to the other rank (its first choice was full); r2 rejected; r3 cancelled
    other = {"A": "B", "B": "A"}
    router.on_request_routed(requests[0], FakeId(firsts[0]), None)
    router.on_request_routed(requests[1], FakeId(other[firsts[1]]), None)
    router.on_request_completed(FakeId(firsts[2]), "r2")
    requests[3].future.cancel()
    policy.check_integrity()
    assert "r2" not in policy._inflight and "r3" in policy._inflight  # a cancelled request is seen at the next choice

    async def choose_again():
        loop = asyncio.get_running_loop()
        return await router.choose_replicas(replicas, pending(loop, "r4", 0, 1))

    rank = asyncio.run(choose_again())
    assert "r3" not in policy._inflight and "r3" not in router._decisions
    assert rank[0][0].replica_id.unique_id == firsts[0]  # system 0's next question follows it
    assert policy._inflight["r1"].replica_id.unique_id == other[firsts[1]] and policy._inflight["r1"].confirmed
    router.on_request_completed(FakeId(firsts[0]), "r0")
    router.on_request_completed(FakeId(other[firsts[1]]), "r1")
    assert set(policy._inflight) == {"r4"}
    policy.check_integrity()


def test_a_late_rejection_after_the_retry_booked_leaves_the_request_counted_once():
    router, replicas = adapter_and_replicas()

    async def run():
        loop = asyncio.get_running_loop()
        pr = pending(loop, "r", 0, 0)
        await router.choose_replicas(replicas, pr)
        await router.choose_replicas(replicas, pr)  # Serve's retry chose again before the rejection's callback
        router.on_request_completed(FakeId("A"), "r")  # the first attempt's rejection, late: undoes the booking
        router.on_request_routed(pr, FakeId("B"), None)  # the retry accepted: counted afresh from the decision
        return pr

    asyncio.run(run())
    policy = router.policy
    assert policy._inflight["r"].replica_id == FakeId("B") and policy._inflight["r"].confirmed
    assert policy.load_of(FakeId("B")) == PROMPT + 8 and policy.load_of(FakeId("A")) == 0
    policy.check_integrity()


# -- the gateway's probe of the template ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from hf_paged.api.models import DEFAULT_MODEL_PATH

    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH, local_files_only=True)


def test_the_template_shared_start_is_the_common_prefix_of_every_chat(tokenizer):
    from hf_paged.scaleout.prompt_key import prompt_ids, routing_info, template_shared_start

    original = tokenizer.chat_template
    try:
        tokenizer.chat_template = ("{{ bos_token }}<|start|>system\nToday is 4 Dec 2026. Be brief.\n"
                                   "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
        start = template_shared_start(tokenizer)
        chats = [[{"role": "user", "content": text}] for text in ("hello there", "Why?", "0")]
        rendered = [prompt_ids("/v1/chat/completions", json.dumps({"messages": m}).encode(), tokenizer)[0]
                    for m in chats]
        assert start > 30 and all(ids[:start] == rendered[0][:start] for ids in rendered)
        body = json.dumps({"messages": chats[0], "max_tokens": 4}).encode()
        info = routing_info("/v1/chat/completions", body, tokenizer, 16, shared_start=start)
        assert info.num_shared_tokens == start
        completion = json.dumps({"prompt": list(range(40))}).encode()
        assert routing_info("/v1/completions", completion, tokenizer, 16, shared_start=start).num_shared_tokens == 0
        tokenizer.chat_template = None
        assert template_shared_start(tokenizer) == 0
        tokenizer.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}"
                                   "{% endif %}Preamble text.{% for m in messages %}{{ m['content'] }}{% endfor %}")
        assert template_shared_start(tokenizer) == len(tokenizer("Preamble text.", add_special_tokens=False)
                                                       ["input_ids"])  # the second pair: user messages only
        tokenizer.chat_template = "{{ raise_exception('never') }}"
        assert template_shared_start(tokenizer) == 0
    finally:
        tokenizer.chat_template = original
