"""Sparse SimHash, as htm.core's SimHashDocumentEncoder: a fixed number of active bits out of ``size``.

Each token is hashed with SHAKE256 (an XOF, so ``size`` may be anything) into ``size`` bits read most
significant first; a set bit adds the token's weight to that bit's sum and a clear bit subtracts it; the
``active_bits`` largest sums become the output, ties going to the lowest index. As in htm.core:

- a string is split on whitespace, a sequence of strings is taken as the tokens;
- ``case_sensitivity`` False lower-cases tokens, excludes and vocabulary keys;
- ``vocabulary`` maps tokens to integer weights; without ``encode_orphans`` tokens outside it are dropped,
  with it they weigh 1;
- ``frequency_floor`` / ``frequency_ceiling`` drop a token's occurrences up to the floor-th and from the
  ceiling-th on, within one document (0: no limit);
- ``token_similarity`` also hashes every character of a token (weighted by the vocabulary's weight for the
  character, else the token's; the ceiling applies per token), and the token then weighs 1.5 times as much,
  truncated to an integer, as in htm.core.

Differences, on purpose: characters are Unicode code points (htm.core iterates bytes, splitting UTF-8);
all ``size`` hash bits are used (htm.core always leaves the last one clear); a document where no token is
left after filtering encodes to all zeros like an empty one (htm.core sets the first ``active_bits``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

__all__ = ["SimHashDocumentEncoder"]

_DOCUMENT_END = "\x00"


class SimHashDocumentEncoder:
    """Encodes documents (a string, or a list of token strings) into sparse 0/1 arrays of ``size`` bits."""

    def __init__(
        self,
        size: int,
        active_bits: int = 0,
        sparsity: float = 0.0,
        *,
        case_sensitivity: bool = False,
        encode_orphans: bool = False,
        excludes: Sequence[str] = (),
        frequency_ceiling: int = 0,
        frequency_floor: int = 0,
        token_similarity: bool = False,
        vocabulary: Mapping[str, int] | None = None,
    ) -> None:
        if (active_bits > 0) == (sparsity > 0.0):
            raise ValueError("give exactly one of active_bits and sparsity")
        if not 0.0 <= sparsity <= 1.0:
            raise ValueError(f"sparsity must be between 0 and 1, got {sparsity}")
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        if frequency_floor < 0 or frequency_ceiling < 0:
            raise ValueError("frequency_floor and frequency_ceiling must not be negative")
        if frequency_ceiling > 0 and frequency_floor > 0 and frequency_ceiling <= frequency_floor:
            raise ValueError("frequency_ceiling must be greater than frequency_floor")
        vocabulary = dict(vocabulary or {})
        if encode_orphans and not vocabulary:
            raise ValueError("encode_orphans needs a vocabulary")
        if any(not isinstance(weight, int) or weight < 0 for weight in vocabulary.values()):
            raise ValueError("vocabulary weights must be non-negative integers")
        if sparsity > 0.0:
            active_bits = round(size * sparsity)
        if not 0 < active_bits < size:
            raise ValueError(f"active_bits must be between 1 and size - 1 ({size - 1}), got {active_bits}")
        self.size = size
        self.active_bits = active_bits
        self.case_sensitivity = case_sensitivity
        self.encode_orphans = encode_orphans
        self.frequency_ceiling = frequency_ceiling
        self.frequency_floor = frequency_floor
        self.token_similarity = token_similarity
        fold = (lambda token: token) if case_sensitivity else str.lower
        self.excludes = frozenset(fold(token) for token in excludes)
        self.vocabulary = {fold(token): weight for token, weight in vocabulary.items()}
        self._signs: dict[str, np.ndarray] = {}

    def encode(self, document: str | Sequence[str]) -> np.ndarray:
        """uint8 array of ``size`` with exactly ``active_bits`` ones (all zeros when no token counts)."""
        return self.encode_batch([document])[0]

    def encode_batch(self, documents: Sequence[str | Sequence[str]]) -> np.ndarray:
        """uint8 (len(documents), size), vectorised over every token occurrence of the batch."""
        tokens, owners = self._tokens(documents)
        if tokens:
            unique, inverse = np.unique(np.array(tokens, dtype=str), return_inverse=True)
            distinct = [str(token) for token in unique]
        else:
            distinct, inverse = [], np.zeros(0, dtype=np.int64)
        token_ids = np.asarray(inverse, dtype=np.int64)

        weights = np.array([self._weight(token) for token in distinct], dtype=np.int64)
        kept = weights[token_ids] >= 0 if len(distinct) else np.zeros(0, dtype=bool)
        token_ids, owners = token_ids[kept], owners[kept]
        occurrence = _running_count(owners, token_ids)
        kept = np.ones(len(token_ids), dtype=bool)
        if self.frequency_floor > 0:
            kept &= occurrence > self.frequency_floor
        if self.frequency_ceiling > 0:
            kept &= occurrence < self.frequency_ceiling
        token_ids, owners = token_ids[kept], owners[kept]
        token_weights = weights[token_ids]

        contribution_owners = [owners]
        contribution_weights = [token_weights]
        contribution_strings = [token_ids]
        strings = list(distinct)
        if self.token_similarity and len(token_ids):
            char_owners, char_weights, char_strings = self._characters(
                distinct, token_ids, owners, token_weights, strings
            )
            contribution_owners.append(char_owners)
            contribution_weights.append(char_weights)
            contribution_strings.append(char_strings)
            # As htm.core: the token then weighs 1.5 times as much, truncated to an integer.
            contribution_weights[0] = (token_weights * 3) // 2
        owner = np.concatenate(contribution_owners)
        weight = np.concatenate(contribution_weights)
        string = np.concatenate(contribution_strings)
        signs = self._sign_table(strings)
        result = np.zeros((len(documents), self.size), dtype=np.uint8)
        if not len(owner):
            return result
        order = np.argsort(owner, kind="stable")
        owner, weight, string = owner[order], weight[order], string[order]
        starts = np.flatnonzero(np.diff(owner, prepend=-1))
        sums = np.add.reduceat(signs[string] * weight[:, None], starts, axis=0)
        # The active_bits largest sums, ties to the lowest index (a stable sort of the negated sums).
        top = np.argsort(-sums, axis=1, kind="stable")[:, : self.active_bits]
        result[owner[starts][:, None], top] = 1
        return result

    def _tokens(self, documents: Sequence[str | Sequence[str]]) -> tuple[list[str], np.ndarray]:
        """Every token occurrence of the batch, in order, and the document it belongs to."""
        per_document = []
        for document in documents:
            if isinstance(document, str):
                text = document if self.case_sensitivity else document.lower()
                per_document.append(text.replace(_DOCUMENT_END, " ").split())
            else:
                per_document.append([token if self.case_sensitivity else token.lower() for token in document])
        counts = np.fromiter(map(len, per_document), dtype=np.int64, count=len(per_document))
        tokens = list(chain.from_iterable(per_document))
        return tokens, np.repeat(np.arange(len(per_document), dtype=np.int64), counts)

    def _weight(self, token: str) -> int:
        """A token's weight, or -1 when it does not count (excluded, or an orphan not encoded)."""
        if token in self.excludes:
            return -1
        if self.vocabulary:
            if token in self.vocabulary:
                return self.vocabulary[token]
            return 1 if self.encode_orphans else -1
        return 1

    def _characters(
        self,
        distinct: list[str],
        token_ids: np.ndarray,
        owners: np.ndarray,
        token_weights: np.ndarray,
        strings: list[str],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The character contributions of token occurrences: owners, weights and string ids (new
        characters are appended to ``strings``)."""
        index = {string: position for position, string in enumerate(strings)}
        lengths = np.array([len(token) for token in distinct], dtype=np.int64)
        spelled = []
        for token in distinct:
            for char in token:
                if char not in index:
                    index[char] = len(strings)
                    strings.append(char)
            spelled.append([index[char] for char in token])
        spelling = np.array(list(chain.from_iterable(spelled)), dtype=np.int64)
        spelling_starts = np.cumsum(lengths) - lengths
        counts = lengths[token_ids]
        occurrence = np.repeat(np.arange(len(token_ids)), counts)
        rank = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        chars = spelling[np.repeat(spelling_starts[token_ids], counts) + rank]
        weights = np.repeat(token_weights, counts)
        # A character listed in the vocabulary weighs its own weight, whatever token it is in.
        listed = {index[char]: weight for char, weight in self.vocabulary.items() if char in index and len(char) == 1}
        if listed:
            keys = np.fromiter(listed.keys(), dtype=np.int64)
            values = np.fromiter(listed.values(), dtype=np.int64)
            known = np.isin(chars, keys)
            order = np.argsort(keys)
            weights[known] = values[order][np.searchsorted(keys[order], chars[known])]
        kept = np.ones(len(chars), dtype=bool)
        if self.frequency_ceiling > 0:
            kept = _running_count(occurrence, chars) < self.frequency_ceiling
        return owners[occurrence][kept], weights[kept], chars[kept]

    def _sign_table(self, strings: list[str]) -> np.ndarray:
        """+1/-1 rows (int64, len(strings) x size) of the SHAKE256 bits of each string."""
        rows = []
        for string in strings:
            row = self._signs.get(string)
            if row is None:
                digest = hashlib.shake_256(string.encode("utf-8", "surrogatepass")).digest(-(-self.size // 8))
                bits = np.unpackbits(np.frombuffer(digest, dtype=np.uint8))[: self.size]
                row = bits.astype(np.int64) * 2 - 1
                self._signs[string] = row
            rows.append(row)
        return np.array(rows, dtype=np.int64).reshape(len(strings), self.size)


def _running_count(groups: np.ndarray, items: np.ndarray) -> np.ndarray:
    """For each position, how many times its (group, item) pair has occurred so far, itself included."""
    if not len(items):
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(len(items)), items, groups))
    sorted_groups, sorted_items = groups[order], items[order]
    new = np.ones(len(items), dtype=bool)
    new[1:] = (sorted_groups[1:] != sorted_groups[:-1]) | (sorted_items[1:] != sorted_items[:-1])
    heads = np.flatnonzero(new)
    rank = np.arange(len(items)) - np.repeat(heads, np.diff(np.append(heads, len(items))))
    counts = np.empty(len(items), dtype=np.int64)
    counts[order] = rank + 1
    return counts
