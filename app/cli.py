"""The ``rtvoice`` command: ``serve`` runs the server, ``say`` writes speech to an audio file."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import ValidationError

from rtvoice.app import logs
from rtvoice.app.fields import MAX_SPEED, MIN_SPEED
from rtvoice.app.info import package_version
from rtvoice.app.settings import Settings
from rtvoice.engine.audio.encoding import FORMATS, AudioFormat, wav_header
from rtvoice.engine.audio.resample import SUPPORTED_SAMPLE_RATES
from rtvoice.engine.errors import EngineError
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest

log = logging.getLogger("rtvoice.cli")

SERVE_OPTIONS: dict[str, tuple[str, type]] = {
    "--host": ("host", str),
    "--port": ("port", int),
    "--voices-dir": ("voices_dir", Path),
    "--voice": ("default_voice", str),
    "--cosyvoice-dir": ("cosyvoice_dir", Path),
    "--log-level": ("log_level", str),
    "--wyoming": ("wyoming_uri", str),
}
"""``serve``'s options: each overrides the setting of that name (``RTVOICE_<NAME>``)."""

EXTENSION_FORMATS = {
    ".wav": "wav",
    ".mp3": "mp3",
    ".opus": "opus",
    ".ogg": "opus",
    ".flac": "flac",
    ".aac": "aac",
    ".pcm": "pcm",
    ".raw": "pcm",
}
"""``say``'s output format, by the output file's extension."""


def _setting_help(field_name: str) -> str:
    """The setting's description and default, as the settings class has them."""
    field = Settings.model_fields[field_name]
    description = (field.description or "").replace("``", "").split("\n\n")[0].replace("\n", " ")
    default = field.get_default(call_default_factory=True)
    shown = "none" if default is None else "empty" if default == "" else str(default)
    return f"{description} Default: {shown}, or RTVOICE_{field_name.upper()}.".replace("%", "%%")


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        print(f"rtvoice: invalid setting: {problems}", file=sys.stderr)
        sys.exit(2)


def serve(args: argparse.Namespace) -> None:
    from rtvoice.app import server
    from rtvoice.app.main import create_app

    overrides = {field: getattr(args, field) for field, _ in SERVE_OPTIONS.values() if getattr(args, field) is not None}
    settings = _settings(**overrides)
    logs.configure(settings.log_level)
    from rtvoice.engine.voices import VoiceLoadError, check_cosyvoice_setup

    try:  # fail now, not after the server is up and /readyz waits forever
        check_cosyvoice_setup(settings)
    except VoiceLoadError as error:
        print(f"rtvoice: {error}", file=sys.stderr)
        sys.exit(2)
    if settings.grpc_port is not None:
        from rtvoice.app.cosyvoice_grpc import require_grpc

        try:  # fail now with what to install, not in the middle of start-up
            require_grpc()
        except RuntimeError as error:
            print(f"rtvoice: {error}", file=sys.stderr)
            sys.exit(2)
    if settings.wyoming_zeroconf:
        from rtvoice.app.wyoming.discovery import require_zeroconf

        try:  # fail now with what to install, not in the middle of start-up
            require_zeroconf()
        except RuntimeError as error:
            print(f"rtvoice: {error}", file=sys.stderr)
            sys.exit(2)
    log.info(
        "rtvoice %s starting; voices load in the background (/readyz answers 200 when they are ready)",
        package_version(),
    )
    try:
        app = create_app(settings)
    except ValueError as error:  # e.g. RTVOICE_API_KEYS with a key listed twice
        print(f"rtvoice: invalid setting: {error}", file=sys.stderr)
        sys.exit(2)
    code = server.run(app, settings)  # logging configured above, by logs.configure
    if code:
        sys.exit(code)


def output_format(path: Path) -> AudioFormat | None:
    """The format the extension of ``path`` names; None for an extension ``say`` does not write."""
    name = EXTENSION_FORMATS.get(path.suffix.lower())
    return FORMATS[name] if name else None


def output_rate(fmt: AudioFormat, voice_rate: int) -> int:
    """The voice's own rate, or for a codec that does not take it the next rate up that it does."""
    if fmt.sample_rates is None or voice_rate in fmt.sample_rates:
        return voice_rate
    return min((rate for rate in fmt.sample_rates if rate >= voice_rate), default=max(fmt.sample_rates))


def lexicon_files(names: Sequence[str]) -> tuple[list[Path], tuple[str, ...]]:
    """``say``'s ``--lexicon`` values: the PLS files among them (loaded with the engine, as ``RTVOICE_LEXICONS``'
    are), and the ids a request names, in order (a file's is its name without the extension, as a startup
    lexicon's); anything else is the id of a lexicon uploaded to the data directory. ValueError for a path that
    names no file."""
    files: list[Path] = []
    ids: list[str] = []
    for name in names:
        path = Path(name)
        if path.is_file():
            files.append(path)
            ids.append(path.stem)
        elif path.suffix.lower() in (".pls", ".xml") or os.sep in name:
            raise ValueError(f"no lexicon file {name!r}")
        else:
            ids.append(name)
    return files, tuple(ids)


