"""The gateway of prefill/decode disaggregation (`hf-paged serve --replicas N --prefill-replicas P`).

    client -> Gateway: routing info (prompt digests)
        1. PrefillReplica (P of them, cache-aware routed): `prefill(call with a one-token body)`; returns once the
           prompt's blocks are in Ray's object store and registered with the directory
        2. EngineReplica, a decode replica (N - P, cache-aware routed): `forward(call)` as in colocated mode; it loads
           the blocks it lacks and decodes; the answer streams back

What each role does and why the first token is the decode side's: `kv_roles.py`. A prompt without a full block before
its last token has nothing to hand over (the connector never moves the block that holds the last token): it goes to
a decode replica at once. A prefill that fails (the replica
died, mid-transfer or before; any other error; no answer within `ReplicaSpec.prefill_timeout_s`, a fault bound for
the time Serve queues calls while no prefill replica is alive) is logged and counted; the decode replica then
recomputes what it cannot load, and answers. A client that leaves during the prefill cancels it (the prefill replica aborts the request
and frees its blocks); during the decode, as in colocated mode. `GET /metrics` merges both kinds of replicas;
`GET /hf_paged/router` shows both routers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hf_paged.scaleout.asgi import HttpCall
from hf_paged.scaleout.gateway import Gateway
from hf_paged.scaleout.kv_roles import prefill_body
from hf_paged.scaleout.prompt_key import RoutingInfo

if TYPE_CHECKING:
    from hf_paged.scaleout.spec import ReplicaSpec

__all__ = ["DisaggGateway"]

logger = logging.getLogger("hf_paged.scaleout")


class DisaggGateway(Gateway):
    """The gateway, with a prefill on a prefill replica before each routed request goes to a decode replica."""

    def __init__(self, engine: Any, spec: ReplicaSpec, prefill: Any, **readiness: Any) -> None:
        super().__init__(engine, spec, **readiness)
        self.prefill = prefill
        self.prefill_timeout_s = spec.prefill_timeout_s
        self.num_prefills = 0  # prefills that answered (any status)
        self.num_prefill_failures = 0  # prefills that raised (replica lost, ...): the decode side recomputed
        self.num_prefills_skipped = 0  # prompts with no full block to hand over: sent to the decode side at once

    def _engine_handles(self) -> list[Any]:
        return [self.engine, self.prefill]

    async def scrape(self) -> str:
        """Every replica's metrics (both roles) and the gateway's, plus its prefill counters."""
        text = await super().scrape()
        own = [("pd_prefills", self.num_prefills, "Prefills a prefill replica answered (any status)"),
               ("pd_prefill_failures", self.num_prefill_failures,
                "Prefills that raised (a replica lost, ...): the decode replica recomputed the prompt"),
               ("pd_prefills_skipped", self.num_prefills_skipped,
                "Prompts without a full block before their last token: sent to a decode replica at once")]
        lines = [f"# HELP hf_paged:{name} {text_}\n# TYPE hf_paged:{name} counter\nhf_paged:{name}_total {n}\n"
                 for name, n, text_ in own]
        return text + ("" if text.endswith("\n") else "\n") + "".join(lines)

    async def _before_forward(self, call: HttpCall, routing: Any) -> None:
        if isinstance(routing, RoutingInfo) and (routing.num_prompt_tokens - 1) // self.block_size < 1:
            self.num_prefills_skipped += 1  # no full block before the last token: nothing to hand over
            return
        body = prefill_body(call.body)
        if body is None:
            return
        headers = tuple((k, v) for k, v in call.headers if k.lower() != b"content-length")
        response = self.prefill.prefill.remote(replace(call, headers=headers, body=body), routing=routing)
        try:
            status = await asyncio.wait_for(_result(response), self.prefill_timeout_s)
        except Exception as exc:  # noqa: BLE001 -- a lost prefill only costs the decode side the recompute
            self.num_prefill_failures += 1
            logger.warning("prefill of %s failed; the decode replica recomputes it: %r", call.path, exc)
            return
        self.num_prefills += 1
        if status != 200:
            logger.info("prefill of %s answered %d; the decode replica answers the request", call.path, status)


async def _result(response: Any) -> Any:
    return await response
