"""The model's tokenizer, from its GGUF vocabulary: byte-level BPE (GPT-2 style), offline, no tokenizer package.

    tokenizer = ByteBPE(vocab)              vocab: gguf_model.GGUFVocab (tokens, merges, token types, pre)
    tokenizer.encode(text) -> [ids]         control tokens written in the text (<|im_start|>) are one id each
    tokenizer.decode(ids) -> str

Encoding, as Hugging Face's `tokenizers` does for SmolLM2 (pre-tokenizer "smollm"):

    text ─ split out control tokens ─ each digit alone ─ GPT-2's regex (words with their leading space,
    numbers, punctuation runs, whitespace) ─ each piece's UTF-8 bytes as printable characters (GPT-2's
    bytes_to_unicode: a space is 'Ġ', a newline 'Ċ') ─ BPE: merge the adjacent pair of lowest merge rank
    until none is in the merge table ─ token ids

A test compares it with the tokenizer transformers builds from the same GGUF file.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache

from .gguf_model import GGUFVocab

# GGUF pre-tokenizer name -> the regexes applied in turn (each splits the pieces of the one before)
PRE_TOKENIZERS = {
    "smollm": (r"\p{N}",
               r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
}
CONTROL = 3  # GGUF token type of control tokens (<|im_start|>, <|im_end|>, <|endoftext|>, ...)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters: printable Latin-1 bytes map to
    themselves, the other 68 to U+0100 upwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class ByteBPE:
    """Byte-level BPE over a GGUF vocabulary (see the module docstring)."""

    def __init__(self, vocab: GGUFVocab) -> None:
        import regex  # third-party `regex`: \p{L} / \p{N} classes (kvcalc[model] installs it)

        if vocab.pre not in PRE_TOKENIZERS:
            raise ValueError(f"pre-tokenizer {vocab.pre!r} is not implemented; known: {', '.join(PRE_TOKENIZERS)}")
        self.ids = {token: i for i, token in enumerate(vocab.tokens)}
        self.tokens = vocab.tokens
        self.ranks = {tuple(merge.split(" ", 1)): rank for rank, merge in enumerate(vocab.merges)}
        self.control = {vocab.tokens[i]: i for i, t in enumerate(vocab.token_types) if t == CONTROL}
        self._control_split = regex.compile("(" + "|".join(regex.escape(t) for t in
                                                            sorted(self.control, key=len, reverse=True)) + ")")
        self._splits = [regex.compile(p) for p in PRE_TOKENIZERS[vocab.pre]]
        self._byte_chars = bytes_to_unicode()
        self._char_bytes = {c: b for b, c in self._byte_chars.items()}
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self._control_split.split(text):
            if part in self.control:
                ids.append(self.control[part])
            elif part:
                for piece in self._pieces(part):
                    ids.extend(self._bpe(piece))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out, pending = [], bytearray()
        for i in ids:
            token = self.tokens[i]
            if token in self.control:
                out.append(pending.decode("utf-8", errors="replace") + token)
                pending = bytearray()
            else:
                pending.extend(self._char_bytes[c] for c in token)
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def _pieces(self, text: str) -> list[str]:
        """The pre-tokenizer: each regex splits every piece into its matches and the text between them."""
        pieces = [text]
        for pattern in self._splits:
            split = []
            for piece in pieces:
                at = 0
                for m in pattern.finditer(piece):
                    if m.start() > at:
                        split.append(piece[at : m.start()])
                    split.append(m.group())
                    at = m.end()
                if at < len(piece):
                    split.append(piece[at:])
            pieces = split
        return pieces

    def _bpe(self, piece: str) -> tuple[int, ...]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        word = [self._byte_chars[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            pairs = [(self.ranks.get((a, b)), i) for i, (a, b) in enumerate(itertools.pairwise(word))]
            rank, i = min(((r, i) for r, i in pairs if r is not None), default=(None, 0))
            if rank is None:
                break
            a, b = word[i], word[i + 1]
            merged, j = [], 0
            while j < len(word):  # merge every occurrence of the pair, left to right
                if j + 1 < len(word) and word[j] == a and word[j + 1] == b:
                    merged.append(a + b)
                    j += 2
                else:
                    merged.append(word[j])
                    j += 1
            word = merged
        ids = tuple(self.ids[w] for w in word)
        self._cache[piece] = ids
        return ids
