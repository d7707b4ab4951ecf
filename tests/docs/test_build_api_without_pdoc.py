"""docs/build_api.py where pdoc (the dev extra) is not installed: one line saying what to
install, not a traceback."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT

#: run the builder with pdoc hidden (None in sys.modules: its import fails as if absent)
_HIDDEN = (
    "import runpy, sys; sys.modules['pdoc'] = None; sys.argv = ['docs/build_api.py', 'out']; "
    "runpy.run_path('docs/build_api.py', run_name='__main__')"
)


def test_the_reference_builder_without_pdoc_says_what_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HIDDEN], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "docs/build_api.py: expected pdoc, which builds the reference, received no module named "
        "'pdoc'. Fix: pip install -e '.[dev]' (or pip install 'pdoc>=16')"
    ]
