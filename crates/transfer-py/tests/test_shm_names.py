"""A process that reuses the PID of one that left shm files behind (a
killed peer: its endpoints' files stay in /dev/shm) still opens shm."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import transfer
    if sys.argv[1] == "first":
        e = transfer.Engine(provider="shm", nics=3)
        # Same PID, fresh process image: the files stay behind as a killed
        # process's do, and the new image starts shm's naming afresh.
        os.execv(sys.executable, [sys.executable, __file__, "second"])
    e = transfer.Engine(provider="shm", nics=2)
    print("opened", e.nics)
    e.close()
    """
)


def test_stale_shm_files_of_the_same_pid(tmp_path: Path) -> None:
    script = tmp_path / "reexec.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), "first"], capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "opened 2" in out.stdout
