"""Reusing a sub-schema's translation within one try of the ladder.

A `$ref` target written in place (an `anyOf` option, `branches`) is translated again at every use, and so is all
below it: MaskBench's `Github_ultra---o69209`, whose definitions name each other from many options, translated its
987 nodes 4,156 times (one node 137 times). What a node's translation reads besides the node and the try's settings
is the reference stack (`Context.ref_stack`: a target entered again is called, or cut off past `max_ref_depth`) and
which rules are being built (`Context.recursive_call`), and of both only the `$ref` targets the node can reach
matter. Keyed by the node and those, a translation is reused, and what it did to the context besides its result is
done again: its cuts, the members it left out, the parts it found to allow no value, and its work, counted again in
the try's visits and the budget's visits, text and `oneOf` checks (but for the rules it built: a rule is built once).
So a schema's outcome, texts and budget counts are the ones translating every use gives (only a budget that runs
out is found past its limit by more), in less time.
"""

from __future__ import annotations

from typing import Any

from hf_paged.processors.schema.context import Context
from hf_paged.processors.schema.fragments import Rx
from hf_paged.processors.schema.refs import local_target

__all__ = ["Reach", "mark", "remember", "reuse_key", "reused"]

_VALUES = ("enum", "const", "default", "examples")  # keywords whose values are data, not schemas
_NONE: frozenset[str] = frozenset()


class Reach:
    """The `$ref` targets each node of one document can enter, itself or through other targets (by JSON pointer,
    as `Context.ref_stack` holds them); shared by a compile's tries, built on the first translation."""

    __slots__ = ("_below", "_closure", "_reach", "_targets", "built")

    def __init__(self) -> None:
        self.built = False
        self._below: dict[int, frozenset[str]] = {}  # id(node) -> the targets of the `$ref`s in its subtree
        self._targets: dict[str, Any] = {}  # pointer -> the target's schema
        self._closure: dict[str, frozenset[str]] = {}  # pointer -> the targets its schema can reach, itself too
        self._reach: dict[int, frozenset[str]] = {}  # `of`'s memo

    def build(self, ctx: Context) -> None:
        """Index the document (`ctx.root`). A reference that does not resolve to a node of this document leaves the
        index empty: nothing is reused in that compile."""
        self.built = True
        if _walk(ctx.root, ctx, self._below, self._targets) is None:
            self._below.clear()
            return
        self._close()

    def of(self, node: Any) -> frozenset[str] | None:
        """The targets `node` can reach; None when `node` is not a node of the document (a schema made during the
        translation: merged `allOf` parts, ...), whose identity may be reused once it is freed."""
        key = id(node)
        found = self._reach.get(key)
        if found is None:
            below = self._below.get(key)
            if below is None:
                return None
            found = self._reach[key] = below.union(*(self._closure[p] for p in below)) if below else _NONE
        return found

    def _succ(self, pointer: str) -> frozenset[str]:
        return self._below.get(id(self._targets[pointer]), _NONE)

    def _close(self) -> None:
        """`_closure` of every target: Tarjan's strongly connected components over "target's schema refers to",
        each component's closure made from those of the components it refers to (completed before it)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        for start in self._targets:
            if start in index:
                continue
            index[start] = low[start] = len(index)
            stack.append(start)
            on_stack.add(start)
            work = [(start, iter(self._succ(start)))]
            while work:
                here, successors = work[-1]
                for nxt in successors:
                    if nxt not in index:
                        index[nxt] = low[nxt] = len(index)
                        stack.append(nxt)
                        on_stack.add(nxt)
                        work.append((nxt, iter(self._succ(nxt))))
                        break
                    if nxt in on_stack:
                        low[here] = min(low[here], index[nxt])
                else:
                    work.pop()
                    if work:
                        low[work[-1][0]] = min(low[work[-1][0]], low[here])
                    if low[here] == index[here]:
                        members = []
                        while not members or members[-1] != here:
                            members.append(stack.pop())
                            on_stack.discard(members[-1])
                        reached = set(members)
                        for member in members:
                            for nxt in self._succ(member):
                                if nxt not in reached:
                                    reached |= self._closure[nxt]  # (another component: closed already)
                        closure = frozenset(reached)
                        for member in members:
                            self._closure[member] = closure


def _walk(node: Any, ctx: Context, below: dict[int, frozenset[str]], targets: dict[str, Any]) -> frozenset[str] | None:
    """Record the targets of the `$ref`s under each dict / list of `node` (data keywords' values left out); None
    when a reference does not resolve within the document."""
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = local_target(ref, ctx)
            if target is None:
                return None
            targets[target.pointer] = target.schema
            found.add(target.pointer)
        children = (v for k, v in node.items() if k not in _VALUES)
    else:
        children = iter(node)
    for child in children:
        if isinstance(child, (dict, list)):
            sub = _walk(child, ctx, below, targets)
            if sub is None:
                return None
            found |= sub
    out = frozenset(found) if found else _NONE
    below[id(node)] = out
    return out


def reuse_key(schema: Any, ctx: Context, part: bool = False) -> tuple | None:
    """The key of `schema`'s translation in this try (None: not reused; `Context.reach` is None, or `schema` is not
    a node of the document); `part`: of its plain translation as an alternative of another (`translate`)."""
    reach = ctx.reach
    if reach is None or not isinstance(schema, dict):
        return None
    if ctx.translations is None:  # (until a node comes again, as in most schemas: nothing to reuse, no keys to make)
        if id(schema) not in ctx.seen:
            ctx.seen.add(id(schema))
            return None
        ctx.translations = {}
        if not reach.built:
            reach.build(ctx)
    relevant = reach.of(schema)
    if relevant is None:
        return None
    if not relevant:
        return (id(schema), part)
    return (id(schema), part, tuple(p for p in ctx.ref_stack if p in relevant),
            tuple(k for k in ctx.defining if k in relevant))


def mark(ctx: Context) -> tuple[int, ...]:
    """What `remember` measures a translation's effects from, taken as it starts: `Context.work_counters` less the
    work of the rules built so far (a rule is built once: reusing a translation that built one does not build it
    again, as translating it again would not), and the parts known to allow no value."""
    return (*(now - built for now, built in zip(ctx.work_counters(), ctx.built_work)), len(ctx.empty))


def reused(key: tuple, ctx: Context) -> tuple[Rx | None] | None:
    """`(result,)` of the translation under `key`, its effects on `ctx` done again (its work counted again too: the
    budget's outcome is the one translating it again would have, only sooner); None when there is none."""
    hit = ctx.translations.get(key)  # type: ignore[union-attr]  (a key is made only once there is a dict)
    if hit is None:
        return None
    rx, (cuts, pruned, visits, text, checks), empty = hit
    for _ in range(cuts):
        ctx.cut()
    ctx.num_pruned += pruned
    ctx.empty.extend(why for why in empty if why not in ctx.empty and len(ctx.empty) < 3)
    ctx.visit(visits)
    ctx.budget.spend("text", text)
    ctx.budget.spend("checks", checks)  # (only `oneOf`'s checks: a value check is memoised by content already)
    ctx.branch_checks += checks
    return (rx,)


def remember(key: tuple, rx: Rx | None, before: tuple[int, ...], ctx: Context) -> None:
    """Keep the translation under `key` with its effects since `before` (`mark` as it started)."""
    now = mark(ctx)
    ctx.translations[key] = (  # type: ignore[index]
        rx, tuple(a - b for a, b in zip(now[:-1], before)), tuple(ctx.empty[before[-1]:]))
