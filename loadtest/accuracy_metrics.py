"""Scoring OCR text against ground truth: character error rate (CER) and word F1, after the same
normalisation on both sides (rapidfuzz for the edit distance). Normalisation: Unicode NFC (not
NFKC: a full-width colon in English text is an error a reader notices); typographic quotes and
dashes to ASCII; no space before , . ; : ? ! nor next to a CJK character; runs of spaces to one;
lines joined in reading order. CER = edit distance / truth length, summed over pages."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import astuple, dataclass

from rapidfuzz.distance import Levenshtein

_TRANSLATE = str.maketrans("\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u00b4\u2013\u2014\u2212",
                           "''''\"\"\"'---", "\u00ad")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:?!])")
_SPACES = re.compile(r"[ \t\u00a0\u3000]+")
_WORD = re.compile(r"[\w]+(?:[.,'\-][\w]+)*", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_CJK_CHARS = "\u3000-\u303f\u3400-\u9fff\uf900-\ufaff\uff00-\uffef"
_SPACE_BY_CJK = re.compile(rf"(?<=[{_CJK_CHARS}]) +| +(?=[{_CJK_CHARS}])")


def normalize_lines(lines: list[str]) -> str:
    """One string per page, lines joined by a space: where a line breaks is layout."""
    text = unicodedata.normalize("NFC", " ".join(lines)).translate(_TRANSLATE)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", _SPACES.sub(" ", text))
    return _SPACE_BY_CJK.sub("", text).strip()


def words(text: str) -> list[str]:
    """Latin words and numbers as written; each CJK character on its own (Chinese has no
    spaces, and the model may or may not put one between characters). \\w+ holds no spaces."""
    return [part for token in _WORD.findall(text)
            for part in (token if _CJK.search(token) else [token])]


@dataclass
class Score:
    """Summed over pages: truth characters, edits, words in the truth, read, and in both."""
    chars: int = 0
    edits: int = 0
    truth_words: int = 0
    ocr_words: int = 0
    matched_words: int = 0

    def __add__(self, other: Score) -> Score:
        return Score(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @property
    def cer(self) -> float:
        return self.edits / self.chars if self.chars else 0.0

    @property
    def word_f1(self) -> float:
        if not self.truth_words and not self.ocr_words:
            return 1.0
        precision = self.matched_words / self.ocr_words if self.ocr_words else 0.0
        recall = self.matched_words / self.truth_words if self.truth_words else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def score_page(ocr_lines: list[str], truth_lines: list[str]) -> Score:
    ocr, truth = normalize_lines(ocr_lines), normalize_lines(truth_lines)
    ocr_words, truth_words = Counter(words(ocr)), Counter(words(truth))
    return Score(len(truth), Levenshtein.distance(ocr, truth), truth_words.total(),
                 ocr_words.total(), (ocr_words & truth_words).total())


def changed_lines(ocr_lines: list[str], reference_lines: list[str]) -> int:
    """How many lines differ from a reference run's (0: the setting did not alter the text)."""
    ocr, reference = Counter(ocr_lines), Counter(reference_lines)
    return max((ocr - reference).total(), (reference - ocr).total())
