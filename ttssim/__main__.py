"""`python -m ttssim --variant fixed [--host 127.0.0.1] [--port 8091] [--device cpu] [--config configs/sim/x.yaml]`.

`--control PATH` (or TTS_PREDICTOR_CONTROL=PATH, like the vLLM plugin) hands the variant and the sync observer's
on/off switch to a control file that can change while the server runs (docs/control.md); `--variant` is then
optional and the file wins.

Port 0 picks a free port; `--port-file` receives the bound port once the server accepts connections (tests and the A/B
runner use it instead of guessing free ports). SIGTERM/SIGINT stop it cleanly within a couple of seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from tts_predictor.control import ENV_CONTROL  # plain Python: a bad argument fails before torch is imported
from tts_predictor.domain import VARIANT_NAMES

from . import __version__, heldout

BANNER = """\
################################################################################################
##  SIMULATED vllm-omni 0.16.0 -- ttssim {version}: NOT a real TTS server.
##  The predictor variant '{variant}' runs for real on {device}; everything else (talker, code2wav,
##  GPU stalls, audio) is MODELLED from {config}. /metrics says backend="simulated".
##  {heldout}
##  Listening on http://{host}:{port}
################################################################################################"""




def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ttssim", description="Simulated vllm-omni 0.16.0 Qwen3-TTS server.")
    p.add_argument("--variant", choices=VARIANT_NAMES, help="required unless a control file names the variant")
    p.add_argument("--control", default=None, metavar="PATH",
                   help="control file (default: $TTS_PREDICTOR_CONTROL): variant and observe switch at step boundaries")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: not reachable from outside)")
    p.add_argument("--port", type=int, default=8091, help="0 = any free port (see --port-file)")
    p.add_argument("--device", default="cpu", help="where the variant's tensors live: cpu or cuda[:N]")
    p.add_argument("--config", default=None, help="simulator YAML (default: built-in = configs/sim/default.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set model.extra_step_pct=5 --set faults.cut_stream_every=3")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.control is None:
        args.control = os.environ.get(ENV_CONTROL, "").strip() or None
    if args.variant is None and args.control is None:
        p.error(f"--variant is required without a control file (--control or {ENV_CONTROL})")
    return args


async def serve(args, cfg, control=None) -> None:
    import torch
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from .engine import Engine
    from .faults import Faults
    from .server import make_app

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"ttssim: --device {args.device} but torch sees no CUDA device")
    torch.set_num_threads(1)  # tiny tensors; more threads only contend with the event loop
    registry = CollectorRegistry()
    engine = Engine(cfg, args.variant, args.device, registry, control=control)
    if control is not None and args.variant not in (None, engine.variant):
        logging.getLogger("ttssim").warning("--variant %s is overridden by the control file %s (variant %r)",
                                            args.variant, args.control, engine.variant)
    args.variant = "controlled" if control is not None else args.variant
    engine.metrics.predictor.info.info({
        "variant": args.variant, "backend": "simulated", "device": str(engine.device),
        "control": args.control or "", "pid": str(os.getpid()),
        "server": f"ttssim {__version__} (simulates vllm-omni 0.16.0)", "model": cfg.model.name,
        "config": str(args.config or "built-in default"),
        "sync_sample": f"every {cfg.server.sync_sample_every_steps} steps, {cfg.server.sync_sample_calls} call(s)",
    })
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # like vllm serve, the port is bound only once the model is "loaded": the modelled start-up (model.startup_s)
    # plus the slow-readiness fault's extra delay
    if cfg.model.startup_s:
        print(f"ttssim: modelled start-up, binding the port in {cfg.model.startup_s:g} s", flush=True)
    if cfg.faults.slow_readiness_s:
        print(f"ttssim FAULT: slow readiness, binding the port {cfg.faults.slow_readiness_s:g} s later", flush=True)
    wait_s = cfg.model.startup_s + cfg.faults.slow_readiness_s
    if wait_s:
        try:
            await asyncio.wait_for(stop.wait(), wait_s)
            return
        except asyncio.TimeoutError:
            pass
    app = make_app(engine, Faults(cfg.faults), {"variant": args.variant})
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, shutdown_timeout=1.0)
    await site.start()
    port = runner.addresses[0][1]
    print("ttssim: all stages initialized (the engine steps; vllm-omni logs its own line here)", flush=True)
    print(BANNER.format(heldout=heldout.line(), version=__version__, variant=engine.variant, device=engine.device,
                        host=args.host, port=port,
                        config=args.config or "the built-in defaults (= configs/sim/default.yaml)"), flush=True)
    if control is not None:
        print(f"##  Control file {args.control}: variant and sync observer switch at step boundaries "
              f"(now {control.setting}).", flush=True)
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, args.port_file)
    await stop.wait()
    print("ttssim: stopping", flush=True)
    await runner.cleanup()


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .config import load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except (OSError, ValueError) as e:
        print(f"ttssim: bad configuration: {e}", file=sys.stderr)
        return 2
    control = None
    if args.control is not None:
        from tts_predictor.control import ControlChannel, ControlError, ControlFile

        try:
            control = ControlChannel(ControlFile(args.control), logging.getLogger("ttssim.control"))
        except ControlError as e:
            print(f"ttssim: bad control file: {e}", file=sys.stderr)
            return 2
    try:
        asyncio.run(serve(args, cfg, control))
    except OSError as e:  # port in use, address not available
        print(f"ttssim: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
