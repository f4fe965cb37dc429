"""Finding the external tools the deploy tests run (hadolint, kubectl, kubernetes-validate, promtool).

Missing, a tool makes its tests skip on a developer's machine; with SPEC_ADVISOR_DEPLOY_TOOLS=1 (CI) it is a failure,
so a green CI run always means the tools really ran.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

TOOLS_ENV = "SPEC_ADVISOR_DEPLOY_TOOLS"


def require_tool(name: str, *, setup_script: str = "scripts/setup-deploy-tools.sh") -> str:
    """The tool's path: the project venv's bin first (pinned by the setup script), then PATH."""
    in_venv = Path(sys.executable).parent / name
    found = str(in_venv) if in_venv.is_file() else shutil.which(name)
    if found is not None:
        return found
    message = f"{name} is not installed: run `bash {setup_script}`"
    if os.environ.get(TOOLS_ENV) == "1":
        pytest.fail(f"{message} ({TOOLS_ENV}=1 requires it)")
    pytest.skip(f"{message} (set {TOOLS_ENV}=1 to fail instead)")
