"""The gateway of prefill/decode disaggregation (`hf-paged serve --replicas N --prefill-replicas P`).

    client -> Gateway: routing info (prompt digests); `PlacementLedger.place` decides where the prompt is prefilled
        1. on the prefill side: a PrefillReplica (P of them, cache-aware routed) gets `prefill(call with a one-token
           body)`; it returns once the prompt's blocks are in Ray's object store and registered with the directory
           or: locally, nothing here (the decode replica computes the prompt itself, chunked by its budget)
        2. EngineReplica, a decode replica (N - P, cache-aware routed): `forward(call)` as in colocated mode; it loads
           the blocks it lacks and decodes; the answer streams back

What each role does and why the first token is the decode side's: `kv_roles.py`. Where a prompt is prefilled and
why: `pd_placement.py` (the rule compares the prompt's wait on each side from the tokens the gateway placed there
and has not seen done; a prompt with no full block before its last token has nothing to hand over and is local).
The ledger's bookkeeping: a prefill-side placement is done when the prefill call returns (or fails); a local one when
the decode replica's first answer bytes come back (for a non-streamed answer that is its end: the local queue then
over-counts, which only leans the next decisions towards the prefill side), or the answer ends without any.

A prefill that fails (the replica died, mid-transfer or before; any other error; no answer within
`ReplicaSpec.prefill_timeout_s`, a fault bound for the time Serve queues calls while no prefill replica is alive) is
logged and counted; the decode replica then recomputes what it cannot load, and answers. A client that leaves during
the prefill cancels it (the prefill replica aborts the request and frees its blocks); during the decode, as in
colocated mode. `GET /metrics` merges both kinds of replicas plus the gateway's placement counters;
`GET /hf_paged/router` shows both routers.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hf_paged.scaleout.asgi import HttpCall
from hf_paged.scaleout.gateway import Gateway
from hf_paged.scaleout.kv_roles import prefill_body
from hf_paged.scaleout.pd_placement import Placement, PlacementLedger, Side
from hf_paged.scaleout.prompt_key import RoutingInfo

if TYPE_CHECKING:
    from hf_paged.scaleout.spec import ReplicaSpec

__all__ = ["DisaggGateway"]

logger = logging.getLogger("hf_paged.scaleout")

# The local placement of the request this task is answering (set in `_before_forward`, read back in `_answer`)
_LOCAL: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("hf_paged_pd_local", default=None)


class DisaggGateway(Gateway):
    """The gateway, placing each routed request's prefill on a prefill replica or on the decode replica."""

    def __init__(self, engine: Any, spec: ReplicaSpec, prefill: Any, **readiness: Any) -> None:
        from hf_paged.config import PagedConfig

        super().__init__(engine, spec, **readiness)
        self.prefill = prefill
        self.prefill_timeout_s = spec.prefill_timeout_s
        paged = PagedConfig(**spec.paged)
        self.ledger = PlacementLedger(block_size=self.block_size, local_budget=paged.max_prefill_tokens_per_step,
                                      num_decode_replicas=max(1, self.num_replicas),
                                      step_ratio=paged.max_prefill_step_time_ratio)
        self.num_prefills = 0  # prefills that answered (any status)
        self.num_prefill_failures = 0  # prefills that raised (replica lost, ...): the decode side recomputed

    def _engine_handles(self) -> list[Any]:
        return [self.engine, self.prefill]

    async def scrape(self) -> str:
        """Every replica's metrics (both roles) and the gateway's, plus its prefill and placement counters."""
        text = await super().scrape()
        ledger = self.ledger
        own = [("pd_prefills", self.num_prefills, "Prefills a prefill replica answered (any status)"),
               ("pd_prefill_failures", self.num_prefill_failures,
                "Prefills that raised (a replica lost, ...): the decode replica recomputed the prompt"),
               ("pd_prefills_skipped", ledger.num_no_handover,
                "Prompts without a full block before their last token: sent to a decode replica at once"),
               ("pd_prefills_local", ledger.num_placed[Side.LOCAL] - ledger.num_no_handover,
                "Prompts with blocks to hand over that the placement rule prefilled on the decode replica")]
        lines = [f"# HELP hf_paged:{name} {text_}\n# TYPE hf_paged:{name} counter\nhf_paged:{name}_total {n}\n"
                 for name, n, text_ in own]
        lines.append("# HELP hf_paged:pd_queued_prefill_tokens Prompt tokens placed on a side, prefill not done\n"
                     "# TYPE hf_paged:pd_queued_prefill_tokens gauge\n" +
                     "".join(f'hf_paged:pd_queued_prefill_tokens{{side="{side.value}"}} {n}\n'
                             for side, n in ledger.queued.items()))
        return text + ("" if text.endswith("\n") else "\n") + "".join(lines)

    async def _answer(self, request: Request) -> Response:
        token = _LOCAL.set(None)
        try:
            response = await super()._answer(request)
            placement = _LOCAL.get()
        except BaseException:
            if (placement := _LOCAL.get()) is not None:
                self.ledger.done(placement)
            raise
        finally:
            _LOCAL.reset(token)
        if placement is not None:
            if isinstance(response, StreamingResponse):
                response.body_iterator = self._release_on_first(response.body_iterator, placement)
            else:
                self.ledger.done(placement)  # an error answered here (no replica): nothing is computing it
        return response

    async def _release_on_first(self, chunks: Any, placement: Placement):
        """The answer's chunks; the local placement is done at the first one (its prefill is), or at the end."""
        released = False
        try:
            async for chunk in chunks:
                if not released:
                    released = True
                    self.ledger.done(placement)
                yield chunk
        finally:
            if not released:
                self.ledger.done(placement)

    async def _before_forward(self, call: HttpCall, routing: Any) -> None:
        body = prefill_body(call.body)
        if not isinstance(routing, RoutingInfo) or body is None:
            return  # no prompt found (a bad request): the decode replica answers it with its error
        self.ledger.num_prefill_replicas = self._num_prefill_replicas()
        placement = self.ledger.place(routing.num_prompt_tokens)
        if placement.side is Side.LOCAL:
            _LOCAL.set(placement)
            return
        headers = tuple((k, v) for k, v in call.headers if k.lower() != b"content-length")
        try:
            response = self.prefill.prefill.remote(replace(call, headers=headers, body=body), routing=routing)
            status = await asyncio.wait_for(_result(response), self.prefill_timeout_s)
        except Exception as exc:  # noqa: BLE001 -- a lost prefill only costs the decode side the recompute
            self.num_prefill_failures += 1
            logger.warning("prefill of %s failed; the decode replica recomputes it: %r", call.path, exc)
            return
        finally:
            self.ledger.done(placement)
        self.num_prefills += 1
        if status != 200:
            logger.info("prefill of %s answered %d; the decode replica answers the request", call.path, status)

    def _num_prefill_replicas(self) -> int:
        """Prefill replicas the prefill deployment's router knows (1 before it knows any)."""
        from hf_paged.scaleout import registry

        target = getattr(self.prefill, "deployment_id", None)
        known = [router.view_readiness().num_known for router in registry.routers()
                 if target is not None and router.view_readiness().deployment_id == target]
        return max(1, *known) if known else 1


async def _result(response: Any) -> Any:
    return await response
