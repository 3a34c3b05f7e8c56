"""The command line on a CUDA machine, as a new user runs it: `bench`, `generate` with a schema, and `serve`.

    python scripts/gpu_cli_check.py                  # on a GPU (scripts/gpu_check.sh runs it)
    python scripts/gpu_cli_check.py --device cpu     # the same checks on the CPU (to check this script)

Each step runs `python -m hf_paged.cli ...` in a child process on the embedded default model with `--device`:
  1. `bench --dtype bfloat16`: exit 0 and a result file with both sides' tokens;
  2. `generate --schema`: one JSON line per prompt, each output valid under the schema;
  3. `serve --kv-cache-dtype int8 --port 0`: a seeded chat completion with n=2 answered twice the same, a
     json_schema response format obeyed, /metrics counting the requests, then SIGTERM and exit 0.
Prints one table; exit status 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_paged.cli", *args], check=False, capture_output=True,
                          text=True, timeout=timeout)


def check_bench(device: str, tmp: Path) -> str:
    out = tmp / "bench.json"
    run = cli("bench", "--device", device, "--dtype", "bfloat16", "--num-prompts", "16", "--out", str(out))
    assert run.returncode == 0, run.stderr[-600:]
    result = json.loads(out.read_text())
    ours, stock = result["hf_paged"], result["stock_generate_batches_of_8"]
    return (f"{result['machine']}: hf_paged {ours['tokens_per_s']:.0f} tok/s, stock batches of 8 "
            f"{stock['tokens_per_s']:.0f} tok/s ({ours['tokens_per_s'] / stock['tokens_per_s']:.2f}x)")


def check_generate(device: str, tmp: Path) -> str:
    import jsonschema

    prompts, schema = tmp / "prompts.jsonl", tmp / "schema.json"
    prompts.write_text("".join(json.dumps({"prompt": f"Person {i}:"}) + "\n" for i in range(6)))
    schema.write_text(json.dumps(SCHEMA))
    run = cli("generate", "--device", device, "--prompts", str(prompts), "--schema", str(schema),
              "--max-new-tokens", "48")
    assert run.returncode == 0, run.stderr[-600:]
    records = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert len(records) == 6, run.stdout[-600:]
    texts = [r["text"] for r in records]
    valid = 0
    for text in texts:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    assert valid == len(texts) or all(r.get("finish_reason") == "length" for r in records), texts
    return f"{valid}/{len(texts)} valid under the schema"


def check_serve(device: str, tmp: Path) -> str:
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "hf_paged.cli", "serve", "--device", device, "--port", "0",
                             "--kv-cache-dtype", "int8", "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-600:]
            found = [m for m in map(re.compile(r"serving \S+ on (http://127\.0\.0\.1:\d+)").search, lines) if m]
            url = found[0].group(1) if found else None
            time.sleep(0.05)
        chat = {"model": "default", "messages": [{"role": "user", "content": "Name a person."}], "max_tokens": 24,
                "temperature": 0.8, "seed": 7, "n": 2}  # fmt: skip
        with httpx.Client(base_url=url, timeout=60) as client:
            models = client.get("/v1/models").json()
            chat["model"] = models["data"][0]["id"]
            first, again = (client.post("/v1/chat/completions", json=chat) for _ in range(2))
            assert first.status_code == 200, first.text[:300]
            texts = [c["message"]["content"] for c in first.json()["choices"]]
            assert texts == [c["message"]["content"] for c in again.json()["choices"]], "seeded answers differ"
            structured = client.post("/v1/chat/completions", json={
                **chat, "n": 1, "max_tokens": 48,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}})
            assert structured.status_code == 200, structured.text[:300]
            choice = structured.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                import jsonschema

                jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
            metrics = client.get("/metrics").text
            assert "hf_paged" in metrics, metrics[:300]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(lines)[-600:]
        return f"seeded n=2 repeatable, json_schema finish={choice['finish_reason']}, SIGTERM exit 0"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = p.parse_args(argv)
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, step in (("bench", check_bench), ("generate --schema", check_generate), ("serve", check_serve)):
            start = time.monotonic()
            try:
                verdict, detail = "PASS", step(args.device, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a failed step is a row of the table; the others still run
                verdict, detail, failed = "FAIL", f"{type(exc).__name__}: {exc}"[:400], failed + 1
            rows.append(f"| {name} --device {args.device} | {verdict} | {time.monotonic() - start:.1f} s | "
                        f"{' '.join(detail.split())} |")
    print("| CLI step | verdict | seconds | detail |\n|---|---|---|---|\n" + "\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