async def say_to_file(request: SynthesisRequest, output: Path, fmt: AudioFormat, lexicons: Sequence[Path] = ()) -> None:
    """Speak ``request`` into ``output`` in ``fmt`` with a voice of the settings' engine (what ``rtvoice say`` runs),
    with the PLS files ``lexicons`` loaded beside the settings' own; without a sample rate, the voice's own or the
    next that ``fmt`` takes. What the text's markup asked for that was not done is a warning on standard error."""
    from rtvoice.app.streaming import audio_body
    from rtvoice.engine.audio.encoding import create_encoder
    from rtvoice.engine.engine import Engine

    settings = _settings(warmup=False)
    if lexicons:
        named = [Path(path.strip()) for path in settings.lexicons.split(",") if path.strip()]
        added = [path for path in lexicons if path.resolve() not in {known.resolve() for known in named}]
        settings = settings.model_copy(update={"lexicons": ",".join(str(path) for path in [*named, *added])})
    engine = Engine(settings)
    await engine.start()
    try:
        voice = engine.validate(request)
        rate = request.sample_rate or output_rate(fmt, voice.sample_rate)
        stream = engine.open_stream(replace(request, sample_rate=rate))
        # Written beside the output and renamed at the end: a failure leaves no half-written file.
        handle, partial = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
        try:
            with os.fdopen(handle, "wb") as file:
                async for data in audio_body(stream, create_encoder(fmt.name, rate)):
                    file.write(data)
                if fmt.name == "wav":  # a file, unlike a response, can say its size
                    data_bytes = file.tell() - len(wav_header(rate))
                    file.seek(0)
                    file.write(wav_header(rate, data_bytes))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(partial, 0o666 & ~umask)  # mkstemp's file is private; the output is an ordinary file
            os.replace(partial, output)
        except BaseException:
            os.unlink(partial)
            raise
    finally:
        await engine.stop()
    print(f"wrote {output}: {fmt.name}, {stream.emitted_s:.2f} s at {rate} Hz, voice {voice.id}")
    if stream.ignored:
        print(
            f"rtvoice: warning: ignored in the text's markup: {'; '.join(stream.ignored)}",
            file=sys.stderr,
        )


def say(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    fmt = output_format(args.output)
    if fmt is None:
        parser.error(
            f"cannot tell the format of {str(args.output)!r} from its extension; use one of "
            f"{', '.join(EXTENSION_FORMATS)}"
        )
    if args.sample_rate is not None and fmt.sample_rates is not None and args.sample_rate not in fmt.sample_rates:
        parser.error(f"{fmt.name} takes sample rates {', '.join(map(str, fmt.sample_rates))}, not {args.sample_rate}")
    if not args.output.parent.is_dir():
        parser.error(f"{args.output.parent} is not a directory")
    try:
        files, lexicon_ids = lexicon_files(args.lexicon)
    except ValueError as error:
        parser.error(str(error))
    text = sys.stdin.read() if args.text == "-" else args.text
    logs.configure("warning")
    try:
        request = SynthesisRequest(
            text=text,
            voice=args.voice,
            options=SynthesisOptions(speed=args.speed, seed=args.seed),
            sample_rate=args.sample_rate,
            normalize=not args.no_normalize,
            text_type=args.input_type,
            lexicons=lexicon_ids,
        )
        asyncio.run(say_to_file(request, args.output, fmt, files))
    except EngineError as error:
        print(f"rtvoice: {error.message}", file=sys.stderr)
        sys.exit(2)
    except ValueError as error:  # a lexicon file that does not read (the engine's start says which)
        print(f"rtvoice: {error}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtvoice", description="Real-time text-to-speech server.")
    parser.add_argument("--version", action="version", version=f"rtvoice {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the server. Settings come from RTVOICE_* variables "
        "and a .env file in the working directory (see .env.example); these options override them.",
    )
    for flag, (field, kind) in SERVE_OPTIONS.items():
        annotation = Settings.model_fields[field].annotation
        choices = get_args(annotation) if get_origin(annotation) is Literal else None
        serve_parser.add_argument(
            flag,
            dest=field,
            type=kind,
            choices=choices,
            metavar=field.split("_")[-1].upper(),
            help=_setting_help(field),
        )
    say_parser = commands.add_parser(
        "say",
        help="speak text into an audio file (no server needed)",
        description="Speak text into an audio file, without a server, with the voices the settings name "
        "(RTVOICE_* variables and .env, as for serve).",
    )
    say_parser.add_argument("text", help="the text to speak; '-' reads it from standard input")
    say_parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("out.wav"),
        help="the file to write (default: out.wav). Its extension picks the format: .wav, .mp3, .opus or .ogg "
        "(Opus in Ogg), .flac, .aac (ADTS), .pcm or .raw (int16 little-endian mono, no header)",
    )
    say_parser.add_argument("--voice", help="a voice id or OpenAI voice name (default: the default voice)")
    say_parser.add_argument(
        "--sample-rate",
        type=int,
        choices=SUPPORTED_SAMPLE_RATES,
        metavar="RATE",
        help=f"output rate, one of {', '.join(map(str, SUPPORTED_SAMPLE_RATES))} (default: the voice's own; "
        "for .opus the next rate up that Opus takes)",
    )
    say_parser.add_argument("--speed", type=float, default=1.0, help=f"{MIN_SPEED} to {MAX_SPEED} (default: 1.0)")
    say_parser.add_argument("--seed", type=int, help="makes the voice's random draws reproducible (default: none)")
    say_parser.add_argument(
        "--no-normalize",
        action="store_true",
        help="read the text as written: no spoken forms for numbers, dates, units or abbreviations",
    )
    say_parser.add_argument(
        "--input-type",
        choices=("auto", "text", "ssml"),
        default="auto",
        help="what the text is: SSML when it starts with <speak (auto, the default), or forced either way",
    )
    say_parser.add_argument(
        "--lexicon",
        action="append",
        default=[],
        metavar="ID_OR_PLS_FILE",
        help="a pronunciation lexicon to read the text with: a W3C PLS file, or the id of one uploaded to the "
        "server's data directory (POST /v1/lexicons); repeat for more, first match winning",
    )
    say_parser.set_defaults(parser=say_parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
    else:
        say(args.parser, args)


if __name__ == "__main__":
    main()
