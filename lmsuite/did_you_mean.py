"""One rule for every "did you mean" in lmsuite's messages (tasks, recipes, gin names)."""

import difflib


def nearest(name: str, options) -> str:
    """ "; did you mean 'x'?" for the closest of `options`, or "" when none is close.

    Example: nearest("bert_mlmx", ["bert_mlm", "t5"]) -> "; did you mean 'bert_mlm'?"
    """
    close = difflib.get_close_matches(name, sorted(set(options)), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""
