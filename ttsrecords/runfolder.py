"""A run folder read into objects: its manifest, server starts and windows, each window's records typed.

The statistics still take most of their input as the dicts of ttsreport.runfolder; this is where they move to
(docs/architecture.md, "Typed reading"): every file a run writes is read here once, through its record's from_dict,
so a reader downstream asks an object for a field instead of a dict for a string. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ttsrecords import records as rec
from ttsrecords.manifest import AB_MANIFESTS, RunManifest, read_manifest


@dataclass(frozen=True)
class Window:
    """One window as it was run: its block.json and its three record files (requests, counter lines, telemetry)."""

    meta: rec.BlockRecord
    requests: tuple[rec.RequestRecord, ...]
    counters: tuple[rec.CounterLine, ...]
    telemetry: tuple[rec.TelemetrySample, ...]

    def deltas(self, window: str = "measure") -> list[rec.CounterDelta]:
        """The counter deltas of one kind of window ("measure" or "count"), one per level and target."""
        return [c for c in self.counters if isinstance(c, rec.CounterDelta) and c.window == window]


@dataclass(frozen=True)
class RunFolder:
    """An A/B run folder: the typed manifest (None for a folder without one), its starts by number, its windows in
    block order (windows that never started are left out, and named in `notes`), and the reader's notes."""

    path: Path
    manifest: RunManifest | None
    starts: dict[int, rec.StartRecord]
    windows: tuple[Window, ...]
    notes: tuple[str, ...] = ()


def _lines(path: Path, schema: str, parse, notes: list[str]) -> tuple:
    rows, n = rec.read_jsonl(path, schema)
    notes += n
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(parse(row))
        except ValueError as e:
            raise ValueError(f"{path}: record {i + 1}: {e}") from None
    return tuple(out)


def read_json_checked(path: Path, known: tuple[str, ...]) -> dict | None:
    """A JSON record file whose schema must be one of `known` (a missing schema field reads as the first); None when
    the file does not exist. Not JSON, or another schema: one ValueError naming the file."""
    try:
        obj = rec.read_json(path)
    except ValueError as e:  # json.JSONDecodeError
        raise ValueError(f"{path}: not JSON ({e})") from None
    if obj is None:
        return None
    if obj.get("schema", known[0]) not in known:
        raise ValueError(f"{path}: unknown schema {obj.get('schema')!r} (this reader knows "
                         f"{' or '.join(repr(k) for k in known)})")
    return obj


def _json(path: Path, known: tuple[str, ...], cls) -> object | None:
    """A record file read into its type (None when absent); a missing field is one ValueError naming the file."""
    obj = read_json_checked(path, known)
    try:
        return None if obj is None else cls.from_dict(obj)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


BLOCK_SCHEMAS = (rec.BLOCK_SCHEMA, *rec.LEGACY[rec.BLOCK_SCHEMA])


def read_window(bdir: str | Path, notes: list[str] | None = None) -> Window | None:
    """One window folder as a Window; None when it has no block.json (the window never started)."""
    bdir, notes = Path(bdir), [] if notes is None else notes
    meta = _json(bdir / "block.json", BLOCK_SCHEMAS, rec.BlockRecord)
    if meta is None:
        return None
    return Window(meta=meta,
                  requests=_lines(bdir / "requests.jsonl", rec.REQUEST_SCHEMA, rec.request_from_dict, notes),
                  counters=_lines(bdir / "counters.jsonl", rec.COUNTERS_SCHEMA, rec.counter_line_from_dict, notes),
                  telemetry=_lines(bdir / "telemetry.jsonl", rec.TELEMETRY_SCHEMA, rec.TelemetrySample.from_dict,
                                   notes))


def read_blocks(run_dir: str | Path) -> list[rec.BlockRecord]:
    """Every window's block.json of a run folder, in block order, without its record files (what a live view needs;
    windows that never started left out)."""
    bdir = Path(run_dir) / "blocks"
    metas = (_json(p / "block.json", BLOCK_SCHEMAS, rec.BlockRecord) for p in sorted(bdir.iterdir()) if p.is_dir()) if bdir.is_dir() else ()
    return [m for m in metas if m is not None]


def read_starts(run_dir: str | Path) -> dict[int, rec.StartRecord]:
    """Every server start's start.json of a run folder, by start number."""
    sdirs = sorted((Path(run_dir) / "starts").iterdir()) if (Path(run_dir) / "starts").is_dir() else ()
    starts = (_json(d / "start.json", (rec.START_SCHEMA,), rec.StartRecord) for d in sdirs if d.is_dir())
    return {s.start: s for s in starts if s is not None}


def load_run(run_dir: str | Path) -> RunFolder:
    """Every file of an A/B run folder, typed; a folder that is not one is one ValueError naming it."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"{run}: not a folder")
    raw = rec.read_json(run / "manifest.json") if (run / "manifest.json").is_file() else None
    if raw is not None and raw.get("schema") not in AB_MANIFESTS:
        raise ValueError(f"{run / 'manifest.json'}: not an A/B run manifest (schema {raw.get('schema')!r})")
    manifest = read_manifest(raw, str(run / "manifest.json")) if raw is not None else None
    starts = read_starts(run)
    notes: list[str] = []
    windows = []
    for bdir in sorted((run / "blocks").iterdir()) if (run / "blocks").is_dir() else ():
        if not bdir.is_dir():
            continue
        w = read_window(bdir, notes)
        if w is None:
            notes.append(f"{bdir.name}: no block.json (block never started) — skipped")
        else:
            windows.append(w)
    return RunFolder(path=run, manifest=manifest, starts=starts, windows=tuple(windows), notes=tuple(notes))
