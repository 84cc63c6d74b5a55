"""Files the commands write."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_secret_file(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON readable by the owner only (created 0600, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
