"""A small rule-based English->German translation task whose grammar forces reordering
(perfect tense, subordinate clauses, modal verbs), returned as a
:class:`~bayesattn.data.sequences.SequenceTask` with gold word alignments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from .._validation import check_bool, check_int, check_real, check_seed
from .sequences import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, Alignment, SequenceTask

__all__ = ["TRANSLATION_PATTERNS", "translate_sentence", "make_translation_task"]


TRANSLATION_PATTERNS: tuple[str, ...] = ("perfect", "subordinate", "modal")

# person keys: 1sg, 2sg, 3sg, 1pl, 3pl
_SUBJECTS: dict[str, tuple[str, str]] = {
    "i": ("ich", "1sg"),
    "you": ("du", "2sg"),
    "he": ("er", "3sg"),
    "she": ("sie", "3sg"),
    "we": ("wir", "1pl"),
    "they": ("sie", "3pl"),
}
_EN_HAVE = {"1sg": "have", "2sg": "have", "3sg": "has", "1pl": "have", "3pl": "have"}
_DE_HAVE = {"1sg": "habe", "2sg": "hast", "3sg": "hat", "1pl": "haben", "3pl": "haben"}
_MODALS: dict[str, dict[str, str]] = {
    "can": {"1sg": "kann", "2sg": "kannst", "3sg": "kann", "1pl": "können", "3pl": "können"},
    "must": {"1sg": "muss", "2sg": "musst", "3sg": "muss", "1pl": "müssen", "3pl": "müssen"},
    "should": {"1sg": "soll", "2sg": "sollst", "3sg": "soll", "1pl": "sollen", "3pl": "sollen"},
}
# clause-embedding verbs: english (base, 3sg) -> german conjugation
_SAY_VERBS: dict[str, tuple[str, dict[str, str]]] = {
    "know": (
        "knows",
        {"1sg": "weiß", "2sg": "weißt", "3sg": "weiß", "1pl": "wissen", "3pl": "wissen"},
    ),
    "think": (
        "thinks",
        {"1sg": "glaube", "2sg": "glaubst", "3sg": "glaubt", "1pl": "glauben", "3pl": "glauben"},
    ),
    "say": (
        "says",
        {"1sg": "sage", "2sg": "sagst", "3sg": "sagt", "1pl": "sagen", "3pl": "sagen"},
    ),
}
# english noun -> (german accusative article, german noun)
_OBJECTS: dict[str, tuple[str, str]] = {
    "house": ("das", "haus"),
    "dog": ("den", "hund"),
    "car": ("das", "auto"),
    "book": ("das", "buch"),
    "cat": ("die", "katze"),
    "man": ("den", "mann"),
    "woman": ("die", "frau"),
    "child": ("das", "kind"),
    "apple": ("den", "apfel"),
    "letter": ("den", "brief"),
    "newspaper": ("die", "zeitung"),
    "key": ("den", "schlüssel"),
    "table": ("den", "tisch"),
    "city": ("die", "stadt"),
    "bike": ("das", "fahrrad"),
}
# verb lemma -> (en infinitive, en participle, de infinitive, de participle, objects)
_VERBS: dict[str, tuple[str, str, str, str, tuple[str, ...]]] = {
    "see": ("see", "seen", "sehen", "gesehen", tuple(_OBJECTS)),
    "find": (
        "find",
        "found",
        "finden",
        "gefunden",
        ("dog", "cat", "book", "letter", "key", "newspaper", "child", "bike", "house"),
    ),
    "buy": (
        "buy",
        "bought",
        "kaufen",
        "gekauft",
        ("house", "car", "book", "dog", "cat", "apple", "newspaper", "table", "bike"),
    ),
    "sell": (
        "sell",
        "sold",
        "verkaufen",
        "verkauft",
        ("house", "car", "book", "dog", "cat", "table", "bike"),
    ),
    "read": ("read", "read", "lesen", "gelesen", ("book", "letter", "newspaper")),
    "write": ("write", "written", "schreiben", "geschrieben", ("book", "letter")),
    "visit": ("visit", "visited", "besuchen", "besucht", ("man", "woman", "child", "city")),
    "call": ("call", "called", "anrufen", "angerufen", ("man", "woman", "child")),
    "wash": (
        "wash",
        "washed",
        "waschen",
        "gewaschen",
        ("car", "dog", "cat", "child", "apple", "table", "bike"),
    ),
    "lose": ("lose", "lost", "verlieren", "verloren", ("key", "book", "letter", "dog", "cat")),
    "eat": ("eat", "eaten", "essen", "gegessen", ("apple",)),
}
_ADVERBS = {"today": "heute", "yesterday": "gestern", "tomorrow": "morgen"}
_PERFECT_ADVERBS: tuple[str | None, ...] = (None, "today", "yesterday")
_MODAL_ADVERBS: tuple[str | None, ...] = (None, "today", "tomorrow")

_EN_PARTICIPLES = {v[1]: lemma for lemma, v in _VERBS.items()}
_EN_INFINITIVES = {v[0]: lemma for lemma, v in _VERBS.items()}
_EN_SAY = {base: base for base in _SAY_VERBS} | {v[0]: base for base, v in _SAY_VERBS.items()}
_VERB_OBJECTS: tuple[tuple[str, str], ...] = tuple(
    (lemma, noun) for lemma, v in _VERBS.items() for noun in v[4]
)
# maximum sentence lengths (words) per pattern: (english, german)
_MAX_WORDS = {"perfect": (6, 6), "modal": (6, 6), "subordinate": (9, 10)}


def _translation_vocabs() -> tuple[list[str], list[str]]:
    en: set[str] = {"that", "the"}
    de: set[str] = {",", "dass"}
    for en_w, (de_w, _) in _SUBJECTS.items():
        en.add(en_w)
        de.add(de_w)
    en.update(_EN_HAVE.values())
    de.update(_DE_HAVE.values())
    for modal, forms in _MODALS.items():
        en.add(modal)
        de.update(forms.values())
    for base, (third, forms) in _SAY_VERBS.items():
        en.update((base, third))
        de.update(forms.values())
    for noun, (article, de_noun) in _OBJECTS.items():
        en.add(noun)
        de.update((article, de_noun))
    for en_inf, en_part, de_inf, de_part, _ in _VERBS.values():
        en.update((en_inf, en_part))
        de.update((de_inf, de_part))
    en.update(_ADVERBS)
    de.update(_ADVERBS.values())
    return list(SPECIAL_TOKENS) + sorted(en), list(SPECIAL_TOKENS) + sorted(de)


def _untranslatable(tokens: Sequence[str], pos: int, expected: str) -> ValueError:
    got = repr(tokens[pos]) if pos < len(tokens) else "end of sentence"
    return ValueError(
        f"cannot translate {' '.join(tokens)!r}: expected {expected} at position {pos}, got {got}"
    )


def _translate_clause(
    tokens: Sequence[str], start: int, subordinate: bool, front_adverb: bool = False
) -> list[tuple[str, int | None]]:
    """German words of one clause, each paired with its English source position;
    ``front_adverb``: a main clause's time adverb goes first, with subject–verb inversion."""
    i = start
    if i >= len(tokens) or tokens[i] not in _SUBJECTS:
        raise _untranslatable(tokens, i, f"a subject {tuple(_SUBJECTS)}")
    de_subj, person = _SUBJECTS[tokens[i]]
    subj_pos = i
    aux = tokens[i + 1] if i + 1 < len(tokens) else None
    if aux in ("have", "has"):
        if aux != _EN_HAVE[person]:
            raise _untranslatable(tokens, i + 1, f"{_EN_HAVE[person]!r} after {tokens[i]!r}")
        de_finite = _DE_HAVE[person]
        verb_table, verb_kind, verb_index = _EN_PARTICIPLES, "a past participle", 3
    elif aux in _MODALS:
        de_finite = _MODALS[aux][person]
        verb_table, verb_kind, verb_index = _EN_INFINITIVES, "an infinitive", 2
    else:
        raise _untranslatable(tokens, i + 1, "'have'/'has' or a modal (can, must, should)")
    if i + 2 >= len(tokens) or tokens[i + 2] not in verb_table:
        raise _untranslatable(tokens, i + 2, verb_kind)
    de_verb = _VERBS[verb_table[tokens[i + 2]]][verb_index]
    if i + 3 >= len(tokens) or tokens[i + 3] != "the":
        raise _untranslatable(tokens, i + 3, "'the'")
    if i + 4 >= len(tokens) or tokens[i + 4] not in _OBJECTS:
        raise _untranslatable(tokens, i + 4, "an object noun")
    article, de_noun = _OBJECTS[tokens[i + 4]]
    adverb: list[tuple[str, int | None]] = []
    end = i + 5
    if end < len(tokens):
        if tokens[end] not in _ADVERBS:
            raise _untranslatable(tokens, end, f"an adverb {tuple(_ADVERBS)}")
        adverb = [(_ADVERBS[tokens[end]], end)]
        end += 1
    if end != len(tokens):
        raise _untranslatable(tokens, end, "end of sentence")

    finite: tuple[str, int | None] = (de_finite, i + 1)
    nonfinite: tuple[str, int | None] = (cast(str, de_verb), i + 2)
    middle = adverb + [(article, i + 3), (de_noun, i + 4)]
    if subordinate:  # verb cluster at the end, finite verb last
        return [(de_subj, subj_pos), *middle, nonfinite, finite]
    if front_adverb and adverb:  # topicalised adverb, finite verb second, then the subject
        return [*adverb, finite, (de_subj, subj_pos), *middle[1:], nonfinite]
    return [(de_subj, subj_pos), finite, *middle, nonfinite]  # verb-second, bracket


