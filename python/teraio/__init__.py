"""teraio: lifetime-aware tensor offloading for stock PyTorch.

    import teraio
    session = teraio.Session(budget="24GiB",
         tiers=[teraio.HostTier("64GiB"), teraio.FileTier(["/mnt/nvme0", "/mnt/nvme1"], "500GiB")])
    for batch in loader:
        with session.step():
            loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
    print(session.stats())

See docs/pytorch.md. Every operator of a step is seen from C++ (an at::RecordFunction callback);
the first steps are profiled (reactively: only what the running operator needs is kept when the
budget is exceeded), then a plan is made and executed at operator indices.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable, Optional, Sequence, Union

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C

Error = _C.Error  # a ValueError: bad argument, budget too small, failed transfer

__all__ = ["Session", "HostTier", "FileTier", "Error", "parse_size"]

Size = Union[int, str]


def parse_size(size: Size, what: str = "size") -> int:
    """'24GiB', '1.5GB', '4096' or an int -> bytes. Raises teraio.Error naming `what`."""
    if isinstance(size, bool):
        raise Error(f"{what}: expected a size such as '24GiB', got {size!r}")
    if isinstance(size, int):
        if size <= 0:
            raise Error(f"{what}: must be positive, got {size}")
        return size
    if isinstance(size, str):
        return _C.parse_size(size, what)
    raise Error(f"{what}: expected a size such as '24GiB' or an int, got {type(size).__name__}")


class HostTier:
    """Host memory (pinned when a GPU is used), capped at `capacity`.

    read_gbps / write_gbps: the bandwidth the planner assumes (GB/s). 0 (default): the Session
    measures it with a short probe at the first step; a value > 0 is used as given.
    """

    def __init__(self, capacity: Size, read_gbps: float = 0.0, write_gbps: float = 0.0):
        self.capacity_bytes = parse_size(capacity, "HostTier capacity")
        self.read_gbps = float(read_gbps)
        self.write_gbps = float(write_gbps)

    def _spec(self) -> dict:
        return {"kind": "host", "capacity_bytes": self.capacity_bytes,
                "read_gbps": self.read_gbps, "write_gbps": self.write_gbps}

    def __repr__(self) -> str:
        return f"HostTier({self.capacity_bytes})"


class FileTier:
    """Files on one or more directories (one per SSD; tensors are striped across them).

    read_gbps / write_gbps: as for HostTier (0: measured by the Session at the first step).
    """

    def __init__(self, paths: Union[str, Sequence[str]], capacity: Size,
                 read_gbps: float = 0.0, write_gbps: float = 0.0):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise Error("FileTier: at least one directory is needed")
        for p in paths:
            if not os.path.isdir(p):
                raise Error(f"FileTier: path '{p}' is not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise Error(f"FileTier: path '{p}' is not writable")
        self.paths = paths
        self.capacity_bytes = parse_size(capacity, "FileTier capacity")
        self.read_gbps = float(read_gbps)
        self.write_gbps = float(write_gbps)

    def _spec(self) -> dict:
        return {"kind": "file", "paths": self.paths, "capacity_bytes": self.capacity_bytes,
                "read_gbps": self.read_gbps, "write_gbps": self.write_gbps}

    def __repr__(self) -> str:
        return f"FileTier({self.paths!r}, {self.capacity_bytes})"


class Session:
    """Transparent offloading of every tensor a training step touches.

    budget: resident bytes of tracked tensors allowed on the device ("24GiB").
    tiers: where offloaded bytes go, in order of preference for evictions.
    profiling_iterations: steps profiled before the plan is made (the last one is traced).
    min_tensor_bytes: smaller storages are not tracked.
    planning: False keeps the reactive mode (no plan).
    trace_path / plan_path: write the profiled trace / the plan there (formats teraio.trace/plan v1).
    plan_search: plan with several settings of the planner's heuristics, simulate each and keep the
        fastest (default); False uses the planner's default plan alone.
    stream_ordered_offloads: CUDA: wait for an offload due before the next operator on the GPU
        (the memory is freed in stream order) instead of on the CPU; host tier only. On by
        default; False restores the CPU wait.
    """

    def __init__(self, budget: Size, tiers: Iterable[Union[HostTier, FileTier]],
                 profiling_iterations: int = 2, min_tensor_bytes: int = 4096,
                 planning: bool = True, trace_path: Optional[str] = None,
                 plan_path: Optional[str] = None, plan_search: bool = True,
                 stream_ordered_offloads: bool = True):
        budget_bytes = parse_size(budget, "budget")
        tiers = list(tiers)
        if not tiers:
            raise Error("Session: at least one tier (teraio.HostTier or teraio.FileTier) is needed")
        for t in tiers:
            if not isinstance(t, (HostTier, FileTier)):
                raise Error(f"Session: unknown tier {t!r}; use teraio.HostTier or teraio.FileTier")
        if not isinstance(profiling_iterations, int) or profiling_iterations < 1:
            raise Error(f"Session: profiling_iterations must be an int >= 1, got {profiling_iterations!r}")
        for p in (trace_path, plan_path):
            if p:
                d = os.path.dirname(os.path.abspath(p))
                if not os.access(d, os.W_OK):
                    raise Error(f"Session: cannot write '{p}' (directory not writable)")
        self._impl = _C.Session(budget_bytes, [t._spec() for t in tiers], profiling_iterations,
                                int(min_tensor_bytes), bool(planning), trace_path or "",
                                plan_path or "", bool(plan_search), bool(stream_ordered_offloads))
        self._watched = []

    @contextlib.contextmanager
    def step(self):
        """One training step: forward, backward and optimizer.step() inside the block."""
        impl = self._require()
        impl.begin_step()
        try:
            yield self
        except BaseException:
            try:
                impl.end_step()
            except Error:
                pass  # the user's exception wins
            raise
        self._name_watched()
        impl.end_step()

    def watch(self, model: Optional[torch.nn.Module] = None,
              optimizer: Optional[torch.optim.Optimizer] = None) -> "Session":
        """Optional: names parameters and optimizer states in the trace (parameter name, state key)."""
        self._watched.append((model, optimizer))
        return self

    def _name_watched(self):
        impl = self._require()
        for model, optimizer in self._watched:
            names = {}
            if model is not None:
                for name, p in model.named_parameters():
                    names[id(p)] = name
                    impl.name_tensor(p, name, "parameter")
                    if p.grad is not None:
                        impl.name_tensor(p.grad, name + ".grad", "gradient")
            if optimizer is not None:
                for group in optimizer.param_groups:
                    for i, p in enumerate(group["params"]):
                        state = optimizer.state.get(p, {})
                        base = names.get(id(p), f"param{i}")
                        for key, value in state.items():
                            if isinstance(value, torch.Tensor):
                                impl.name_tensor(value, f"{base}.{key}", "optimizer_state")

    def stats(self) -> dict:
        """mode, iteration, budget_bytes, peak_resident_bytes, bytes_offloaded, bytes_prefetched,
        stall_us, plan_moves, drift_events, tiers (per tier: the bandwidth the planner uses and
        whether it was measured or given), and more (see docs/pytorch.md)."""
        return self._require().stats()

    def fetch_all(self) -> None:
        """Brings every offloaded tensor back (before torch.save, .numpy(), raw data_ptr use)."""
        self._require().fetch_all()

    @contextlib.contextmanager
    def resident(self):
        """All tracked tensors are resident inside the block (e.g. to save a checkpoint)."""
        self.fetch_all()
        yield self

    def close(self) -> None:
        """Brings everything back and removes the hooks. Another Session may then be created."""
        if self._impl is not None:
            impl, self._impl = self._impl, None
            try:
                impl.fetch_all()  # raises when bytes could not come back
            finally:
                del impl

    def _require(self):
        if self._impl is None:
            raise Error("Session is closed")
        return self._impl

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
