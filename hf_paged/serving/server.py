"""`hf-paged serve`: load the model, build the app, run uvicorn; stop cleanly on SIGTERM.

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections and gives the requests in flight up to
`--shutdown-timeout` seconds; what still runs then is cancelled (its engine requests aborted), the engine loop
stops, and the process exits with status 0 (130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import NoReturn

from hf_paged.serving.auth import API_KEY_ENV  # (auth.py imports no FastAPI: the command line works without it)

__all__ = ["add_serve_arguments", "end_process", "run_serve"]


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="a local model directory (or a hub id when online); default: the embedded tiny model")
    parser.add_argument("--served-model-name", default=None, help="the model id clients send (default: from --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "auto"),
                        help="the weights' dtype; auto: the checkpoint's own (its config's dtype, e.g. bfloat16) "
                             "(default: %(default)s)")
    parser.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                        help="the sampling defaults of a request that omits temperature, top_p, top_k, min_p, "
                             "repetition_penalty or max_tokens: auto takes the model's generation_config.json (as vLLM "
                             "does; do_sample and max_length are not read), vllm ignores it (OpenAI's defaults), DIR "
                             "reads DIR/generation_config.json (default: %(default)s)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="requests must send 'Authorization: Bearer KEY' (else HTTP 401); /health and /metrics "
                             f"stay open. Or set {API_KEY_ENV} (keeps the key out of ps)")
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template file (overrides the tokenizer's)")
    parser.add_argument("--max-waiting", type=int, default=None,
                        help="most sequences (prompts x n) queued before new requests get HTTP 429 (default: 64 x "
                             "--max-num-seqs, 8,192 with its default; 0: no bound)")
    parser.add_argument("--max-cache-retention", type=float, default=3600.0, metavar="SECONDS",
                        help="the longest cache_retention_seconds a request may ask (its prompt's prefix kept "
                             "cached); 0 refuses the field (default: %(default)s)")
    parser.add_argument("--max-stop-sequences", type=int, default=None, metavar="N",
                        help="most stop strings a request may send (more get HTTP 400: the engine checks each after "
                             "every token of the request); 0: no bound (default: 64)")
    parser.add_argument("--max-request-bytes", type=int, default=None, metavar="BYTES",
                        help="the longest request body; longer ones get HTTP 413 (default: 32 MiB)")
    parser.add_argument("--header-timeout", type=float, default=None, metavar="SECONDS",
                        help="a connection must send a complete request head within this long of opening (or of its "
                             "last response) or it is closed: slowloris (default: 30)")
    parser.add_argument("--send-timeout", type=float, default=None, metavar="SECONDS",
                        help="a connection whose client reads nothing of a response for this long (our writes stay "
                             "blocked) is closed and its request aborted: a stalled reader (default: 60)")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds in-flight requests get to finish after SIGTERM before they are aborted")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--max-cache-bytes", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-prefill-tokens-per-step", type=int, default=None,
                        help="prompt tokens a step may carry while others decode (default: no bound); e.g. 64 "
                             "bounds inter-token stalls on CPU at some cost in TTFT")
    parser.add_argument("--max-prefill-step-time-ratio", type=float, default=None, metavar="R",
                        help="with --max-prefill-tokens-per-step and a KV connector (--prefill-replicas' decode side, "
                             "--kv-offload-dir): also hold a step's prompt tokens to what keeps it within R measured "
                             "decode-only steps (R > 1; off by default; benchmarks/disagg_results.md)")
    parser.add_argument("--kv-cache-dtype", default=None, choices=("auto", "fp8", "int8", "int4"))
    parser.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    parser.add_argument("--kv-offload-dir", default=None, metavar="DIR",
                        help="the disk tier: blocks evicted from the prefix cache are written here and read back on "
                             "a later hit, also after a restart (the cache is written here at shutdown)")
    parser.add_argument("--kv-offload-bytes", type=int, default=None, help="most bytes of --kv-offload-dir (1 GiB)")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.add_argument("--replicas", type=int, default=None,
                        help="run N engine replicas on Ray Serve, routed by prefix cache (needs hf_paged[ray])")
    parser.add_argument("--address", default=None, help="run the replicas on this Ray cluster (default: a local one "
                        "the command starts); without --replicas: one replica there")
    parser.add_argument("--prefill-replicas", type=int, default=None,
                        help="with --replicas N: run P of the N replicas as prefill workers whose KV the other N - P "
                             "load and decode from (prefill/decode disaggregation, blocks through Ray's object store)")
    parser.add_argument("--kv-share", action="store_true",
                        help="with --replicas N: the replicas publish the KV blocks of their prefix hits through Ray's "
                             "object store and load each other's instead of recomputing them (off by default)")


_PAGED_FLAGS = ("block_size", "num_blocks", "max_cache_bytes", "max_num_seqs", "max_num_batched_tokens",
                "max_prefill_tokens_per_step", "max_prefill_step_time_ratio", "kv_cache_dtype", "kv_offload_dir",
                "kv_offload_bytes")


def paged_overrides(args) -> dict:
    """The `PagedConfig` fields the serve flags set (the others keep their defaults)."""
    overrides = {name: getattr(args, name) for name in _PAGED_FLAGS if getattr(args, name) is not None}
    if args.no_prefix_caching:
        overrides["enable_prefix_caching"] = False
    return overrides


def read_chat_template(args) -> str | None:
    """`--chat-template FILE`'s text, or None; `CliError` when the file is missing."""
    from hf_paged.errors import CliError

    if args.chat_template is None:
        return None
    file = Path(args.chat_template)
    if not file.is_file():
        raise CliError(f"chat template file {args.chat_template!r} not found")
    return file.read_text()