def translate_sentence(
    english_tokens: Sequence[str] | str, front_adverb: bool = False
) -> tuple[list[str], list[tuple[int, int]]]:
    """Translate one sentence of the toy grammar to German, with word alignments.

    Grammar (lowercase tokens)::

        sentence := clause | SUBJ SAY "that" clause
        clause   := SUBJ (HAVE PARTICIPLE | MODAL INFINITIVE) "the" NOUN [ADVERB]

    German puts the non-finite verb at the end of a main clause
    (``i have seen the house`` -> ``ich habe das haus gesehen``), the time adverb after
    the finite verb, and the whole verb cluster at the end of a subordinate clause with
    the finite verb last (``... , dass du den hund gesehen hast``). Alignments are
    ``(english_pos, german_pos)`` pairs; every English word aligns to exactly one German
    word, and only the comma is unaligned. ``front_adverb`` puts a main clause's time adverb
    first, with the subject after the finite verb (``gestern habe ich das haus gesehen``), an
    equally grammatical word order the English does not determine.

    Shape:
        Returns ``(german_tokens, alignment)`` with ``len(alignment) == len(english)``.
    """
    front_adverb = check_bool("front_adverb", front_adverb)
    if isinstance(english_tokens, str):
        tokens = english_tokens.split()
    elif isinstance(english_tokens, Sequence) and all(isinstance(t, str) for t in english_tokens):
        tokens = list(english_tokens)
    else:
        raise TypeError(
            f"english_tokens must be a string or a sequence of strings, got {english_tokens!r}"
        )
    if len(tokens) >= 2 and tokens[1] in _EN_SAY:
        if tokens[0] not in _SUBJECTS:
            raise _untranslatable(tokens, 0, f"a subject {tuple(_SUBJECTS)}")
        de_subj, person = _SUBJECTS[tokens[0]]
        base = _EN_SAY[tokens[1]]
        third, forms = _SAY_VERBS[base]
        expected = third if person == "3sg" else base
        if tokens[1] != expected:
            raise _untranslatable(tokens, 1, f"{expected!r} after {tokens[0]!r}")
        if len(tokens) < 3 or tokens[2] != "that":
            raise _untranslatable(tokens, 2, "'that'")
        words: list[tuple[str, int | None]] = [
            (de_subj, 0),
            (forms[person], 1),
            (",", None),
            ("dass", 2),
            *_translate_clause(tokens, 3, subordinate=True),
        ]
    else:
        words = _translate_clause(tokens, 0, subordinate=False, front_adverb=front_adverb)
    german = [w for w, _ in words]
    alignment = sorted((src, j) for j, (_, src) in enumerate(words) if src is not None)
    return german, alignment


