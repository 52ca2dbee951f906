"""``make``'s set-up step: quiet when it works, the install log's tail when it fails (issue 32, item 8).

The recipe runs for real (``make install``) with a stand-in interpreter: ``PYTHON`` makes a
"venv" whose ``bin/python`` prints what pip and setuptools print (an editable-install warning
block) and exits 0, or 1 to play a failed install.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOISE = "BuildBackendWarning: Editable installation."

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _stand_in_python(tmp_path: Path, exit_code: int) -> Path:
    """A ``python3`` whose ``-m venv DIR`` makes DIR/bin/python: a pip that prints NOISE and exits ``exit_code``."""
    inner = f"#!/bin/sh\necho '{NOISE}' >&2\necho 'Successfully installed things'\nexit {exit_code}\n"
    outer = tmp_path / "python3"
    outer.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "-m" ] && [ "$2" = "venv" ] || exit 2\n'
        'mkdir -p "$3/bin"\n'
        f"cat > \"$3/bin/python\" <<'EOF'\n{inner}EOF\n"
        'chmod +x "$3/bin/python"\n'
    )
    outer.chmod(0o755)
    return outer


def _make_install(tmp_path: Path, exit_code: int) -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    return subprocess.run(["make", "-s", "-C", str(ROOT), "install", f"VENV={venv}", f"PYTHON={_stand_in_python(tmp_path, exit_code)}"],
                          capture_output=True, text=True, timeout=60)


def test_a_working_install_prints_one_line_and_keeps_pips_output_in_the_log(tmp_path: Path) -> None:
    out = _make_install(tmp_path, 0)
    assert out.returncode == 0, out.stdout + out.stderr
    printed = (out.stdout + out.stderr).strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("setting up ") and "install.log" in printed[0], printed
    assert NOISE in (tmp_path / "venv" / "install.log").read_text()
    assert (tmp_path / "venv" / ".installed").exists()


def test_a_failed_install_shows_the_logs_tail_and_fails(tmp_path: Path) -> None:
    out = _make_install(tmp_path, 1)
    assert out.returncode != 0
    assert NOISE in out.stdout and "install failed: see" in out.stdout, out.stdout
    assert not (tmp_path / "venv" / ".installed").exists()  # the next make tries again
