"""CosyVoice2's front end: tokenizers, text normalisation, Whisper log-mel, Kaldi fbank, prompt audio, voice files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")
require("kaldi_native_fbank")

from rtvoice.engine.errors import InvalidRequest  # noqa: E402
from rtvoice.engine.models.cosyvoice2 import frontend  # noqa: E402
from rtvoice.engine.models.cosyvoice2.frontend import (  # noqa: E402
    COSYVOICE2_SPECIAL_TOKENS,
    END_OF_PROMPT,
    ByteFallbackTokenizer,
    PromptFeatures,
    QwenTokenizer,
    kaldi_fbank,
    load_prompt_audio,
    load_tokenizer,
    normalize_segment,
    whisper_log_mel,
)
from rtvoice.engine.models.cosyvoice2.voice_store import SavedVoice, VoiceStore, valid_voice_id  # noqa: E402
from rtvoice.engine.text import normalize  # noqa: E402
from tests.cosyvoice2.standins import tone_wav  # noqa: E402

# -- tokenizers -----------------------------------------------------------------------------------


def test_byte_fallback_maps_bytes_and_special_tokens() -> None:
    tok = ByteFallbackTokenizer(1024)
    assert tok.encode("Hi") == [72, 105]
    assert tok.encode("é") == list("é".encode())
    assert tok.encode(f"Be calm.{END_OF_PROMPT}") == list(b"Be calm.") + [
        256 + COSYVOICE2_SPECIAL_TOKENS.index(END_OF_PROMPT)
    ]
    assert max(tok.encode("漢字 [laughter] text")) < 1024
    with pytest.raises(ValueError):
        ByteFallbackTokenizer(200)


def test_fixture_without_tokenizer_files_falls_back(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger=frontend.log.name):
        assert load_tokenizer(model_dir / "CosyVoice-BlankEN", 1024).kind == "byte-fallback"
    assert "FALLBACK tokenizer meant for test fixtures" in caplog.text  # never silently


def test_tokenizer_files_load_the_qwen_tokenizer(tmp_path: Path) -> None:
    """A directory with tokenizer files gets transformers' tokenizer plus CosyVoice2's special tokens, in order."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "[UNK]": 3, "hello": 4, "world": 5, ".": 6}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path, 10_000)
    assert isinstance(tok, QwenTokenizer)
    assert tok.encode("hello world.") == [4, 5, 6]
    # The first two special tokens exist already; the new ones get ids after the vocabulary, in order.
    assert tok.encode(END_OF_PROMPT) == [len(vocab)]
    assert tok.encode("[mn]") == [len(vocab) + len(COSYVOICE2_SPECIAL_TOKENS) - 3]
    assert tok.encode("hello<|endofprompt|>world") == [4, len(vocab), 5]


# -- text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("I have 3 cats.", "I have three cats."),
        (
            "It costs 1,250 points, about 12.5 each.",
            "It costs one thousand two hundred fifty points, about twelve point five each.",
        ),
        ("The 21st and 2nd floors, 50% off.", "The twenty first and second floors, fifty percent off."),
        ("<|en|>Call 911 now.", "<|en|>Call 911 now."),  # markup: left as the reference leaves it
        ("你好 世界，", "你好世界。"),
        ("【通知】今天 是 星期五", "通知今天是星期五"),
        ("今天是2024年3月5日", "今天是二零二四年三月五日"),  # wetext's Chinese grammar, as the reference's front end
    ],
)
def test_what_the_lm_reads_of_a_segment(text: str, expected: str) -> None:
    """The segmenter's spoken form ("mul": English or Chinese grammars), then the model's own clean-up."""
    assert normalize_segment(normalize(text, "mul")) == expected


def test_normalize_segment_leaves_text_sent_as_is_unspelled() -> None:
    assert normalize_segment(normalize("I have 3 cats.", "mul", spoken=False)) == "I have 3 cats."


# -- features -------------------------------------------------------------------------------------


def _signal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


def _slaney_mel(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """librosa.filters.mel's defaults (Slaney scale and area normalisation), in float64, for reference."""

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        f = np.asarray(f, dtype=np.float64)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27), f * 3 / 200)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * 200 / 3)

    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0), hz_to_mel(sr / 2), n_mels + 2))
    lower = (freqs[None] - edges[:-2, None]) / np.diff(edges)[:-1, None]
    upper = (edges[2:, None] - freqs[None]) / np.diff(edges)[1:, None]
    return np.maximum(0, np.minimum(lower, upper)) * (2 / (edges[2:] - edges[:-2]))[:, None]


