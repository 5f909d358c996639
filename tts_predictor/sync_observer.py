"""Counts the GPU synchronisations a block of code performs, without asking the code.

Two ways of observing, one interface:

- ``"cuda"``: on a GPU, ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising call
  (``.item()``, ``.tolist()``/``.cpu()`` of device tensors, blocking copies, stream syncs) emit a warning;
  the observer counts those warnings. This is PyTorch's own judgement of what synchronises.
- ``"logical"``: everywhere (the CPU included) a ``TorchFunctionMode`` watches every tensor operation and counts
  the ones that *would* synchronise if the device tensors lived on a GPU: a host read of a device tensor
  (``item``, ``tolist``, ``numpy``, ``cpu``, ``int()``...; one sync each) and a blocking host-to-device copy
  (``.to(device)``/``copy_`` without ``non_blocking=True``; one each). A tensor counts as on the device when it
  is a CUDA tensor, was passed in as one (``observe(..., device_tensors=[block_table])``), was created with
  ``device=observer.device`` or copied there, or was computed from such a tensor.

On the CPU the target device is ``torch.device("cpu")`` like any host tensor, so the observer hands out its own
device object (``observer.device``) and recognises it by identity: pass exactly that object as the code's
``device`` argument.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
# host reads of a tensor's values: each one waits for the device
_READS = frozenset(
    {_T.item, _T.tolist, _T.numpy, _T.cpu, _T.__int__, _T.__float__, _T.__bool__, _T.__index__, _T.__complex__}
)
_COPY = _T.copy_
_TO = _T.to


@dataclass
class SyncCount:
    """What one observed block did: syncs in all, and by kind."""

    syncs: int = 0
    reads: int = 0
    blocking_uploads: int = 0
    events: list[str] = field(default_factory=list)

    def _add(self, kind: str, what: str) -> None:
        self.syncs += 1
        if kind == "read":
            self.reads += 1
        else:
            self.blocking_uploads += 1
        if len(self.events) < 64:
            self.events.append(what)


class _LogicalMode(TorchFunctionMode):
    def __init__(self, device: torch.device, count: SyncCount, device_tensors: Iterable[torch.Tensor]):
        super().__init__()
        self._device = device
        self._count = count
        self._on_device: dict[int, weakref.ref] = {}  # id -> ref; tensors compare elementwise, so no WeakSet
        for t in device_tensors:
            self._add_dev(t)

    def _add_dev(self, t: torch.Tensor) -> None:
        key = id(t)
        self._on_device[key] = weakref.ref(t, lambda _, key=key: self._on_device.pop(key, None))

    def _is_dev(self, x) -> bool:
        if not isinstance(x, torch.Tensor):
            return False
        if x.device.type not in ("cpu", "meta"):
            return True
        ref = self._on_device.get(id(x))
        return ref is not None and ref() is x

    def _targets_device(self, args, kwargs) -> bool:
        cand = list(args[1:]) + [kwargs.get("device")]
        return any(
            c is self._device or (isinstance(c, torch.device) and c.type not in ("cpu", "meta"))
            or (isinstance(c, str) and c.startswith("cuda"))
            or (isinstance(c, torch.Tensor) and self._is_dev(c))
            for c in cand
        )

    def _mark(self, out) -> None:
        if isinstance(out, torch.Tensor):
            if out.device.type == "cpu":
                self._add_dev(out)
        elif isinstance(out, (tuple, list)):
            for o in out:
                self._mark(o)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        src = args[0] if args else None
        if func in _READS:
            if self._is_dev(src):
                self._count._add("read", getattr(func, "__name__", str(func)))
                if out is src:  # .cpu() of a "device" tensor that already is a CPU tensor: hand out a host alias
                    out = src.detach()
            return out
        if func is _TO:
            src_dev = self._is_dev(src)
            dst_dev = self._targets_device(args, kwargs)
            if src_dev and not dst_dev and (out is not src or _names_host(args, kwargs)):
                self._count._add("read", "to(host)")
                if out is src:
                    out = src.detach()
            elif not src_dev and dst_dev:
                if not kwargs.get("non_blocking", False):
                    self._count._add("upload", "to(device)")
                if out is src:  # .to(device) of a host tensor on the CPU returns the tensor itself: the copy that
                    out = src.detach()  # a GPU would make is a device alias, so the host tensor stays a host one
                self._mark(out)
            elif src_dev:
                self._mark(out)
            return out
        if func is _COPY:
            dst, copy_src = args[0], args[1] if len(args) > 1 else kwargs.get("src")
            if self._is_dev(dst) and not self._is_dev(copy_src):
                if not (kwargs.get("non_blocking", False) or (len(args) > 2 and args[2])):
                    self._count._add("upload", "copy_(host->device)")
            elif not self._is_dev(dst) and self._is_dev(copy_src):
                self._count._add("read", "copy_(device->host)")
            return out
        if kwargs.get("device", None) is self._device or any(self._is_dev(a) for a in _flat(args, kwargs)):
            self._mark(out)
        return out


def _names_host(args, kwargs) -> bool:
    """Does a .to(...) call name the host explicitly (as opposed to a dtype-only conversion)?"""
    for c in list(args[1:]) + [kwargs.get("device")]:
        if (isinstance(c, torch.device) and c.type == "cpu") or c == "cpu":
            return True
    return False


def _flat(args, kwargs) -> Iterator:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


class SyncObserver:
    """``with observer.observe(device_tensors=[bt]) as count: f(..., device=observer.device)``; then ``count.syncs``."""

    def __init__(self, device: str | torch.device = "cpu", method: str | None = None):
        dev = torch.device(device)
        if method is None:
            method = "cuda" if dev.type == "cuda" else "logical"
        if method not in ("cuda", "logical"):
            raise ValueError(f"unknown sync observer method {method!r} (use 'cuda' or 'logical')")
        if method == "cuda" and dev.type != "cuda":
            raise ValueError("the 'cuda' sync observer needs a CUDA device; use method='logical' elsewhere")
        self.method = method
        # a distinct object: the logical observer recognises uploads to it by identity (see module doc)
        self.device = torch.device(dev.type, dev.index) if dev.index is not None else torch.device(dev.type)

    @contextlib.contextmanager
    def observe(self, device_tensors: Iterable[torch.Tensor] = ()) -> Iterator[SyncCount]:
        count = SyncCount()
        if self.method == "logical":
            with _LogicalMode(self.device, count, device_tensors):
                yield count
            return
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield count
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        for w in caught:
            if "synchroniz" in str(w.message):
                count._add("read", str(w.message)[:80])
