"""The preflight's records and its shell: every check is a PASS / FAIL / SKIP line as it lands and an entry of
preflight.json at the end; every external command goes through Shell, so a dry run prints it instead of running it."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest.server_process import ROOT

STATUSES = ("pass", "fail", "skip")


class PreflightError(ValueError):
    """Bad arguments or input files: one line, exit 2."""


@dataclass
class Check:
    name: str
    status: str  # STATUSES
    detail: str
    fix: str | None = None
    warning: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Report:
    """The checks so far: each printed as it lands, all written to preflight.json at the end."""

    print_line: Callable[[str], None] = print
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str, fix: str | None = None, warning: str | None = None) -> Check:
        assert status in STATUSES, status
        c = Check(name, status, detail, fix if status == "fail" else None, warning)
        self.checks.append(c)
        self.print_line(f"{status.upper():4}  {name:34} {detail}")
        if c.warning:
            self.print_line(f"{'':6}{'':34} WARNING: {c.warning}")
        if c.fix:
            self.print_line(f"{'':6}{'':34} fix: {c.fix}")
        return c

    def failed(self, *names: str) -> list[str]:
        return [c.name for c in self.checks if c.status == "fail" and (not names or c.name in names)]

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}


class Shell:
    """External commands, each bounded in time; in a dry run each is printed (`$ ...`) and none runs."""

    def __init__(self, dry_run: bool, print_line: Callable[[str], None] = print):
        self.dry_run, self.print_line = dry_run, print_line

    def show(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        # a script argument (python3 -c) is named, not printed: it is INSIDE_IMAGE in loadtest/preflight/images.py
        shown = ["\"$INSIDE_IMAGE\"" if "\n" in a else shlex.quote(a) for a in argv]
        self.print_line("$ " + (prefix + " " if prefix else "") + " ".join(shown))

    def run(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); 127 when the program is missing, 124 when it ran out of time."""
        if self.dry_run:
            self.show(argv, env)
            return 0, "", ""
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                               env={**os.environ, **(env or {})})
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found on PATH"
        except subprocess.TimeoutExpired:
            return 124, "", f"{shlex.join(argv[:3])} ...: no answer within {timeout_s:g} s"
        except OSError as e:
            return 126, "", f"{argv[0]}: {e}"
        return p.returncode, p.stdout, p.stderr


def last_line(text: str, limit: int = 300) -> str:
    """The last non-empty line of a command's output, cut to `limit`: what a check's detail quotes."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:limit]


def rel_path(path: str | Path) -> str:
    """A path as the lines show it: relative to the checkout when it is inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