def checked_paged_config(args):
    """The `PagedConfig` the serve flags ask for, after the checks both `serve` and `serve --replicas` make; bad
    values raise `CliError` naming the flag or field, before any model or cluster starts."""
    from hf_paged.config import PagedConfig
    from hf_paged.errors import CliError

    if args.max_waiting is not None and args.max_waiting < 0:
        raise CliError(f"--max-waiting must be >= 0 (0: no bound), got {args.max_waiting}")
    if not 0 <= args.max_cache_retention < float("inf"):
        raise CliError(f"--max-cache-retention must be a number of seconds >= 0, got {args.max_cache_retention}")
    if getattr(args, "max_stop_sequences", None) is not None and args.max_stop_sequences < 0:
        raise CliError(f"--max-stop-sequences must be >= 0 (0: no bound), got {args.max_stop_sequences}")
    if getattr(args, "max_request_bytes", None) is not None and args.max_request_bytes < 1024:
        raise CliError(f"--max-request-bytes must be >= 1024, got {args.max_request_bytes}")
    if args.shutdown_timeout < 0:
        raise CliError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    for flag in ("header_timeout", "send_timeout"):
        value, name = getattr(args, flag, None), "--" + flag.replace("_", "-")
        if value is not None and not 0 < value < float("inf"):
            raise CliError(f"{name} must be a number of seconds > 0, got {value}")
        if value is not None and args.replicas is not None:
            raise CliError(f"{name} is for one server; with --replicas Ray Serve's proxy takes the connections: "
                           "leave it out")
    if getattr(args, "max_request_bytes", None) is not None and args.replicas is not None:
        raise CliError("--max-request-bytes is for one server; with --replicas the gateway and the replicas take the "
                       "default (32 MiB): leave it out")
    if args.kv_offload_dir is not None and args.replicas is not None:  # each replica would count the files alone
        raise CliError("--kv-offload-dir is for one engine; with --replicas leave it out")
    if args.served_model_name is not None and not args.served_model_name.strip():  # (it fell back to the default)
        raise CliError("--served-model-name is empty: give the model id clients send, or leave it out to use the "
                       "model's own name")
    if getattr(args, "prefill_replicas", None) is not None and args.replicas is None:
        raise CliError("--prefill-replicas splits the replicas of --replicas N: give --replicas too (e.g. "
                       "--replicas 3 --prefill-replicas 1)")
    if getattr(args, "kv_share", False) and args.replicas is None:
        raise CliError("--kv-share shares hot prefixes between the replicas of --replicas N: give --replicas too "
                       "(e.g. --replicas 2 --kv-share)")
    try:
        return PagedConfig(**paged_overrides(args))
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def serve_api_key(args) -> str | None:
    """The key clients must send: `--api-key`, else `HF_PAGED_API_KEY`, else None (no key); `CliError` when empty."""
    from hf_paged.errors import CliError

    key = getattr(args, "api_key", None)
    source = "--api-key"
    if key is None:
        key, source = os.environ.get(API_KEY_ENV), API_KEY_ENV
    if key is not None and not key.strip():
        raise CliError(f"{source} is empty: give the key clients must send, or leave it out to serve without one")
    return key


