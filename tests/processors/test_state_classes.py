"""Lookahead classes: states in one class agree on every string of at most k bytes (alive or dead after each byte,
and the same stop state at the same depth), checked by brute force on random automata; a counter's states far from
its bound fall into one class."""

from __future__ import annotations

import numpy as np
import pytest

from hf_paged.processors.index.state_classes import lookahead_classes

ALPHABET = [ord("a"), ord("b"), ord(" "), 0xC3]  # the bytes the random automata use (every other byte: dead)


def _outcome(table: np.ndarray, dead: int, stops: np.ndarray, state: int, depth: int) -> tuple:
    """What each string of at most `depth` bytes over ALPHABET meets from `state`."""
    out = []
    for byte in ALPHABET:
        following = int(table[state, byte])
        if following == dead:
            out.append("dead")
        elif stops[following]:
            out.append(("stop", following))
        elif depth > 1:
            out.append(_outcome(table, dead, stops, following, depth - 1))
        else:
            out.append("alive")
    return tuple(out)


@pytest.mark.parametrize("seed", range(12))
def test_states_of_one_class_agree_on_every_short_string(seed):
    rng = np.random.default_rng(seed)
    num_states = int(rng.integers(4, 30))
    dead = num_states  # the last row
    table = np.full((num_states + 1, 256), dead, dtype=np.int32)
    for byte in ALPHABET:  # mostly moves to a few states, some dead
        table[:num_states, byte] = rng.choice(np.append(np.arange(num_states), [dead] * 2), size=num_states)
    stops = rng.random(num_states + 1) < 0.15
    stops[dead] = False
    for rounds in (1, 2, 4):
        classes = lookahead_classes(table, dead, stops, rounds)
        assert classes[dead] not in set(classes[:dead][~stops[:dead]].tolist())
        for cls in np.unique(classes).tolist():
            members = np.flatnonzero(classes == cls).tolist()
            if dead in members:
                assert members == [dead]
                continue
            if any(stops[m] for m in members):
                assert len(members) == 1  # a stop is its own class
                continue
            expected = _outcome(table, dead, stops, members[0], rounds)
            for member in members[1:]:
                assert _outcome(table, dead, stops, member, rounds) == expected, (seed, rounds, members)


def test_a_counters_states_far_from_its_bound_share_a_class():
    # "a" at most 40 times, then a stop (the closing quote of a counted string inside a rule)
    size = 42  # states 0..40 count the a's read, 41 the stop, 42 dead
    dead, stop = size, size - 1
    table = np.full((size + 1, 256), dead, dtype=np.int32)
    table[:40, ord("a")] = np.arange(1, 41)
    table[:41, ord('"')] = stop
    stops = np.zeros(size + 1, dtype=bool)
    stops[stop] = True
    classes = lookahead_classes(table, dead, stops, 16)
    assert len(set(classes[:24].tolist())) == 1  # 17 or more a's left: no 16-byte string tells them apart
    assert len(set(classes[24:41].tolist())) == 17  # the last 16 + 1 counts are each their own


def _random_rule(seed: int) -> tuple[np.ndarray, int, np.ndarray]:
    rng = np.random.default_rng(seed)
    num_states = int(rng.integers(4, 400))
    dead = num_states
    table = np.full((num_states + 1, 256), dead, dtype=np.int32)
    for byte in ALPHABET:  # few targets: many states alike, so classes merge and split over the rounds
        table[:num_states, byte] = rng.choice(np.append(np.arange(min(num_states, 8)), [dead] * 2), size=num_states)
    stops = rng.random(num_states + 1) < 0.05
    stops[dead] = False
    return table, dead, stops


def test_the_classes_are_exact_and_the_compiled_refinement_equals_its_twin():
    from hf_paged.processors import jit
    from hf_paged.processors.automaton.refine_kernel import refine_classes

    compiled = jit.wait(1800)  # a cold numba cache on a loaded machine: the compile child runs at nice 10
    for seed in range(20):
        table, dead, stops = _random_rule(seed)
        for rounds in (1, 3, 16):
            classes = lookahead_classes(table, dead, stops, rounds)
            # numbered by first appearance, whichever implementation ran
            firsts = [int(np.flatnonzero(classes == c)[0]) for c in range(int(classes.max()) + 1)]
            assert firsts == sorted(firsts)
            initial = np.unique(np.where(stops, np.arange(stops.shape[0]) + 1, 0) - (np.arange(stops.shape[0]) == dead),
                                return_inverse=True)[1].reshape(-1).astype(np.int64)
            twin = refine_classes.python(table, initial, rounds)
            if compiled:
                fast = refine_classes.compiled(table, initial.copy(), rounds)
                same = np.unique(np.stack([twin, fast]), axis=1).shape[1]
                assert same == len(np.unique(twin)) == len(np.unique(fast)), (seed, rounds)
            if rounds == 1 and len(np.unique(twin)) < table.shape[0]:  # exact: one round merges equal signatures
                signature = np.concatenate([initial[:, None], initial[table]], axis=1)
                assert len(np.unique(signature, axis=0)) == len(np.unique(twin))