def _english_clause(person_word: str, index: int, modal: bool) -> list[str]:
    """Decode a clause index (verb-object x [modal] x adverb) into English tokens."""
    adverbs = _MODAL_ADVERBS if modal else _PERFECT_ADVERBS
    index, adv_i = divmod(index, len(adverbs))
    index, vo_i = divmod(index, len(_VERB_OBJECTS))
    lemma, noun = _VERB_OBJECTS[vo_i]
    en_inf, en_part = _VERBS[lemma][0], _VERBS[lemma][1]
    person = _SUBJECTS[person_word][1]
    if modal:
        head = [tuple(_MODALS)[index], en_inf]
    else:
        head = [_EN_HAVE[person], en_part]
    adverb = adverbs[adv_i]
    return [person_word, *head, "the", noun] + ([adverb] if adverb else [])


_N_SUBJ = len(_SUBJECTS)
_N_PERFECT_CLAUSES = len(_VERB_OBJECTS) * len(_PERFECT_ADVERBS)
_N_MODAL_CLAUSES = len(_MODALS) * len(_VERB_OBJECTS) * len(_MODAL_ADVERBS)
_PATTERN_SIZES = {
    "perfect": _N_SUBJ * _N_PERFECT_CLAUSES,
    "modal": _N_SUBJ * _N_MODAL_CLAUSES,
    "subordinate": _N_SUBJ * len(_SAY_VERBS) * _N_SUBJ * (_N_PERFECT_CLAUSES + _N_MODAL_CLAUSES),
}


