"""The control file: which predictor variant a running server uses, and whether the sync observer samples.

One format and one reader for both backends (the vLLM plugin and the simulator), so that an A/B runner can switch a
running server between arms without a restart (docs/control.md):

    TTS_PREDICTOR_CONTROL=/control/predictor.json
    {"variant": "original" | "fixed" | "vectorized", "observe": true | false, "epoch": 7, ...}

`variant` and `observe` are required; `epoch` (a non-negative integer) is optional and is exported as a metric so
that the writer can see when its change took effect; `host_delay_us` (optional, 0 to MAX_HOST_DELAY_US) is the
positive control: a fixed extra host delay per build_attn_metadata call, a known effect that the suite can check its
power against on any real server; any other key is allowed and ignored.

`ControlFile.poll()` is called by the server at every step boundary. It costs one `os.stat` when nothing changed
(reports/bench/control.md) and reads and parses the file only when its (mtime, size, inode) signature changed. A
change it cannot use (unknown variant, broken JSON, missing file, ...) comes back as a `ControlRejected` with a
reason: the server logs and counts it and keeps its current setting. At start-up (`ControlFile(path)`) the same
problems raise `ControlError`: a server must not start without knowing what it runs.

Plain Python, no torch: the load generator writes the file with `write_control` (atomic: temp file + rename in the
same folder, so a reader never sees half a file and every write changes the inode).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .domain import VARIANT_NAMES

ENV_CONTROL = "TTS_PREDICTOR_CONTROL"
MAX_BYTES = 64 * 1024  # a control file is a few dozen bytes; anything this large is not one
# Why a change was refused (the `reason` label of tts_predictor_control_errors_total).
ERROR_REASONS = ("unreadable", "json", "not_object", "variant", "observe", "epoch", "host_delay")
KNOWN_KEYS = ("variant", "observe", "epoch", "host_delay_us")
MAX_HOST_DELAY_US = 100_000  # 0.1 s per call: far above any effect worth measuring, well below a request timeout


class ControlError(ValueError):
    """A control file that cannot be used; `reason` is one of ERROR_REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ControlSetting:
    """What the control file asks for. `extra`: the file's other keys, untouched (the plugin ignores them; the
    simulator reads its hot-swappable settings from "sim"). They do not make a change on their own: they are taken
    up with the next change of variant, observe or epoch (the A/B runner gives every write a new epoch)."""

    variant: str
    observe: bool
    epoch: int | None = None
    host_delay_us: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ControlRejected:
    """A change of the control file that was refused; the server keeps its current setting."""

    reason: str
    message: str


def parse_control(data: bytes | str, where: str = "control file") -> ControlSetting:
    """Validate the file's content; raises ControlError naming the first problem."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise ControlError("json", f"{where}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ControlError("not_object", f"{where}: must hold a JSON object, got {type(doc).__name__}")
    variant = doc.get("variant")
    if not isinstance(variant, str) or variant not in VARIANT_NAMES:
        raise ControlError("variant", f"{where}: 'variant' must be one of {list(VARIANT_NAMES)}, got {variant!r}")
    observe = doc.get("observe")
    if not isinstance(observe, bool):
        raise ControlError("observe", f"{where}: 'observe' must be true or false, got {observe!r}")
    epoch = doc.get("epoch")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise ControlError("epoch", f"{where}: 'epoch' must be a non-negative integer, got {epoch!r}")
    delay = doc.get("host_delay_us", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= MAX_HOST_DELAY_US:
        raise ControlError("host_delay", f"{where}: 'host_delay_us' must be a number of microseconds from 0 to "
                                         f"{MAX_HOST_DELAY_US}, got {delay!r}")
    extra = {k: v for k, v in doc.items() if k not in KNOWN_KEYS}
    return ControlSetting(variant=variant, observe=observe, epoch=epoch, host_delay_us=float(delay), extra=extra)


def read_control(path: str | os.PathLike) -> ControlSetting:
    """Read and validate one control file; raises ControlError (reason 'unreadable' for I/O problems)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ControlError("unreadable", f"control file {os.fspath(path)}: cannot read it ({e})") from None
    if len(data) > MAX_BYTES:
        raise ControlError("unreadable", f"control file {os.fspath(path)}: larger than {MAX_BYTES} bytes")
    return parse_control(data, where=f"control file {os.fspath(path)}")


