"""python -m gearshift.vllm_plugins DIR: copies the A^2FM parsers, their format module and the
chat template into DIR and prints the vLLM flags that use them (the chart's init container)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from gearshift.vllm_plugins import copy_files, vllm_args


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(argv[0])
    for path in copy_files(directory):
        print(f"copied {path}", file=sys.stderr)
    print(shlex.join(vllm_args(directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