def check_generation_config(args) -> None:
    """`--generation-config` is auto, vllm or a directory holding a generation_config.json (`CliError` else)."""
    from hf_paged.errors import CliError
    from hf_paged.serving.defaults import check_mode

    try:
        check_mode(getattr(args, "generation_config", "auto"))
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run_serve(args) -> int:
    """Run the server until SIGTERM / Ctrl-C. Raises `CliError` for bad arguments (one line, exit status 2)."""
    from hf_paged.errors import CliError

    try:
        import uvicorn

        from hf_paged.serving import ServerSettings, build_app
        from hf_paged.serving.connections import (
            DEFAULT_HEADER_TIMEOUT_S,
            DEFAULT_SEND_TIMEOUT_S,
            header_deadline_protocol,
        )
    except ImportError as exc:
        raise CliError(f"serve needs the serve extra ({exc.name} is missing): pip install 'hf_paged[serve]'") from None
    config = checked_paged_config(args)
    check_generation_config(args)
    api_key = serve_api_key(args)
    template = read_chat_template(args)
    log_to_stderr(args.log_level)  # before the app is built: it logs the checkpoint's sampling defaults
    engine, tokenizer, name = _start_engine(args, config)
    if template is not None:
        tokenizer.chat_template = template
    settings = ServerSettings(model_name=args.served_model_name or name, max_waiting=args.max_waiting,
                              max_cache_retention_s=args.max_cache_retention, generation_config=args.generation_config,
                              api_key=api_key)
    if getattr(args, "max_request_bytes", None) is not None:
        settings.max_request_bytes = args.max_request_bytes
    if getattr(args, "max_stop_sequences", None) is not None:
        settings.max_stop_sequences = args.max_stop_sequences
    app = build_app(engine, tokenizer, settings)
    # At --shutdown-timeout the engine's requests are aborted, so each client gets a 503 error body (or an error event
    # on its stream); uvicorn's own cancel (a bare 500, a cut stream) only comes FLUSH_GRACE_S later, for a handler
    # that does not end after its abort (a fixed margin before uvicorn's cancel lost that race on a loaded machine).
    header_timeout = getattr(args, "header_timeout", None) or DEFAULT_HEADER_TIMEOUT_S
    send_timeout = getattr(args, "send_timeout", None) or DEFAULT_SEND_TIMEOUT_S
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                               timeout_graceful_shutdown=args.shutdown_timeout + FLUSH_GRACE_S,
                               http=header_deadline_protocol(header_timeout, send_timeout_s=send_timeout))
    timer = threading.Timer(args.shutdown_timeout, engine.loop.abort_all)
    timer.daemon = True  # never keeps the process alive
    server = _ExitZeroServer(uv_config, on_exit=timer.start)
    sock = _bind(args.host, args.port)  # before the URL is printed: a busy port is one error line, `--port 0` real
    host, port = sock.getsockname()[:2]
    logging.getLogger("hf_paged").info("serving %s on http://%s:%d", settings.model_name,
                                       f"[{host}]" if ":" in host else host, port)
    _freeze_heap()  # before serving
    server.run(sockets=[sock])
    _save_kv_cache(engine)
    _freeze_heap()  # and before the interpreter's own last collections
    return 130 if server.interrupted else 0