def test_whisper_log_mel_follows_its_definition() -> None:
    """Checked against numpy: reflect-padded 400-point periodic Hann STFT, hop 160, the last frame dropped,
    Slaney mel (128), log10 floored at 1e-10 and at max - 8, (x + 4) / 4. (Also checked once against
    openai-whisper's own log_mel_spectrogram: identical.)"""
    x = _signal(16000 * 3 + 123)
    ours = whisper_log_mel(x)
    padded = np.pad(x.astype(np.float64), 200, mode="reflect")
    frames = 1 + (len(padded) - 400) // 160
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    spec = np.stack([np.fft.rfft(padded[i * 160 : i * 160 + 400] * window) for i in range(frames)], axis=1)
    power = np.abs(spec[:, :-1]) ** 2
    log_mel = np.log10(np.maximum(_slaney_mel(16000, 400, 128) @ power, 1e-10))
    expected = (np.maximum(log_mel, log_mel.max() - 8) + 4) / 4
    assert ours.shape == (1, 128, len(x) // 160) and ours.dtype == np.float32
    assert np.abs(ours[0] - expected).max() < 1e-4


def _kaldi_fbank_reference(x: np.ndarray) -> np.ndarray:
    """Kaldi's compute-fbank-feats defaults as torchaudio.compliance.kaldi.fbank(num_mel_bins=80, dither=0) runs
    them, in float64: 25 ms frames every 10 ms (snip edges), DC removed, pre-emphasis 0.97, Povey window,
    512-point power spectrum, 80 triangular bins on the mel scale 1127 ln(1 + f/700) from 20 Hz to 8 kHz,
    natural log floored at float32's epsilon."""
    x = x.astype(np.float64)
    frames = 1 + (len(x) - 400) // 160
    mel = lambda f: 1127 * np.log(1 + np.asarray(f) / 700)  # noqa: E731
    centres = np.linspace(mel(20), mel(8000), 82)
    bin_mel = mel(np.arange(256) * 16000 / 512)
    left, centre, right = centres[:-2, None], centres[1:-1, None], centres[2:, None]
    banks = np.maximum(0, np.minimum((bin_mel - left) / (centre - left), (right - bin_mel) / (right - centre)))
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 399)) ** 0.85
    out = np.empty((frames, 80))
    for i in range(frames):
        frame = x[i * 160 : i * 160 + 400].copy()
        frame -= frame.mean()
        frame = frame - 0.97 * np.concatenate([frame[:1], frame[:-1]])
        power = np.abs(np.fft.rfft(frame * window, 512)) ** 2
        out[i] = np.log(np.maximum(banks @ power[:256], np.finfo(np.float32).eps))
    return out - out.mean(axis=0)


