"""Regenerate the expected output of the `$ kvcalc` examples in README.md and docs/*.md.

    python tests/update_docs_examples.py              # every page
    python tests/update_docs_examples.py docs/sim.md  # some pages

Each example that runs here is run against the installed program; where its output differs from the
page, the page is rewritten (`...` lines, and lines with `...` that still match, are kept). Examples that
are skipped here (no GPU, no ../shared/traces) are left as they are and listed. Review with `git diff`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_docs_examples as docs


def main(args: list[str]) -> int:
    paths = [Path(arg).resolve() for arg in args] or None
    report = docs.update(paths)
    print("\n".join(report) if report else "every example already matches")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
