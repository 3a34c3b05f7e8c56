"""Regex text -> Thompson NFA as one compiled loop (a `jit.kernel`): the fast reader's syntax, read
(`regex_tree_kernel`) and built without a Python step per position.

It builds exactly the NFA `nfa.build_nfa(syntax.parse(regex))` builds, state for state and in the same order
(so the DFA, its state numbers and every count of work are the same): the same backwards construction, the same
memos (a class in front of a state, a UTF-8 chain suffix), the same literal tries, the same budget checks (a raise
at the first multiple of 4096 positions past the limit). Its Python twin gives up at once: until the kernels are
loaded, and for any pattern the fast reader would hand to Python's parser, `byte_dfa.regex_nfa` takes the Python
path. The reading is `regex_tree_kernel`, the state store `nfa_store_kernel`, literal alternations
`literal_trie_kernel`.

Returns (status, positions, start, kinds, sparse, counts, flat, split, eps_counts, eps, look), the arrays
`dfa.FlatNFA` holds:
    status      OK; OVER (positions: the count at which the Python builder raises); GIVE_UP (take the Python path)
    kinds       int8 [n]; sparse / counts / flat: byte-reading states, their number of ranges, their ranges
    (first byte, last byte, next) in state order; split / eps_counts / eps: the same for epsilon targets;
    look        int64 [n, 2]: (anchor, next) of look states
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton import charset_kernel as charsets
from hf_paged.processors.automaton import literal_trie_kernel as tries
from hf_paged.processors.automaton import nfa_store_kernel as store
from hf_paged.processors.automaton import regex_tree_kernel as tree
from hf_paged.processors.automaton.nfa import LOOK, MATCH, SPARSE, SPEND_EVERY, SPLIT
from hf_paged.processors.jit import helper, kernel, warm_up

__all__ = ["GIVE_UP", "OK", "OVER", "regex_nfa"]

OK, OVER, GIVE_UP = 0, 1, 2
_GROW = 3  # (`_steps`: short of room)
_DEPTH, _RET, _TARGETS, _CHECKED, _NEED, _SEQS = 0, 1, 2, 3, 4, 5  # the step loop's scalars between calls


@helper
def _nothing(status, positions):  # pragma: no cover (compiled)
    """A result without an automaton: GIVE_UP, or OVER after `positions`."""
    empty = np.zeros(0, np.int64)
    return (status, positions, 0, np.zeros(0, np.int8), empty, empty.copy(), np.zeros((0, 3), np.int64),
            empty.copy(), empty.copy(), empty.copy(), np.zeros((0, 2), np.int64))


def _give_up(codes, left):
    """The twin: until the kernels are loaded, every pattern takes the Python path."""
    return _nothing(GIVE_UP, 0)


@helper
def _steps(nodes, children, r_ptr, r_lo, r_hi, seqs, frames, targets, kinds, aux, edges, eps, chain_keys, chain_values,
           set_keys, set_values, ctr, state, left):  # pragma: no cover (compiled)
    """The construction's steps from where `state` left them, until done (OK), over the budget (OVER) or short of
    room (_GROW, with what the step needs in `state`). No array is reassigned here: the kernel grows them between
    calls (a loop that reassigns arrays pays reference counting on every step, ~5x the step itself)."""
    depth, ret, num_targets, checked = state[_DEPTH], state[_RET], state[_TARGETS], state[_CHECKED]
    while depth > 0:
        while checked <= ctr[store.COUNT]:  # (the Python builder spends every 4096 positions: it raises at the first)
            if checked > left:
                state[_CHECKED] = checked
                return OVER
            checked += SPEND_EVERY
        t = depth - 1
        node, nxt, phase = frames[t, 0], frames[t, 1], frames[t, 2]
        kind = nodes[node, 0]
        need, total, num_seqs = 4, -1, 0
        if kind == tree.SET:
            rid = nodes[node, 1]
            num_seqs = charsets.MAX_SEQUENCES * (r_ptr[rid + 1] - r_ptr[rid])
            need = 4 * num_seqs + 4
        elif kind == tree.ALT and phase == 0:
            total = tries.literal_chars(node, nodes, children, r_ptr, r_lo, r_hi)
            need = 8 * total + 8 + nodes[node, 4]
        if (ctr[store.COUNT] + need > kinds.shape[0] or ctr[store.EDGES] + need > edges.shape[0]
                or ctr[store.EPS] + need + num_targets > eps.shape[0] or seqs.shape[0] < num_seqs
                or 2 * (ctr[store.CHAINS] + need) > chain_keys.shape[0]
                or 2 * (ctr[store.SETS] + need) > set_keys.shape[0]):
            state[_DEPTH], state[_RET], state[_TARGETS], state[_CHECKED] = depth, ret, num_targets, checked
            state[_NEED], state[_SEQS] = need, num_seqs
            return _GROW  # (this step again once the kernel made room: nothing of it is done yet)
        if kind == tree.SET:
            ret = store.char_set(nodes[node, 1], nxt, r_ptr, r_lo, r_hi, seqs, kinds, aux, edges, chain_keys,
                            chain_values, set_keys, set_values, ctr)
            depth -= 1
            continue
        if kind == tree.LOOK:
            ret = store.add(kinds, aux, ctr, LOOK, nodes[node, 1], nxt)
            depth -= 1
            continue
        first, count = nodes[node, 3], nodes[node, 4]
        if kind == tree.SEQ:  # children from the last, each in front of what follows it
            if phase == 0:
                frames[t, 2], frames[t, 3], frames[t, 4] = 1, count - 1, nxt
            else:
                frames[t, 3], frames[t, 4] = frames[t, 3] - 1, ret
            if frames[t, 3] < 0:
                ret = frames[t, 4]
                depth -= 1
                continue
            frames[depth, 0], frames[depth, 1], frames[depth, 2] = children[first + frames[t, 3]], frames[t, 4], 0
            depth += 1
            continue
        if kind == tree.ALT:
            if phase == 0:
                if total >= 0:
                    ret = tries.literal_trie(node, total, nxt, nodes, children, r_ptr, r_lo, r_hi, seqs, kinds, aux,
                                        edges, eps, chain_keys, chain_values, set_keys, set_values, ctr)
                    depth -= 1
                    continue
                frames[t, 2], frames[t, 3], frames[t, 5] = 1, 0, num_targets
            else:
                targets[num_targets] = ret
                num_targets += 1
                frames[t, 3] += 1
            if frames[t, 3] < count:
                frames[depth, 0], frames[depth, 1], frames[depth, 2] = children[first + frames[t, 3]], nxt, 0
                depth += 1
                continue
            base = frames[t, 5]
            ret = store.split(targets, base, num_targets - base, kinds, aux, eps, ctr)
            num_targets = base
            depth -= 1
            continue
        # REP: lo copies, then hi - lo optional ones (or a loop back through a split when hi is unbounded)
        low, high, child = nodes[node, 1], nodes[node, 2], children[first]
        if phase == 0:
            if high == 0:
                ret = nxt
                depth -= 1
                continue
            if high < 0:
                loop = store.add(kinds, aux, ctr, SPLIT, -1, 0)
                frames[t, 2], frames[t, 5] = 1, loop
                frames[depth, 0], frames[depth, 1], frames[depth, 2] = child, loop, 0
            else:
                frames[t, 2] = 2
                frames[depth, 0], frames[depth, 1], frames[depth, 2] = child, nxt, 0
            depth += 1
            continue
        if phase == 1:  # the loop's body is built
            loop = frames[t, 5]
            if ret == loop:  # a body that reads nothing matches only "": so does its repetition
                x = ctr[store.EPS]
                eps[x] = nxt
                aux[loop, 0], aux[loop, 1] = x, 1
                ctr[store.EPS] = x + 1
                depth -= 1
                ret = nxt
                continue
            x = ctr[store.EPS]
            eps[x], eps[x + 1] = ret, nxt
            aux[loop, 0], aux[loop, 1] = x, 2
            ctr[store.EPS] = x + 2
            if low >= 1:
                current, left_copies, phase = ret, low - 1, 4
            else:
                current, left_copies, phase = loop, 0, 4
        elif phase == 2:  # the last copy is built
            if ret == nxt:
                depth -= 1
                continue
            if high > low:
                targets[num_targets], targets[num_targets + 1] = ret, nxt
                current, left_copies, phase = store.split(targets, num_targets, 2, kinds, aux, eps, ctr), high - low - 1, 3
            else:
                current, left_copies, phase = ret, low - 1, 4
        elif phase == 3:  # an optional copy is built
            targets[num_targets], targets[num_targets + 1] = ret, nxt
            current, left_copies = store.split(targets, num_targets, 2, kinds, aux, eps, ctr), frames[t, 3] - 1
        else:  # phase 5: a required copy is built
            current, left_copies, phase = ret, frames[t, 3] - 1, 4
        if phase == 3 and left_copies == 0:
            left_copies, phase = low, 4
        if left_copies > 0:
            frames[t, 2], frames[t, 3], frames[t, 4] = (3 if phase == 3 else 5), left_copies, current
            frames[depth, 0], frames[depth, 1], frames[depth, 2] = child, current, 0
            depth += 1
            continue
        ret = current
        depth -= 1
    state[_RET] = ret
    return OK


@kernel(python=_give_up)
def regex_nfa(codes, left):  # pragma: no cover (compiled; tests compare it with the Python path)
    ok, root, nodes, children, r_ptr, r_lo, r_hi = tree.parse_arrays(codes)
    if not ok:
        return _nothing(GIVE_UP, 0)
    kinds = np.empty(256, np.int8)
    aux = np.empty((256, 2), np.int64)
    edges = np.empty((256, 3), np.int64)
    eps = np.empty(256, np.int64)
    chain_keys, chain_values = np.full(256, -1, np.int64), np.empty(256, np.int64)
    set_keys, set_values = np.full(256, -1, np.int64), np.empty(256, np.int64)
    ctr = np.zeros(5, np.int64)
    seqs = np.empty((charsets.MAX_SEQUENCES, 9), np.int64)
    targets = np.empty(children.shape[0] + 4, np.int64)  # (the open alternations' targets, then two scratch)
    # frames: (node, next, phase, counter, current, loop state or first target)
    frames = np.empty((nodes.shape[0] + 2, 6), np.int64)
    store.add(kinds, aux, ctr, MATCH, 0, 0)
    frames[0, 0], frames[0, 1], frames[0, 2] = root, 0, 0
    state = np.zeros(6, np.int64)
    state[_DEPTH], state[_RET], state[_TARGETS], state[_CHECKED] = 1, -1, 0, SPEND_EVERY
    while True:
        status = _steps(nodes, children, r_ptr, r_lo, r_hi, seqs, frames, targets, kinds, aux, edges, eps,
                        chain_keys, chain_values, set_keys, set_values, ctr, state, left)
        if status == OK:
            return _flatten(ctr[store.COUNT], state[_RET], kinds, aux, edges, eps)
        if status == OVER:
            return _nothing(OVER, state[_CHECKED])
        need = state[_NEED]
        kinds, aux = store.fit(kinds, ctr[store.COUNT] + need), store.fit_rows(aux, ctr[store.COUNT] + need)
        edges = store.fit_rows(edges, ctr[store.EDGES] + need)
        eps = store.fit(eps, ctr[store.EPS] + need + state[_TARGETS])
        chain_keys, chain_values = store.fit_map(chain_keys, chain_values, ctr[store.CHAINS], need)
        set_keys, set_values = store.fit_map(set_keys, set_values, ctr[store.SETS], need)
        if seqs.shape[0] < state[_SEQS]:
            seqs = np.empty((state[_SEQS], 9), np.int64)

@helper
def _flatten(count, start, kinds, aux, edges, eps):  # pragma: no cover (compiled)
    """The built states as `FlatNFA`'s arrays, each state's edges in state order."""
    kinds = kinds[:count].copy()
    num_sparse, num_split, num_edges, num_eps = 0, 0, 0, 0
    for q in range(count):
        if kinds[q] == SPARSE:
            num_sparse += 1
            num_edges += aux[q, 1]
        elif kinds[q] == SPLIT:
            num_split += 1
            num_eps += aux[q, 1]
    sparse, counts = np.empty(num_sparse, np.int64), np.empty(num_sparse, np.int64)
    split, eps_counts = np.empty(num_split, np.int64), np.empty(num_split, np.int64)
    flat, targets = np.empty((num_edges, 3), np.int64), np.empty(num_eps, np.int64)
    look = np.zeros((count, 2), np.int64)
    i, j, e, x = 0, 0, 0, 0
    for q in range(count):
        if kinds[q] == SPARSE:  # (element loops: a slice copy per state costs more than the copy)
            sparse[i], counts[i] = q, aux[q, 1]
            for k in range(aux[q, 0], aux[q, 0] + aux[q, 1]):
                flat[e, 0], flat[e, 1], flat[e, 2] = edges[k, 0], edges[k, 1], edges[k, 2]
                e += 1
            i += 1
        elif kinds[q] == SPLIT:
            split[j], eps_counts[j] = q, aux[q, 1]
            for k in range(aux[q, 0], aux[q, 0] + aux[q, 1]):
                targets[x] = eps[k]
                x += 1
            j += 1
        elif kinds[q] == LOOK:
            look[q, 0], look[q, 1] = aux[q, 0], aux[q, 1]
    return OK, count, start, kinds, sparse, counts, flat, split, eps_counts, targets, look

def codes_of(regex: str) -> np.ndarray:
    """The code points of `regex` as the kernel reads them (lone surrogates kept)."""
    return np.frombuffer(regex.encode("utf-32-le", "surrogatepass"), dtype=np.int32)

@warm_up
def _signatures() -> None:
    """One pattern of each construct, in the types `nfa.regex_nfa` passes."""
    regex_nfa.dispatcher(codes_of('(?:[a-c\\u00e9]+|"x"|y{2,3}|(?:ab|cd|ef)|^.$)*'), np.int64(1000))