def test_kaldi_fbank_matches_kaldis_definition() -> None:
    """kaldi-native-fbank as configured equals Kaldi's fbank, mean-normalised over time, within float32 rounding.
    (Checked once against torchaudio.compliance.kaldi.fbank: 4.3e-4 max over 10 s, where torchaudio's own
    float32 and float64 results differ by 3.5e-4.)"""
    x = _signal(16000 * 2 + 77, seed=1)
    ours = kaldi_fbank(x)
    expected = _kaldi_fbank_reference(x)
    assert ours.shape == expected.shape == (1 + (len(x) - 400) // 160, 80)
    assert np.abs(ours.mean(axis=0)).max() < 1e-4
    assert np.abs(ours - expected).max() < 1e-3


# -- prompt audio ---------------------------------------------------------------------------------


def _encode(fmt: str, codec: str, rate: int, seconds: float = 1.5) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout="stereo")
        t = np.arange(int(rate * seconds)) / rate
        samples = (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(np.stack([samples, samples]), format="fltp", layout="stereo")
        frame.rate = rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt,codec", [("flac", "flac"), ("mp3", "libmp3lame"), ("ogg", "libopus")])
def test_prompt_audio_decodes_any_format(fmt: str, codec: str) -> None:
    rate = 48000
    audio = load_prompt_audio(_encode(fmt, codec, rate), 24000)
    assert audio.source_rate == rate and abs(audio.duration_s - 1.5) < 0.1
    assert abs(len(audio.audio_16k) / 16000 - audio.duration_s) < 0.01
    assert abs(len(audio.audio_model_rate) / 24000 - audio.duration_s) < 0.01


def test_prompt_audio_mixes_channels_down() -> None:
    mono = load_prompt_audio(tone_wav(1.0, 16000, 1), 24000)
    stereo = load_prompt_audio(tone_wav(1.0, 16000, 2), 24000)
    assert np.array_equal(mono.audio_16k, stereo.audio_16k)


@pytest.mark.parametrize(
    "data,code",
    [
        (b"", "invalid_audio"),
        (b"RIFF....WAVEfmt nonsense", "invalid_audio"),
        (tone_wav(frontend.MIN_PROMPT_SECONDS - 0.2), "audio_too_short"),
        (tone_wav(frontend.MAX_PROMPT_SECONDS + 1, frontend.MIN_PROMPT_RATE), "audio_too_long"),
        (tone_wav(2.0, amplitude=0.0), "audio_silent"),
        (tone_wav(2.0, amplitude=0.0005), "audio_silent"),
        (tone_wav(2.0, frontend.MIN_PROMPT_RATE // 2), "sample_rate_too_low"),
    ],
)
def test_bad_prompt_audio(data: bytes, code: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        load_prompt_audio(data, 24000)
    assert raised.value.code == code and raised.value.param == "prompt_wav"


def test_features_have_two_mel_frames_per_token(serving_service) -> None:  # type: ignore[no-untyped-def]
    service = serving_service
    audio = service.prompt_audio(tone_wav(2.3, 44100))
    features = service.prompt_features(audio, "Say 2 words.")
    tokens, feat = features.speech_tokens, features.speech_feat
    assert tokens.dtype == torch.int32 and tokens.shape[0] == 1 and 50 <= tokens.shape[1] <= 58
    assert feat.shape == (1, 2 * tokens.shape[1], 80)
    assert features.embedding.shape == (1, 192)
    assert features.prompt_text == "Say two words."
    assert features.prompt_text_ids.tolist() == [list(b"Say two words.")]
    # The speech tokenizer saw Whisper's mel of the 16 kHz audio: ceil(frames / 4) tokens before trimming.
    assert len(service.frontend.speech_tokens(audio.audio_16k)) == -(-whisper_log_mel(audio.audio_16k).shape[2] // 4)


# -- voice files ----------------------------------------------------------------------------------


def test_voice_store_round_trip(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    features = PromptFeatures(
        torch.randn(1, 192),
        torch.randint(0, 6561, (1, 10), dtype=torch.int32),
        torch.randn(1, 20, 80),
        "Hello.",
        torch.tensor([[1, 2, 3]], dtype=torch.int32),
    )
    store.save(SavedVoice("anna.v2", "Anna", "en", "test voice", features))
    (loaded,) = store.load_all()
    assert (loaded.voice_id, loaded.name, loaded.language, loaded.description) == (
        "anna.v2",
        "Anna",
        "en",
        "test voice",
    )
    for name in ("embedding", "speech_tokens", "speech_feat", "prompt_text_ids"):
        assert torch.equal(getattr(loaded.features, name), getattr(features, name))
    (tmp_path / "voices" / "broken.pt").write_bytes(b"not a voice")
    assert [v.voice_id for v in store.load_all()] == ["anna.v2"]  # a bad file is skipped
    store.delete("anna.v2")
    assert not store.exists("anna.v2")


@pytest.mark.parametrize(
    "voice_id,ok",
    [
        ("alice", True),
        ("a-b_c.1", True),
        ("A" * 64, True),
        ("A" * 65, False),
        ("../x", False),
        ("", False),
        (".hidden", False),
        ("x.", False),
        ("a b", False),
        ("voice/1", False),
    ],
)
def test_voice_ids(voice_id: str, ok: bool) -> None:
    assert valid_voice_id(voice_id) is ok


def test_prompts_within_the_limits_are_taken() -> None:
    """The shortest and longest prompts allowed, at the lowest rate allowed, decode (the limits refuse only
    what lies past them)."""
    for seconds in (frontend.MIN_PROMPT_SECONDS + 0.1, frontend.MAX_PROMPT_SECONDS - 0.5):
        prompt = load_prompt_audio(tone_wav(seconds, frontend.MIN_PROMPT_RATE), 24000)
        assert len(prompt.audio_16k) == pytest.approx(seconds * 16000, abs=16)