def _freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's sight (`gc.freeze`, as vLLM does once its engine
    has started). The model and the KV pool's bookkeeping are ~560k long-lived objects: after SIGTERM the
    interpreter's last collections walked them all and kept the process alive ~10 s after uvicorn had finished
    (2-core machine under load; ~1 s with the freeze); a full collection while serving would walk them too (0.8 s).
    """
    gc.collect()
    gc.freeze()


def end_process(code: int) -> NoReturn:
    """End the `hf-paged serve` process with `code` once the server has stopped and its cache is saved, flushing
    logging and the standard streams but skipping the interpreter's finalization. The heap is frozen
    (`_freeze_heap`), so the finalizer's collections never reach the reference cycles of modules imported before the
    freeze: triton's bindings (imported by torch._dynamo) then print a page of "nanobind: leaked ..." at exit.
    Unfreezing first would let them be collected, at ~3 s of exit on a 2-core machine (0.2 s this way)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a closed or broken pipe: nothing more can be written anyway)
            pass
    os._exit(code)


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (port 0: one the system picks), or `CliError` naming why not."""
    from hf_paged.errors import CliError

    if not 0 <= port <= 65535:
        raise CliError(f"--port must be from 0 to 65535 (0: any free port), got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError, OverflowError) as exc:
        raise CliError(f"--host {host!r} is not an address this machine can listen on ({exc}); use e.g. 127.0.0.1 or "
                       "0.0.0.0") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except (OSError, OverflowError) as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port} ({getattr(exc, 'strerror', None) or exc}); choose another --port (0: any free "
                       "one) or --host") from None
    sock.set_inheritable(True)
    return sock


def _save_kv_cache(engine) -> None:
    """With the disk tier, write what the prefix cache still holds, so a restart finds it (not only the evicted)."""
    connector = engine.scheduler.kv_transfer
    if connector is not None and connector.save_on == "evict":
        with engine.lock:
            saved = connector.save_cached()
        logging.getLogger("hf_paged").info("wrote %d cached KV blocks to the disk tier", saved)


def log_to_stderr(level: str) -> None:
    """hf_paged's own lines (the URL, the shutdown) on stderr at `--log-level`, beside uvicorn's."""
    root = logging.getLogger("hf_paged")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s -- %(message)s"))
        root.addHandler(handler)
    root.setLevel(level.upper())


FLUSH_GRACE_S = 10.0  # after the abort at --shutdown-timeout: time for handlers to write their error and close


class _ExitZeroServer:
    """uvicorn's server, except that a SIGTERM'd server exits 0 after its graceful stop (uvicorn re-raises the
    signal once stopped, which would end the process with 143)."""

    def __new__(cls, config, on_exit):
        import uvicorn

        class Server(uvicorn.Server):
            interrupted = False

            def handle_exit(self, sig, frame) -> None:
                if not self.should_exit:
                    on_exit()
                super().handle_exit(sig, frame)
                if sig == signal.SIGTERM:
                    self._captured_signals.remove(sig)
                else:
                    self.interrupted = True

        return Server(config)


def _start_engine(args, config):
    from hf_paged.serving.engine_thread import engine_in_own_thread

    name = args.model if args.model is not None else "hf-paged/tiny-lm"
    engine, tokenizer = engine_in_own_thread(lambda: _load(args), config)
    return engine, tokenizer, name


def _load(args):
    from hf_paged.api.loading import load_model

    if args.model is None:
        from hf_paged.api.models import default_model

        dtype = "auto" if args.dtype == "auto" else getattr(__import__("torch"), args.dtype)  # auto: its float16
        return default_model(dtype=dtype, device=args.device)
    return load_model(args.model, args.device, args.dtype)
