"""The runnable examples run, and show what their docstrings promise."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_pool_walkthrough_shows_cow_and_prefix_hit():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "pool_walkthrough.py")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # prompt of 10 tokens in blocks of 4: ceil(10/4) = 3 blocks; the fork shares all 3
    assert "a=[0, 1, 2]  b=[0, 1, 2]" in lines[1]
    # b writes token 11 into the shared partial block 2 -> copied to the first free block, 3
    assert "copy-on-write [(2, 3)]" in lines[2]
    # same prompt again: the 2 full blocks hit (8 tokens); the partial block holds the last prompt token
    assert "8 hit" in lines[5]
    assert "used=0 free=8" in lines[6]
    assert lines[-1] == "copy-on-write copies: 1"
