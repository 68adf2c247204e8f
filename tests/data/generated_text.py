"""Varied English-like prose for tests of the user's-text path: generated sentences, seeded.

Made-up names ("Tamulgor", "Wincorgor") give SentencePiece enough distinct words for a 412-piece
model (+100 sentinels = the tiny models' 512 ids) from a few hundred lines.
"""

import pathlib
import random

NOUNS = (
    "farmer doctor neighbour river village council teacher engineer traveller king merchant "
    "museum child forest sailor bridge boat train map tower coin winter street harbour garden "
    "mountain letter market lantern lake castle library orchard painter soldier island valley "
    "kitchen window blanket violin meadow storm question answer journey festival factory "
    "chimney poet sister brother captain mayor student professor telescope"
).split()
ADJECTIVES = (
    "old young quiet tired honest curious northern broken wooden ancient silver narrow "
    "empty green distant heavy bright frozen golden gentle careless patient famous "
    "hidden crowded forgotten strange yellow crooked brave clever lonely noisy"
).split()
VERBS = (
    "watched built carried remembered painted followed described protected visited measured "
    "repaired forgot discovered questioned welcomed borrowed sold opened closed crossed "
    "admired ignored cleaned counted climbed found explained imagined"
).split()
PLACES = (
    "before dawn|after the storm|with great care|in the spring|without a word|near the "
    "church|during the festival|for many years|under the bridge|at the edge of town|beside "
    "the fountain|behind the station|across the valley|on a Tuesday|in {year}"
).split("|")
SYLLABLES = "an bel cor dra el fen gor hal is jor kel lam mor nor ost pel quin ras sol tam ul ver "
SYLLABLES += "win"


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES.split()) for _ in range(rng.randint(2, 3))).capitalize()


def sentence(rng: random.Random) -> str:
    """One sentence, e.g. "Halel the crooked council carried their noisy library at dawn!"."""
    words = [
        rng.choice(("the", "a", "every", "one", _name(rng) + " the")),
        rng.choice(ADJECTIVES),
        rng.choice(NOUNS),
        rng.choice(VERBS),
        rng.choice(("the", "a", "their", "his", "her")),
        rng.choice(ADJECTIVES),
        rng.choice(NOUNS),
        rng.choice(PLACES).format(year=rng.randint(1700, 2024)),
    ]
    if rng.random() < 0.5:
        words += ["near", _name(rng)]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".....!?")


def write_text_files(directory, *, files: int = 6, paragraphs: int = 40, seed: int = 0):
    """`files` files doc0.txt ... of `paragraphs` lines of 2-5 sentences, a blank line after every
    fourth (so 10 blank-line blocks per file); returns their paths."""
    rng, paths = random.Random(seed), []
    for index in range(files):
        lines = []
        for number in range(paragraphs):
            lines.append(" ".join(sentence(rng) for _ in range(rng.randint(2, 5))))
            if number % 4 == 3:
                lines.append("")
        paths.append(pathlib.Path(directory) / f"doc{index}.txt")
        paths[-1].write_text("\n".join(lines) + "\n")
    return paths
