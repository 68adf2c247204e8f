"""Reading `lmsuite`'s configuration errors back from stderr, in either of the forms
`ConfigError.report` prints: one line for one problem, a list for several."""

ONE = "lmsuite: configuration error: "


def problem_lines(err: str) -> list[str]:
    """Every problem on `err`, each as a "  - PROBLEM" line."""
    return [
        line if line.startswith("  - ") else "  - " + line.removeprefix(ONE)
        for line in err.splitlines()
        if line.startswith(("  - ", ONE))
    ]
