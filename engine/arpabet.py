"""CMU ARPAbet to IPA, for SSML's ``<phoneme alphabet="cmu-arpabet" ph="...">`` (ElevenLabs' dialect).

Piper's en_US voices were trained on espeak-ng's en-us phonemes, so the IPA is written the way espeak-ng writes it:
its inventory (ɑː, ɜː, ɚ, ɹ, ɡ...), length marks as their own characters, a stress mark right before the stressed
vowel ("tomato" is ``təmˈeɪtoʊ``, not ``təˈmeɪtoʊ``: the mark stands where the voice saw it in training), and an
unstressed final IY as ``i`` ("happy" ``hˈæpi``). What ARPAbet cannot say (espeak's flap in "water") stays as
written: T is ``t``.
"""

from __future__ import annotations

# A vowel's IPA by stress: (unstressed, stressed); ARPAbet's 1 and 2 both take the stressed quality.
_VOWELS: dict[str, tuple[str, str]] = {
    "AA": ("ɑː", "ɑː"),
    "AE": ("æ", "æ"),
    "AH": ("ə", "ʌ"),
    "AO": ("ɔː", "ɔː"),
    "AW": ("aʊ", "aʊ"),
    "AY": ("aɪ", "aɪ"),
    "EH": ("ɛ", "ɛ"),
    "ER": ("ɚ", "ɜː"),
    "EY": ("eɪ", "eɪ"),
    "IH": ("ɪ", "ɪ"),
    "IY": ("i", "iː"),
    "OW": ("oʊ", "oʊ"),
    "OY": ("ɔɪ", "ɔɪ"),
    "UH": ("ʊ", "ʊ"),
    "UW": ("uː", "uː"),
    # Beyond CMUdict's 39, in TIMIT's and others' ARPAbet.
    "AX": ("ə", "ə"),
    "AXR": ("ɚ", "ɚ"),
    "IX": ("ɪ", "ɪ"),
    "UX": ("uː", "uː"),
}
_CONSONANTS = {
    "B": "b",
    "CH": "tʃ",
    "D": "d",
    "DH": "ð",
    "F": "f",
    "G": "ɡ",
    "HH": "h",
    "JH": "dʒ",
    "K": "k",
    "L": "l",
    "M": "m",
    "N": "n",
    "NG": "ŋ",
    "P": "p",
    "R": "ɹ",
    "S": "s",
    "SH": "ʃ",
    "T": "t",
    "TH": "θ",
    "V": "v",
    "W": "w",
    "Y": "j",
    "Z": "z",
    "ZH": "ʒ",
    # Beyond CMUdict's 39.
    "DX": "ɾ",
    "EL": "əl",
    "EM": "əm",
    "EN": "ən",
    "Q": "ʔ",
    "WH": "w",
    "H": "h",
}
_STRESS_MARKS = {"0": "", "1": "ˈ", "2": "ˌ"}
VOWELS = frozenset(_VOWELS)
CONSONANTS = frozenset(_CONSONANTS)


def _split(symbol: str) -> tuple[str, str]:
    """A symbol's phone and its stress digit ("" where it has none): "EY1" -> ("EY", "1")."""
    upper = symbol.upper()
    if upper[-1:].isdigit():
        return upper[:-1], upper[-1]
    return upper, ""


def arpabet_to_ipa(phonemes: str) -> str:
    """ARPAbet symbols, separated by blanks (any case, stress digits 0/1/2 on vowels), as espeak-ng style IPA:
    "T AH0 M EY1 T OW2" -> "təmˈeɪtˌoʊ". A vowel without a digit is unstressed. ``ValueError`` names a symbol that
    is not ARPAbet, or a stress digit that is not 0, 1 or 2 or stands on a consonant."""
    symbols = phonemes.split()
    ipa: list[str] = []
    for k, symbol in enumerate(symbols):
        phone, stress = _split(symbol)
        if phone in _VOWELS:
            if stress not in ("", *_STRESS_MARKS):
                raise ValueError(f"ARPAbet symbol {symbol!r}: stress must be 0, 1 or 2")
            unstressed, stressed = _VOWELS[phone]
            said = stressed if stress in ("1", "2") else unstressed
            following = _split(symbols[k + 1])[0] if k + 1 < len(symbols) else ""
            if phone == "ER" and stress in ("1", "2") and following in _VOWELS:
                said += "ɹ"  # "hurry" HH ER1 IY0: espeak keeps the r before a vowel, hˈɜːɹi
            ipa.append(_STRESS_MARKS.get(stress, "") + said)
        elif phone in _CONSONANTS and not stress:
            ipa.append(_CONSONANTS[phone])
        elif phone in _CONSONANTS:
            raise ValueError(f"ARPAbet symbol {symbol!r}: a consonant carries no stress")
        else:
            raise ValueError(f"unknown ARPAbet symbol {symbol!r}")
    return "".join(ipa)
