from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.normalize import (
    NOSPACE,
    PUNCTUATION,
    SPACE,
    SYMBOL,
    WORD,
    CodePointBatch,
    Normalizer,
    casefold,
    classify,
)
from streamdedup.settings import NormalizeSettings

ONLY_UNICODE = NormalizeSettings(
    strip_retweet=False,
    strip_urls=False,
    strip_mentions=False,
    strip_hashtags=False,
    strip_ellipsis=False,
    collapse_punctuation=False,
)

# Characters that exercise NFKC and case folding: compatibility forms, ligatures, decomposed accents,
# Hangul jamo, characters folding to several, combining marks out of canonical order.
TRICKY = "aeAEß\u0301\u0308\u0316ﬁ…İΣςǅ\u0344\u0f73\u00a0\uff21\u2460\u1100\u1161\u11a8가\u0e2a\u0e35 x"


def normalize(text: str, **options: bool) -> str:
    return Normalizer(NormalizeSettings(**options)).normalize([text])[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ｆｕｌｌ　ｗｉｄｔｈ", "full width"),  # NFKC: full-width forms and ideographic space
        ("ﬁne ①", "fine 1"),  # NFKC: ligature, circled digit
        ("Straße", "strasse"),  # case folding to several code points
        ("ΣΊΣΥΦΟΣ", "σίσυφοσ"),
        ("cafe\u0301", "café"),  # NFKC composes the accent
        ("RT @user_1: Breaking NEWS", "breaking news"),
        ("rt @a: RT @b: the story", "the story"),  # retweets of retweets
        ("not RT @x here", "not rt here"),  # only a leading RT is a retweet marker
        ("see https://t.co/abc?x=1 and HTTP://EXAMPLE.org/Y now", "see and now"),
        ("visit www.example.com/page today", "visit today"),
        ("ping @bob and @alice_2!", "ping and"),
        ("mail a@b.com please", "mail a b com please"),  # an e-mail address is not a mention
        ("#Hashtag first, then #हिन्दी words", "first then words"),
        ("C# is a language", "c is a language"),  # '#' inside a word is not a hashtag
        ("truncated tweet wor… https://t.co/xyz", "truncated tweet wor"),
        # Artefacts longer than the scan's window (32 code points), and one running to the end of the text.
        ("read https://example.org/" + "a" * 80 + " now", "read now"),
        ("#" + "x" * 70 + " ok @" + "u_" * 40 + "!", "ok"),
        ("ends with www.example.com/" + "p" * 50, "ends with"),
        ("Hello,   world!!!  ", "hello world"),
        ("東京タワー、すごい！", "東京タワー すごい"),
        ("हिन्दी भाषा", "हिन्दी भाषा"),  # vowel signs (combining marks) stay inside their words
        ("", ""),
        ("   \t\n ", ""),
        ("😀😀 🎉", "😀😀 🎉"),  # symbols are not punctuation: they stay
    ],
)
def test_default_normalisation(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_accent_folding_keeps_indic_vowel_signs() -> None:
    assert normalize("Café naïve Ångström हिन्दी", strip_accents=True) == "cafe naive angstrom हिन्दी"
    assert normalize("Café", strip_accents=False) == "café"


def test_each_step_can_be_switched_off() -> None:
    text = "RT @a: Ｘ Straße https://t.co/q @b #c end…"
    assert Normalizer(NormalizeSettings(enabled=False)).normalize([text]) == [text]
    assert normalize(text, nfkc=False).startswith("ｘ strasse")
    assert normalize(text, casefold=False) == "X Straße end"
    assert normalize(text, strip_retweet=False) == "rt x strasse end"
    assert normalize(text, strip_urls=False) == "x strasse https t co q end"
    assert normalize(text, strip_mentions=False) == "x strasse b end"
    assert normalize(text, strip_hashtags=False) == "x strasse c end"
    assert normalize("a, b…  ", collapse_punctuation=False) == "a, b"
    assert normalize("a, b…  ", collapse_punctuation=False, strip_ellipsis=False) == "a, b...  "  # NFKC
    assert normalize("a, b...", collapse_punctuation=False) == "a, b"
    assert normalize("a, b.", collapse_punctuation=False) == "a, b."


def test_lone_surrogates_and_nul_are_kept_apart() -> None:
    texts = ["a\ud800b", "x\x00y", "", "z"]
    assert Normalizer().normalize(texts) == ["a\ud800b", "x y", "", "z"]


def test_empty_batch_and_type_errors() -> None:
    assert Normalizer().normalize([]) == []
    with pytest.raises(TypeError, match="text 1 is NoneType"):
        Normalizer().normalize(["ok", None])  # type: ignore[list-item]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(TRICKY) | st.characters(codec="utf-8"), max_size=12), max_size=6))
def test_nfkc_and_case_folding_match_python(texts: list[str]) -> None:
    expected = [unicodedata.normalize("NFKC", text.replace("\x00", " ")).casefold() for text in texts]
    assert Normalizer(ONLY_UNICODE).normalize(texts) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(
            alphabet=st.sampled_from("ab @#:/.…wWhtps _,!東京😀\u0301") | st.characters(codec="utf-8"), max_size=30
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_document_normalises_the_same_in_any_batch(texts: list[str]) -> None:
    together = Normalizer().normalize(texts)
    alone = [Normalizer().normalize([text])[0] for text in texts]
    assert together == alone


def test_casefold_on_code_points_matches_python() -> None:
    everything = "".join(chr(c) for c in range(0x20000) if not 0xD800 <= c < 0xE000)
    code_points = np.frombuffer(everything.encode("utf-32-le"), dtype="<u4")
    assert casefold(code_points).astype("<u4").tobytes().decode("utf-32-le") == everything.casefold()


def test_code_point_classes() -> None:
    text = "a1 ,東😀\u0301é\u0301"
    classes = classify(np.frombuffer(text.encode("utf-32-le"), dtype="<u4")).tolist()
    # a, 1: word; space; comma: punctuation; 東: no-space script; 😀 and its joiner: symbol; é and its mark: word
    assert classes == [WORD, WORD, SPACE, PUNCTUATION, NOSPACE, SYMBOL, SYMBOL, WORD, WORD]


def test_code_point_batch_layout() -> None:
    batch = CodePointBatch.from_texts(["ab", "", "c"])
    assert batch.code_points.tolist() == [ord("a"), ord("b"), 0, 0, ord("c"), 0]
    assert batch.starts.tolist() == [0, 3, 4]
    assert batch.lengths.tolist() == [2, 0, 1]
    assert batch.texts() == ["ab", "", "c"]
