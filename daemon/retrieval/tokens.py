"""The tokens every index of the search library sees, for English and Chinese alike.

Rule kept here: a document and a query go through the same function, so they meet on the same
tokens; `TOKENIZER_VERSION` and `STEMMER_VERSION` change whenever the tokens do, so an index saved
with other tokens (a LexicalDump) is rebuilt rather than trusted.

Tokens (`tokenize`): the text is lower-cased and split into runs of letters and digits (Unicode
\\w without the underscore, so ``failed_strategies`` gives two tokens); English stop words are
dropped; a run of CJK ideographs or kana (no spaces between words) gives its character bigrams,
or the character itself when the run is one character long, so "机器学习" matches
"机器学习很有用" (bigrams 机器, 器学, 学习). With `stem=True` (tier 4 and the conversation tier;
the skills registry keeps plain tokens) each token made only of Latin letters is then reduced by
the Snowball English stemmer ("running", "runs" -> "run"); digits, CJK bigrams and other scripts
are kept as they are. Documents and queries go through the same function, so they meet on the
same stems. PyStemmer (C, libstemmer) rather than snowballstemmer (pure Python): on LoCoMo's
33,671 tokens it stems 2.9 M distinct words/s against 0.039 M (75x), with identical output.
"""

from __future__ import annotations

import re

import Stemmer

# Bump when `tokenize` or STOP_WORDS change: saved dumps then no longer match and are rebuilt.
TOKENIZER_VERSION = 1


# Bump when `stem_tokens` changes (another stemmer, other tokens stemmed); a dump records it.
STEMMER_VERSION = 1


_STEMMER = Stemmer.Stemmer("english")  # keeps a cache of 10,000 words; not shared across threads


# Lucene's English stop set plus pronouns, auxiliaries and question words: frequent, carrying
# little meaning, and BM25's idf would weigh them down anyway. Not "may": it is also a month.
STOP_WORDS = frozenset(
    """
    a an and are as at be but by for if in into is it no not of on or such that the their then
    there these they this to was will with
    i me my we our ours us you your yours he him his she her hers its itself them theirs
    am been being were has have had having do does did doing
    what which who whom whose when where why how
    so than too very can could would should shall might must just also
    from about over under again further here all any both each few more most other some own same
    only s t d ll m re ve o y
    """.split()
)


_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"


_TOKEN_RE = re.compile(f"([{_CJK}]+)|([^\\W_{_CJK}]+)")


# ASCII fast path (4x faster than the regex): letters and digits kept and lower-cased, every
# other byte becomes a space; the same tokens as the regex gives for ASCII text.
_ASCII_TABLE = bytes(
    c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122) else 32 for c in range(256)
)


def tokenize(text: str, stop_words: frozenset[str] = STOP_WORDS) -> list[str]:
    """Lower-case word tokens without stop words; CJK runs as character bigrams (see module)."""
    if text.isascii():
        words = text.encode("ascii").translate(_ASCII_TABLE).decode("ascii").split()
        return [w for w in words if w not in stop_words]
    if "\n" in text:  # no token spans a line: the ASCII lines (a long content, say) take the fast path
        return [token for line in text.split("\n") for token in tokenize(line, stop_words)]
    out: list[str] = []
    for cjk, word in _TOKEN_RE.findall(text.lower()):
        if word:
            if word not in stop_words:
                out.append(word)
        elif len(cjk) == 1:
            out.append(cjk)
        else:
            out.extend(cjk[i : i + 2] for i in range(len(cjk) - 1))
    return out


def _is_latin_word(token: str) -> bool:
    return token.isascii() and token.isalpha()


def stem_tokens(tokens: list[str], stemmer: Stemmer.Stemmer | None = None) -> list[str]:
    """Each token of Latin letters by its Snowball English stem; every other token unchanged.
    `stemmer`: the caller's own (PyStemmer objects are not thread-safe); default this module's."""
    st = stemmer or _STEMMER
    latin = [i for i, t in enumerate(tokens) if _is_latin_word(t)]
    if not latin:
        return tokens
    if len(latin) == len(tokens):
        result: list[str] = st.stemWords(tokens)
        return result
    stems = st.stemWords([tokens[i] for i in latin])
    out = list(tokens)
    for i, s in zip(latin, stems):
        out[i] = s
    return out


def stemmed_tokenize(
    text: str, stop_words: frozenset[str] = STOP_WORDS, stemmer: Stemmer.Stemmer | None = None
) -> list[str]:
    """`tokenize`, then `stem_tokens` (what an index with stem=True sees)."""
    return stem_tokens(tokenize(text, stop_words), stemmer)


def name_tokens(name: str) -> frozenset[str]:
    """The tokens that name a person in a query: the name's unstemmed tokens, stop words and
    one-letter tokens left out ("Caroline" -> {"caroline"}; "Dr. Li Wei" -> {"dr", "li", "wei"})."""
    return frozenset(t for t in tokenize(name) if len(t) > 1)
