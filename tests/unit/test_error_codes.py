"""Every error code the server can emit is documented in docs/api/errors.md, with its status.

Codes come from two places: the ``code`` of every :class:`orbit_common.errors.OrbitError`
subclass (all modules of the server packages are imported, so every subclass is seen), and code
literals written where a problem document or a worker ``error`` frame is built by hand
(``code="…"``, ``"code": "…"``, the HTTP fallback table
of ``orbit_common/service/http/problems.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from orbit_common import errors
from orbit_common.service.http import problems

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orbit_common", "orbit_api", "orbit_dispatcher", "orbit_scheduler")
DOC = ROOT / "docs" / "api" / "errors.md"

_LITERAL = re.compile(r"""(?:\bcode\s*=\s*|["']code["']\s*:\s*)["']([a-z][a-z0-9_]*)["']""")
_ROW = re.compile(r"^\|(.+)\|\s*$")
_HEADING = re.compile(r"^#{2,4}\s+(\d{3})\b")


def _import_everything() -> None:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            importlib.import_module(info.name)


def _subclasses(cls: type[errors.OrbitError]) -> list[type[errors.OrbitError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_subclasses(sub))
    return found


def class_codes() -> dict[str, set[int]]:
    """code → the statuses its classes answer with."""
    _import_everything()
    codes: dict[str, set[int]] = {}
    for cls in _subclasses(errors.OrbitError):
        codes.setdefault(cls.code, set()).add(cls.status)
    return codes


def literal_codes(sources: list[Path] | None = None) -> set[str]:
    """Codes written as literals in the server's source (problem documents, worker frames)."""
    if sources is None:
        sources = [p for name in PACKAGES for p in sorted((ROOT / name).rglob("*.py"))]
    found: set[str] = set()
    for path in sources:
        found.update(_LITERAL.findall(path.read_text(encoding="utf-8")))
    found.update(code for code, _title in problems._HTTP_CODES.values())
    found.add("http_error")  # from_http's fallback for any other aiohttp status
    return found


def documented_codes(text: str) -> dict[str, set[int]]:
    """code → statuses from the tables of errors.md (a row's own status column, else the
    status of the ``### NNN …`` heading it sits under); codes named only in prose map to an
    empty set."""
    documented: dict[str, set[int]] = {}
    heading: int | None = None
    for line in text.splitlines():
        if match := _HEADING.match(line):
            heading = int(match.group(1))
            continue
        row = _ROW.match(line)
        if row is None:
            for code in re.findall(r"`([a-z][a-z0-9_]*)`", line):
                documented.setdefault(code, set())
            continue
        cells = [c.strip() for c in row.group(1).split("|")]
        status = int(cells[0]) if cells[0].isdigit() else heading
        code_cell = cells[1] if cells[0].isdigit() else cells[0]
        code = re.fullmatch(r"`([a-z][a-z0-9_]*)`", code_cell)
        if code is not None and status is not None:
            documented.setdefault(code.group(1), set()).add(status)
    return documented


def test_every_emitted_code_is_documented_with_its_status() -> None:
    documented = documented_codes(DOC.read_text(encoding="utf-8"))
    missing = sorted(c for c in set(class_codes()) | literal_codes() if c not in documented)
    assert missing == [], f"codes missing from docs/api/errors.md: {missing}"
    wrong = {code: (statuses, documented[code]) for code, statuses in class_codes().items()
             if not statuses <= documented[code]}
    assert wrong == {}, f"documented with another status (class, doc): {wrong}"


def test_the_collectors_see_what_they_must(tmp_path: Path) -> None:
    # Guard the guard: subclasses in any server module, hand-written literals, and the parser.
    codes = class_codes()
    assert codes["confirmation_required"] == {400}  # orbit_common/pulse/interventions.py
    assert codes["session_not_found"] == {404}  # orbit_common/pulse/workers.py
    assert {"internal_error", "session_lost", "http_error"} <= literal_codes()
    source = tmp_path / "frame.py"
    source.write_text('send({"type": "error", "code": "made_up_code"})\n'
                      'problem(status=500, code="another_one")\n', encoding="utf-8")
    assert {"made_up_code", "another_one"} <= literal_codes([source])
    doc = ("### 404 不存在\n\n| code | 含义 |\n| --- | --- |\n| `a_code` | x |\n\n"
           "### 409\n\n| status | code | 含义 |\n| --- | --- | --- |\n| 409 | `b_code` | y |\n")
    assert documented_codes(doc) == {"a_code": {404}, "b_code": {409}}
