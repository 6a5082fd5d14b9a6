"""The ``rtvoice`` command line: ``say`` into every format, from standard input, reproducibly; help and version."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import av
import numpy as np
import pytest

from rtvoice.app import cli
from rtvoice.app.settings import Settings
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from testkit.servers import seed_caches
from tests.audio import decode, parse_wav, rms, same_speech
from tests.engine_output import synthesize

REPO = Path(__file__).resolve().parent.parent
TEXT = "Hello from the command line."


def rtvoice(
    *args: str, stdin: str | None = None, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rtvoice.app.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def best_correlation(reference: np.ndarray, test: np.ndarray, max_lag: int) -> float:
    """The highest normalised correlation of ``test`` against ``reference`` over shifts up to ``max_lag`` samples
    (lossy codecs add a delay of their own)."""
    reference = reference.astype(np.float64)
    test = test.astype(np.float64)
    best = -1.0
    for lag in range(max_lag + 1):
        n = min(len(reference), len(test) - lag)
        a, b = reference[:n], test[lag : lag + n]
        best = max(best, float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12)))
    return best


def test_say_writes_a_wav_with_its_size(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    result = rtvoice("say", TEXT, "-o", str(out), "--sample-rate", "16000", "--seed", "7")
    assert result.returncode == 0, result.stderr
    header, samples = parse_wav(out.read_bytes())
    assert header["sample_rate"] == 16000
    assert header["data_size"] == 2 * len(samples) and header["riff_size"] == 36 + 2 * len(samples)
    assert same_speech(samples, synthesize(TEXT, seed=7, sample_rate=16000))
    assert "wav" in result.stdout and str(out) in result.stdout


def test_say_reads_standard_input_and_defaults_to_out_wav(tmp_path: Path) -> None:
    result = rtvoice("say", "-", "--seed", "4", stdin=TEXT + "\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _, samples = parse_wav((tmp_path / "out.wav").read_bytes())
    assert same_speech(samples, synthesize(TEXT + "\n", seed=4))


def imported(stderr: str, module: str) -> bool:
    """Whether ``module`` was imported, from what ``PYTHONPROFILEIMPORTTIME`` wrote."""
    return any(
        line.startswith("import time:") and line.split("|")[-1].strip() == module for line in stderr.splitlines()
    )


def test_say_keeps_the_voices_split_and_a_second_run_imports_no_onnx(tmp_path: Path) -> None:
    """The first run on a data directory splits the voice (onnx) and keeps the stages there; the next reads them back,
    without onnx (1.4 s of every start), and says the same: to the rounding of another chunking, since the chunks
    follow each run's budget of time (in CI the runs first differed at sample 3425, by one step)."""
    data = tmp_path / "data"
    seed_caches(data)  # what was timed; the split is made here
    shutil.rmtree(data / "stages", ignore_errors=True)
    env = {"RTVOICE_DATA_DIR": str(data), "PYTHONPROFILEIMPORTTIME": "1"}
    outputs = []
    for run in ("made", "read back"):
        out = tmp_path / f"{run}.pcm"
        result = rtvoice("say", TEXT, "-o", str(out), "--seed", "3", env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        assert imported(result.stderr, "onnx") == (run == "made"), run
        assert imported(result.stderr, "rtvoice.engine.models.piper.voice"), "the voice was not loaded"
        outputs.append(out.read_bytes())
    assert [p.name for p in (data / "stages").glob("*/stages.json")], "no split kept"
    made, read_back = (np.frombuffer(output, "<i2") for output in outputs)
    assert same_speech(read_back, made) and rms(made) > 0.02


def test_say_with_a_seed_is_reproducible(tmp_path: Path) -> None:
    """The same seed gives the same samples in another process; another seed, others."""
    out = tmp_path / "seeded.pcm"
    assert rtvoice("say", TEXT, "-o", str(out), "--seed", "5").returncode == 0
    samples = np.frombuffer(out.read_bytes(), "<i2")
    assert same_speech(samples, synthesize(TEXT, seed=5))
    other = synthesize(TEXT, seed=6)
    assert len(other) != len(samples) or not np.array_equal(other, samples)


@pytest.mark.parametrize(
    ("extension", "container", "codec", "rate"),
    [
        (".mp3", "mp3", "mp3", 22050),
        (".opus", "ogg", "opus", 48000),  # written at 24 kHz (Opus does not take 22050 Hz); Opus decodes at 48 kHz
        (".ogg", "ogg", "opus", 48000),
        (".flac", "flac", "flac", 22050),
        (".aac", "aac", "aac", 22050),
    ],
)
def test_say_picks_the_format_from_the_extension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extension: str, container: str, codec: str, rate: int
) -> None:
    out = tmp_path / f"speech{extension}"
    fmt = cli.output_format(out)
    assert fmt is not None
    request = SynthesisRequest(text=TEXT, options=SynthesisOptions(seed=3))
    asyncio.run(cli.say_to_file(request, out, fmt))  # what `rtvoice say TEXT -o out --seed 3` runs
    written_rate = 24000 if codec == "opus" else rate
    assert f"{fmt.name}, " in (printed := capsys.readouterr().out) and f"at {written_rate} Hz" in printed
    with av.open(str(out)) as probe:
        assert probe.format.name.split(",")[0] == container
        assert probe.streams.audio[0].codec_context.name.startswith(codec)
    samples, decoded_rate = decode(out.read_bytes())
    reference = synthesize(TEXT, seed=3, sample_rate=rate).astype(np.float32) / 32767
    assert decoded_rate == rate
    assert abs(len(samples) - len(reference)) / rate < 0.1  # codec padding only
    if codec == "flac":
        assert same_speech(np.round(samples * 32767).astype(np.int16), (reference * 32767).round().astype(np.int16))
    else:
        assert best_correlation(reference, samples, max_lag=rate // 10) > 0.95
        assert 0.5 < rms(samples) / rms(reference) < 2.0


def test_say_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    unknown = rtvoice("say", TEXT, "-o", str(tmp_path / "speech.txt"))
    assert unknown.returncode == 2 and "cannot tell the format" in unknown.stderr and ".mp3" in unknown.stderr
    opus_rate = rtvoice("say", TEXT, "-o", str(tmp_path / "speech.opus"), "--sample-rate", "22050")
    assert opus_rate.returncode == 2 and "24000" in opus_rate.stderr
    assert list(tmp_path.iterdir()) == []


def test_say_rejects_empty_text_and_bad_ssml(tmp_path: Path) -> None:
    result = rtvoice("say", "  ", "-o", str(tmp_path / "x.wav"))
    assert result.returncode == 2 and "empty" in result.stderr
    document = "<speak>One <s>two</speak>"
    bad = rtvoice("say", document, "-o", str(tmp_path / "x.wav"))
    assert bad.returncode == 2, bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    at = document.index("</speak>")
    assert line == f"rtvoice: invalid SSML at character {at}: </speak> closes <s> (opened at 11)", line
    assert list(tmp_path.iterdir()) == []  # not even a partial file


def test_version() -> None:
    result = rtvoice("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0 and result.stdout.strip() == f"rtvoice {version}"


def test_serve_help_describes_each_option_with_its_default() -> None:
    result = rtvoice("serve", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps lines
    for flag, (field, _) in cli.SERVE_OPTIONS.items():
        setting = Settings.model_fields[field]
        default = setting.get_default(call_default_factory=True)
        shown = "none" if default is None else "empty" if default == "" else str(default)
        first_words = " ".join((setting.description or "").replace("``", "").split()[:4])
        assert flag in text and first_words in text, flag
        assert f"Default: {shown}, or RTVOICE_{field.upper()}" in text, flag


def test_say_help_names_the_default_output_and_formats() -> None:
    text = " ".join(rtvoice("say", "--help").stdout.split())
    assert "default: out.wav" in text
    for extension in cli.EXTENSION_FORMATS:
        assert extension in text
    assert "'-' reads it from standard input" in text and "--seed" in text


POTATO_IPA = "p\u0259t\u02c8e\u026a\u027eo\u028a"


def test_say_reads_with_a_lexicon_file_and_warns_of_what_it_ignored(tmp_path: Path) -> None:
    """``--lexicon`` takes a PLS file (whatever its language: the request names it) or an uploaded lexicon's id;
    what the text's markup asked for and was not done is a warning on standard error."""
    lexicon = tmp_path / "potato.pls"
    lexicon.write_text(
        '<?xml version="1.0" encoding="UTF-8"?><lexicon version="1.0" '
        'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" xml:lang="fr-FR">'
        f"<lexeme><grapheme>tomato</grapheme><phoneme>{POTATO_IPA}</phoneme></lexeme></lexicon>",
        encoding="utf-8",
    )
    out = tmp_path / "lexicon.pcm"
    text = "I like tomato soup."
    result = rtvoice("say", text, "-o", str(out), "--seed", "5", "--lexicon", str(lexicon))
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    samples = np.frombuffer(out.read_bytes(), "<i2")
    assert same_speech(samples, synthesize(f"I like [[{POTATO_IPA}]] soup.", seed=5))
    assert not same_speech(samples, synthesize(text, seed=5))
    ignored = rtvoice("say", '<speak><foo>Hi</foo> <prosody pitch="high">there</prosody>.</speak>', "-o", str(out))
    assert ignored.returncode == 0, ignored.stderr
    (line,) = ignored.stderr.strip().splitlines()
    assert line.startswith("rtvoice: warning:") and line.endswith("<foo>; <prosody pitch>"), line
    unknown = rtvoice("say", text, "-o", str(out), "--lexicon", "lex_missing")
    assert unknown.returncode == 2 and "unknown lexicon 'lex_missing'" in unknown.stderr
    missing = rtvoice("say", text, "-o", str(out), "--lexicon", str(tmp_path / "missing.pls"))
    assert missing.returncode == 2 and "no lexicon file" in missing.stderr
    broken = tmp_path / "broken.pls"
    broken.write_text("<lexicon>", encoding="utf-8")
    bad = rtvoice("say", text, "-o", str(out), "--lexicon", str(broken))
    assert bad.returncode == 2 and "broken.pls" in bad.stderr, bad.stderr
