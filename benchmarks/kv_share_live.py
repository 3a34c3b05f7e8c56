"""A live check of `deploy(kv_share=True)` through Ray Serve: 2 replicas of the embedded tiny model behind the
gateway, routed by Serve's power of two choices (`router="pow2"`, so one prompt reaches both replicas), the same
600-token prompt sent 16 times; prints which replicas answered, whether every answer was the same, and each replica's
`hf_paged:kv_transfer_*` counters from the gateway's merged `/metrics` (one replica publishes the prompt's blocks
after its first hit; the other loads them instead of recomputing).

    python benchmarks/kv_share_live.py [--requests 16] [--port 8765]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    import httpx
    import ray
    from ray import serve

    from hf_paged.scaleout.deploy import deploy
    from hf_paged.scaleout.gateway import wait_until_ready

    handle = deploy(replicas=2, num_cpus=2, port=args.port, router="pow2", kv_share=True, torch_threads=1)
    try:
        print(wait_until_ready(handle, 120))
        url = f"http://127.0.0.1:{args.port}"
        body = {"model": "hf-paged/tiny-lm", "prompt": "A shared system prompt that every replica will see. " * 12,
                "max_tokens": 4, "temperature": 0}
        answered: dict[str, int] = {}
        texts = set()
        for _ in range(args.requests):
            reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
            reply.raise_for_status()
            tag = reply.headers["x-hf-paged-replica"]
            answered[tag] = answered.get(tag, 0) + 1
            texts.add(reply.json()["choices"][0]["text"])
        print(f"requests answered by replica: {answered}; distinct answers: {len(texts)}")
        for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
            if re.match(r"hf_paged:kv_transfer_(loaded_blocks|loaded_tokens|saved_blocks|load_failures)_total", line):
                print(line)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
