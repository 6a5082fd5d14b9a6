"""The ``rtvoice`` command: ``serve`` runs the server, ``say`` writes speech to a WAV file."""

from __future__ import annotations

import argparse
import asyncio
import sys
from importlib.util import find_spec
from pathlib import Path

from rtvoice.engine.audio.encoding import wav_header
from rtvoice.engine.errors import EngineError
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.settings import Settings


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from rtvoice.app.main import create_app

    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "voices_dir": args.voices_dir,
                                   "default_voice": args.voice}.items() if v is not None}
    settings = Settings(**overrides)
    if settings.cosyvoice_dir is not None:
        from rtvoice.engine.models.cosyvoice2.files import CosyVoiceDirError, check_model_dir

        try:  # fail now, not after the server is up and /readyz waits forever
            check_model_dir(settings.cosyvoice_dir)
        except CosyVoiceDirError as error:
            print(f"rtvoice: {error}", file=sys.stderr)
            sys.exit(2)
        missing = [name for name in ("torch", "transformers", "kaldi_native_fbank") if find_spec(name) is None]
        if missing:
            print(f"rtvoice: RTVOICE_COSYVOICE_DIR is set but {', '.join(missing)} is not installed; install with: "
                  "pip install torch==2.13.0 && pip install -e '.[cosyvoice]'", file=sys.stderr)
            sys.exit(2)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level)


async def _say(text: str, output: Path, voice_name: str | None, sample_rate: int | None, speed: float) -> None:
    from rtvoice.engine.engine import Engine

    engine = Engine(Settings(warmup=False))
    await engine.start()
    try:
        engine.check_text(text, "text")
        voice = engine.resolve_voice(voice_name)
        stream = engine.open_stream(voice, SynthesisOptions(speed=speed), sample_rate, text=text)
        pcm = b"".join([chunk.tobytes() async for chunk in stream.audio()])
    finally:
        await engine.stop()
    output.write_bytes(wav_header(stream.sample_rate, len(pcm)) + pcm)
    print(f"wrote {output}: {len(pcm) / 2 / stream.sample_rate:.2f} s at {stream.sample_rate} Hz")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rtvoice", description="Real-time text-to-speech server.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the server (settings from RTVOICE_* and .env)")
    serve_parser.add_argument("--host")
    serve_parser.add_argument("--port", type=int)
    serve_parser.add_argument("--voices-dir", type=Path)
    serve_parser.add_argument("--voice", help="default voice id")
    say_parser = commands.add_parser("say", help="speak text into a WAV file")
    say_parser.add_argument("text")
    say_parser.add_argument("-o", "--output", type=Path, default=Path("out.wav"))
    say_parser.add_argument("--voice")
    say_parser.add_argument("--sample-rate", type=int)
    say_parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args)
        return
    try:
        asyncio.run(_say(args.text, args.output, args.voice, args.sample_rate, args.speed))
    except EngineError as error:
        print(f"rtvoice: {error.message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