def _english_sentence(pattern: str, index: int) -> list[str]:
    subjects = tuple(_SUBJECTS)
    if pattern in ("perfect", "modal"):
        index, s = divmod(index, _N_SUBJ)
        return _english_clause(subjects[s], index, modal=pattern == "modal")
    index, s = divmod(index, _N_SUBJ)
    index, v = divmod(index, len(_SAY_VERBS))
    index, s2 = divmod(index, _N_SUBJ)
    base = tuple(_SAY_VERBS)[v]
    say = _SAY_VERBS[base][0] if _SUBJECTS[subjects[s]][1] == "3sg" else base
    if index < _N_PERFECT_CLAUSES:
        inner = _english_clause(subjects[s2], index, modal=False)
    else:
        inner = _english_clause(subjects[s2], index - _N_PERFECT_CLAUSES, modal=True)
    return [subjects[s], say, "that", *inner]


def _balanced_counts(n: int, capacities: list[int], unique: bool) -> list[int]:
    """Split ``n`` as evenly as possible over patterns, capped by capacity if unique."""
    k = len(capacities)
    counts = [n // k + (1 if j < n % k else 0) for j in range(k)]
    if not unique:
        return counts
    counts = [0] * k
    remaining = n
    open_ = [j for j in range(k) if capacities[j] > 0]
    while remaining and open_:  # water-filling
        share, extra = divmod(remaining, len(open_))
        still_open = []
        for r, j in enumerate(open_):
            want = share + (1 if r < extra else 0)
            take = min(want, capacities[j] - counts[j])
            counts[j] += take
            remaining -= take
            if counts[j] < capacities[j]:
                still_open.append(j)
        open_ = still_open
    return counts


def _check_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """``patterns`` as a tuple: a non-empty sequence of distinct :data:`TRANSLATION_PATTERNS`."""
    if isinstance(patterns, str) or len(patterns) == 0:
        raise ValueError(
            f"patterns must be a non-empty sequence drawn from {TRANSLATION_PATTERNS}, "
            f"got {patterns!r}"
        )
    for p in patterns:
        if p not in TRANSLATION_PATTERNS:
            raise ValueError(f"patterns must be drawn from {TRANSLATION_PATTERNS}, got {p!r}")
    if len(set(patterns)) != len(patterns):
        raise ValueError(f"patterns must not repeat a pattern, got {tuple(patterns)!r}")
    return tuple(patterns)


def _sample_sentences(
    n: int, seed: int, patterns: tuple[str, ...], capacities: list[int], unique: bool
) -> list[list[str]]:
    """``n`` English sentences (token lists), spread over ``patterns`` by
    :func:`_balanced_counts`, drawn (without repeats if ``unique``) and shuffled by a numpy
    generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    sentences: list[list[str]] = []
    for p, count in zip(patterns, _balanced_counts(n, capacities, unique), strict=True):
        if count == 0:
            continue
        idx = rng.choice(_PATTERN_SIZES[p], size=count, replace=not unique)
        sentences.extend(_english_sentence(p, int(i)) for i in idx)
    order = rng.permutation(n)
    return [sentences[i] for i in order]


def make_translation_task(
    n: int,
    seed: int = 0,
    patterns: Sequence[str] = TRANSLATION_PATTERNS,
    unique: bool = True,
    front_adverb: float = 0.0,
) -> SequenceTask:
    """Seeded English->German translation task from a tiny reordering grammar.

    Examples are spread as evenly as possible over ``patterns``:

    * ``"perfect"``: ``i have seen the house`` -> ``ich habe das haus gesehen``
    * ``"subordinate"``: ``i know that you have seen the dog`` ->
      ``ich weiß , dass du den hund gesehen hast`` (the inner clause may also be modal)
    * ``"modal"``: ``i can see the house`` -> ``ich kann das haus sehen``

    with optional time adverbs (``today``/``yesterday``/``tomorrow``) that move in front
    of the object in German. With ``unique`` (default) no sentence repeats, so splits do
    not leak; a pattern with too few distinct sentences hands its share to the others.
    Vocabularies cover the whole grammar (sorted, after the special tokens), so they do
    not depend on ``n``, ``seed`` or ``patterns``; ``src``/``tgt`` are padded to the
    longest sentence the chosen patterns can produce. ``src_text``/``tgt_text`` hold the
    raw space-joined strings and ``alignments`` come from :func:`translate_sentence`.

    ``front_adverb = p``: each main clause with a time adverb is translated with the adverb
    first (``gestern habe ich …``, :func:`translate_sentence`) with probability ``p`` (a harder
    task: the word order is not determined by the English; drawn from a generator of its own, so
    ``p = 0`` gives the same task as before).

    Shape:
        src: ``(n, 6)`` or ``(n, 9)`` with "subordinate"; tgt: ``(n, 8)`` or ``(n, 12)``.
    """
    n = check_int("n", n, 1)
    seed = check_seed(seed)
    front_p = check_real("front_adverb", front_adverb, ge=0.0, le=1.0)
    patterns = _check_patterns(patterns)
    capacities = [_PATTERN_SIZES[p] for p in patterns]
    if unique and n > sum(capacities):
        raise ValueError(
            f"n={n} exceeds the {sum(capacities)} distinct sentences of patterns "
            f"{patterns}; pass unique=False to allow repeats"
        )

    sentences = _sample_sentences(n, seed, patterns, capacities, unique)
    src_vocab, tgt_vocab = _translation_vocabs()
    src_ids = {w: i for i, w in enumerate(src_vocab)}
    tgt_ids = {w: i for i, w in enumerate(tgt_vocab)}
    max_src = max(_MAX_WORDS[p][0] for p in patterns)
    max_tgt = max(_MAX_WORDS[p][1] for p in patterns)
    src = torch.full((n, max_src), PAD_ID, dtype=torch.int64)  # (N, S)
    tgt = torch.full((n, max_tgt + 2), PAD_ID, dtype=torch.int64)  # (N, T)
    alignments: list[Alignment] = []
    src_text: list[str] = []
    tgt_text: list[str] = []
    front = np.random.default_rng([seed, 1]).random(n) < front_p  # (N,)
    for i, en in enumerate(sentences):
        de, align = translate_sentence(en, front_adverb=bool(front[i]))
        src[i, : len(en)] = torch.tensor([src_ids[w] for w in en])
        tgt[i, : len(de) + 2] = torch.tensor([BOS_ID, *(tgt_ids[w] for w in de), EOS_ID])
        alignments.append(align)
        src_text.append(" ".join(en))
        tgt_text.append(" ".join(de))
    return SequenceTask(
        src=src,
        tgt=tgt,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        alignments=alignments,
        src_text=src_text,
        tgt_text=tgt_text,
        meta={
            "task": "translation",
            "patterns": patterns,
            "seed": seed,
            "unique": unique,
            "front_adverb": front_p,
        },
    )
