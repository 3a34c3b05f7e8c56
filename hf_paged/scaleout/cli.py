"""`hf-paged serve --replicas N [--address ADDR]`: the same server, as N engine replicas on Ray Serve."""

from __future__ import annotations

__all__ = ["run_replicas"]


def run_replicas(args) -> int:
    """Deploy the replicas with the single-server flags and serve until Ctrl-C. Raises `CliError` for bad arguments
    (checked before Ray starts)."""
    from hf_paged.cli_common import CliError
    from hf_paged.config import PagedConfig
    from hf_paged.serving.server import paged_overrides, read_chat_template

    replicas = 1 if args.replicas is None else args.replicas  # --address alone: one replica on that cluster
    if replicas < 1:
        raise CliError(f"--replicas must be >= 1, got {replicas}")
    if args.no_prefix_caching:
        raise CliError("--replicas routes by the replicas' prefix caches: drop --no-prefix-caching")
    if args.max_waiting is not None and args.max_waiting < 1:
        raise CliError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    paged = paged_overrides(args)  # --no-prefix-caching is refused above: the replicas route by their caches
    try:
        PagedConfig(**paged)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    template = read_chat_template(args)
    try:
        import ray
        from ray import serve

        from hf_paged.scaleout.deploy import deploy
    except ImportError as exc:
        raise CliError(f"--replicas needs the ray extra ({exc.name} is missing): pip install 'hf_paged[ray]'") from None
    try:
        deploy(args.model, replicas=replicas, address=args.address, host=args.host, port=args.port,
               served_model_name=args.served_model_name, device=args.device, dtype=args.dtype, paged=paged,
               max_waiting=args.max_waiting, chat_template=template, blocking=True)
    except KeyboardInterrupt:
        return 130
    finally:
        if ray.is_initialized():
            serve.shutdown()
    return 0