def write_control(path: str | os.PathLike, variant: str, observe: bool, epoch: int | None = None, **extra) -> None:
    """Write a control file atomically (temp file in the same folder, then rename). Validates before writing."""
    doc = {"variant": variant, "observe": observe, **({} if epoch is None else {"epoch": epoch}), **extra}
    text = json.dumps(doc)
    parse_control(text, where="control setting")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.chmod(tmp, 0o644)  # readable by the container's user through a read-only mount
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ControlFile:
    """The control file as a server sees it: read once at start, then `poll()` at step boundaries."""

    def __init__(self, path: str | os.PathLike, *, check_every: int = 1):
        if check_every < 1:
            raise ValueError("check_every must be >= 1")
        self.path = os.fspath(path)
        self.check_every = check_every
        self._countdown = check_every
        self._signature = self._stat_signature()
        if self._signature is None:
            raise ControlError("unreadable", f"control file {self.path} ({ENV_CONTROL}) does not exist or cannot "
                                             "be read")
        self.current = read_control(self.path)  # raises ControlError: refuse to start

    def _stat_signature(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev

    def poll(self) -> ControlSetting | ControlRejected | None:
        """None when nothing changed; the new setting; or why a change was refused (counted once per change)."""
        self._countdown -= 1
        if self._countdown > 0:
            return None
        self._countdown = self.check_every
        sig = self._stat_signature()
        if sig == self._signature:
            return None
        self._signature = sig
        if sig is None:
            return ControlRejected("unreadable", f"control file {self.path} disappeared or cannot be read; "
                                                 f"keeping {self.current}")
        try:
            setting = read_control(self.path)
        except ControlError as e:
            return ControlRejected(e.reason, f"{e}; keeping {self.current}")
        if setting == self.current:
            return None
        self.current = setting
        return setting


class ControlChannel:
    """The setting a server runs under; it changes only when the server calls `at_step_boundary()`.

    Both backends call it at the start of a talker step, before the step's first predictor call, and use
    `setting` for the whole step. `generation` increases with every applied change (a cheap "did it change" for
    per-cache state). Refused changes are logged and counted; metrics (metrics.make_control_metrics) are optional
    and may be attached later (the plugin creates them lazily in the process that runs the predictor).
    """

    def __init__(self, file: ControlFile, log, metrics=None):
        self.file = file
        self.log = log
        self.setting: ControlSetting = file.current
        self.generation = 0
        self.switches = 0
        self.rejected = 0
        self.metrics = None
        if metrics is not None:
            self.attach_metrics(metrics)

    @classmethod
    def from_env(cls, log, environ=None, check_every: int = 1) -> ControlChannel | None:
        """The channel named by TTS_PREDICTOR_CONTROL, or None when it is unset; raises ControlError if unusable."""
        env = os.environ if environ is None else environ
        path = env.get(ENV_CONTROL, "").strip()
        if not path:
            return None
        return cls(ControlFile(path, check_every=check_every), log)

    def attach_metrics(self, metrics) -> None:
        self.metrics = metrics
        for reason in ERROR_REASONS:  # every reason visible at 0, so a rate query never misses the first one
            metrics.errors.labels(reason=reason)
        for name in VARIANT_NAMES:
            metrics.switches.labels(variant=name)
        self._export()

    def _export(self) -> None:
        m, s = self.metrics, self.setting
        if m is None:
            return
        for name in VARIANT_NAMES:
            m.active.labels(variant=name).set(1 if name == s.variant else 0)
        m.epoch.set(0 if s.epoch is None else s.epoch)
        m.observe.set(1 if s.observe else 0)

    def at_step_boundary(self) -> bool:
        """Poll the file; apply a valid change now. Returns True when the setting changed."""
        change = self.file.poll()
        if change is None:
            return False
        if isinstance(change, ControlRejected):
            self.rejected += 1
            self.log.warning("tts_predictor control: change refused (%s): %s", change.reason, change.message)
            if self.metrics is not None:
                self.metrics.errors.labels(reason=change.reason).inc()
            return False
        old, self.setting = self.setting, change
        self.generation += 1
        if change.variant != old.variant:
            self.switches += 1
            if self.metrics is not None:
                self.metrics.switches.labels(variant=change.variant).inc()
        self._export()
        self.log.info("tts_predictor control: now variant %r, observe %s, epoch %s (was %r, %s, %s; pid %d)",
                      change.variant, change.observe, change.epoch, old.variant, old.observe, old.epoch, os.getpid())
        return True
