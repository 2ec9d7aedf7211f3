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
import gc
import errno as _errno
import math
import os
import time
import weakref
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C

Error = _C.Error  # a ValueError: bad argument, budget too small
IoError = _C.IoError  # a teraio.Error: a transfer failed (docs/pytorch.md, "Faults")
__version__ = _C.__version__  # the VERSION file's, compiled into the extension
# The one list of each (include/teraio/session.h, Note [Options and stats fields]): Session's options
# (as SessionOptions names them: `budget` is budget_bytes), the keys of Session.stats() (STATS_COUNTERS:
# the cumulative ones, whose difference over steps is what those steps did) and of each of its tiers.
SESSION_OPTIONS = tuple(_C.SESSION_OPTIONS)
STATS_FIELDS = tuple(_C.STATS_FIELDS)
STATS_COUNTERS = tuple(_C.STATS_COUNTERS)
TIER_STATS_FIELDS = tuple(_C.TIER_STATS_FIELDS)

__all__ = ["Session", "HostTier", "FileTier", "Error", "IoError", "PerformanceHint", "parse_size",
           "parse_tiers",
           "clip_grad_norm_", "get_total_norm", "clip_grads_with_norm_", "SESSION_OPTIONS",
           "STATS_FIELDS", "STATS_COUNTERS", "TIER_STATS_FIELDS"]

_MAX_BYTES = 2**64 - 1


class PerformanceHint(UserWarning):
    """teraio's advice that a change to the training loop is predicted to make it faster (given
    once per Session; silence with warnings.filterwarnings("ignore", category=teraio.PerformanceHint))."""


# The smallest predicted gain (a fraction of the step) worth a PerformanceHint.
HINT_GAIN = 0.05

Size = Union[int, str]


def parse_size(size: Size, what: str = "size") -> int:
    """'24GiB', '1.5GB', '4096' or an int -> bytes. Raises teraio.Error naming `what`."""
    if isinstance(size, bool):
        raise Error(f"{what}: expected a size such as '24GiB', got {size!r}")
    if isinstance(size, int):
        if size <= 0:
            raise Error(f"{what}: must be positive, got {size}")
        if size > _MAX_BYTES:
            raise Error(f"{what}: {size} bytes is more than 2**64 - 1; give a size such as '24GiB'")
        return size
    if isinstance(size, str):
        return _C.parse_size(size, what)
    raise Error(f"{what}: expected a size such as '24GiB' or an int, got {type(size).__name__}")


def _bandwidth(value, what: str) -> float:
    """A bandwidth in GB/s: a finite number >= 0 (0: not given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Error(f"{what}: expected a number of GB/s such as 25.0, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise Error(f"{what}: must be a finite number of GB/s >= 0 (0: not given), got {value!r}")
    return v


class HostTier:
    """Host memory (pinned when a GPU is used), capped at `capacity`.

    read_gbps / write_gbps: the bandwidth the planner assumes (GB/s). 0 (default): the Session
    measures it with a short probe at the first step; a value > 0 is used as given.
    duplex_gbps: GB/s per direction while reads and writes move at once (one link carries both).
    0 (default): measured by the probe when it runs, else 0.9 of the slower of read and write.
    """

    def __init__(self, capacity: Size, read_gbps: float = 0.0, write_gbps: float = 0.0,
                 duplex_gbps: float = 0.0):
        self.capacity_bytes = parse_size(capacity, "HostTier capacity")
        self.read_gbps = _bandwidth(read_gbps, "HostTier read_gbps")
        self.write_gbps = _bandwidth(write_gbps, "HostTier write_gbps")
        self.duplex_gbps = _bandwidth(duplex_gbps, "HostTier duplex_gbps")

    def _spec(self) -> dict:
        return {"kind": "host", "capacity_bytes": self.capacity_bytes,
                "read_gbps": self.read_gbps, "write_gbps": self.write_gbps,
                "duplex_gbps": self.duplex_gbps}

    def __repr__(self) -> str:
        return f"HostTier({self.capacity_bytes})"


class FileTier:
    """Files on one or more directories (one per SSD; tensors are striped across them).

    read_gbps / write_gbps / duplex_gbps: as for HostTier (0: measured by the Session at the first
    step).
    """

    def __init__(self, paths: Union[str, Sequence[str]], capacity: Size,
                 read_gbps: float = 0.0, write_gbps: float = 0.0, duplex_gbps: float = 0.0):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        try:
            paths = [os.fspath(p) for p in paths]
        except TypeError:
            raise Error(f"FileTier: paths must be a directory or a list of directories, "
                        f"got {paths!r}") from None
        if not paths:
            raise Error("FileTier: at least one directory is needed")
        for p in paths:
            if not os.path.isdir(p):
                raise Error(f"FileTier: path '{p}' is not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise Error(f"FileTier: path '{p}' is not writable")
        self.paths = paths
        self.capacity_bytes = parse_size(capacity, "FileTier capacity")
        self.read_gbps = _bandwidth(read_gbps, "FileTier read_gbps")
        self.write_gbps = _bandwidth(write_gbps, "FileTier write_gbps")
        self.duplex_gbps = _bandwidth(duplex_gbps, "FileTier duplex_gbps")

    def _spec(self) -> dict:
        return {"kind": "file", "paths": self.paths, "capacity_bytes": self.capacity_bytes,
                "read_gbps": self.read_gbps, "write_gbps": self.write_gbps,
                "duplex_gbps": self.duplex_gbps}

    def __repr__(self) -> str:
        return f"FileTier({self.paths!r}, {self.capacity_bytes})"


from .tiers import parse_tiers  # noqa: E402  (after HostTier and FileTier, which it builds)


# torch.save reads storages directly, not through an operator: an offloaded tensor then has no data
# and PyTorch's error says nothing of teraio. While a Session is open, torch.save is wrapped so that
# this error says what to do; nothing else changes (the wrapper only looks at a failed save).
_open_sessions = 0
_torch_save = torch.save
_active = lambda: None  # a weak reference to the open Session (one at a time per process)


def _active_session() -> Optional["Session"]:
    session = _active()
    return session if session is not None and session._impl is not None else None


def _save_with_hint(*args, **kwargs):
    try:
        return _torch_save(*args, **kwargs)
    except RuntimeError as e:
        msg = str(e)
        if _open_sessions and ("invalid python storage" in msg or "not allocated" in msg):
            raise Error("torch.save met a tensor that teraio has offloaded (its bytes are in a tier): "
                        "save inside `with session.resident():`, or call session.fetch_all() "
                        "first") from e
        raise


# Owners that free a storage's bytes themselves (FSDP2: untyped_storage().resize_(0) after using an
# unsharded parameter, resize_(n) before the next all-gather) do it behind the dispatcher, and
# PyTorch refuses to resize a storage whose bytes teraio holds in a tier, and a writeback may still
# be copying a resident one. While a Session is open, UntypedStorage.resize_ first tells it (Note
# [Storages their owner resizes] in src/torch/session.cpp), which hands the storage over: to 0,
# teraio drops its copy; to another size, it brings absent bytes back first.
_storage_resize = torch.UntypedStorage.resize_


def _resize_with_session(self, size):
    session = _active_session()
    if session is not None and isinstance(size, int) and size >= 0:
        session._impl.storage_resizing(self._cdata, size)
    return _storage_resize(self, size)


# Note [Compiled graphs]: torch.compile's inductor backend runs generated kernels (C++ on the CPU,
# Triton on CUDA) that read and write tensors through raw pointers, outside PyTorch's dispatcher:
# the Session sees neither those uses nor the buffers the graph allocates, so its plan may free or
# move a tensor such a kernel then reads (on the CPU a tiny MLP under torch.compile crashed the
# process with a segmentation fault once a tensor was offloaded). While a Session is open, calling
# an inductor graph raises teraio.Error instead, before it runs. backend="aot_eager" runs its graphs
# through the dispatcher and trains bitwise as eager (tests/python/test_api.py).
_COMPILED_MESSAGE = (
    "teraio: a graph compiled by torch.compile's inductor backend ran while a teraio.Session is "
    "open. Its generated kernels read and write tensors through raw pointers, outside PyTorch's "
    "dispatcher, where teraio can neither see those uses nor bring an offloaded tensor back (they "
    "would read freed memory). Under a Session compile with torch.compile(..., "
    "backend=\"aot_eager\") (its graphs run through the dispatcher, bitwise as eager) or leave the "
    "model uncompiled (docs/pytorch.md, \"torch.compile\")")
_compiled_calls = {}  # inductor's graph class -> its own __call__, while a guard replaces it


def _guard_compiled_graphs():
    try:
        from torch._inductor import output_code
    except Exception:  # no inductor in this build: nothing can be compiled with it
        return
    for cls in (getattr(output_code, "CompiledFxGraph", None), getattr(output_code, "CompiledAOTI", None)):
        if cls is None or cls in _compiled_calls:
            continue
        own = cls.__dict__.get("__call__")
        if own is None:
            continue

        def guarded(self, *args, **kwargs):
            raise Error(_COMPILED_MESSAGE)
        _compiled_calls[cls] = own
        cls.__call__ = guarded


def _unguard_compiled_graphs():
    for cls, own in _compiled_calls.items():
        cls.__call__ = own
    _compiled_calls.clear()


def _session_opened():
    global _open_sessions
    _open_sessions += 1
    if torch.save is _torch_save:
        torch.save = _save_with_hint
    if torch.UntypedStorage.resize_ is _storage_resize:
        torch.UntypedStorage.resize_ = _resize_with_session
    _guard_compiled_graphs()


def _session_closed():
    global _open_sessions
    _open_sessions = max(0, _open_sessions - 1)
    if _open_sessions == 0 and torch.save is _save_with_hint:
        torch.save = _torch_save
    if _open_sessions == 0 and torch.UntypedStorage.__dict__.get("resize_") is _resize_with_session:
        del torch.UntypedStorage.resize_  # PyTorch's own again (inherited from torch._C.StorageBase)
    if _open_sessions == 0:
        _unguard_compiled_graphs()


# How the Session's advice for an operator over a whole group of tensors begins (group_hint in
# src/torch/session.cpp): the optimizer's, the gradient norm's, zero_grad's.
_HINTS = (". A foreach or fused optimizer step touches every parameter",
          ". The gradient norm (torch.nn.utils.clip_grad_norm_)",
          ". optimizer.zero_grad(set_to_none=False)")


def _add_note(error: BaseException, note: str) -> None:
    """error.add_note(note) (Python 3.11+: printed after the message); before 3.11, nothing."""
    add = getattr(error, "add_note", None)
    if add is not None:
        add(note)


class Session:
    """Transparent offloading of every tensor a training step touches.

    budget: resident bytes of tracked tensors allowed on the device ("24GiB").
    tiers: where offloaded bytes go, in order of preference for evictions.
    profiling_iterations: steps profiled before the plan is made (the last one is traced).
    min_tensor_bytes: smaller storages are not tracked (an int or a size such as "4KiB"; 0 tracks all).
    planning: False keeps the reactive mode (no plan).
    trace_path / plan_path: write the profiled trace / the plan there (formats teraio.trace/plan v1).
    plan_search: plan with several settings of the planner's heuristics, simulate each and keep the
        fastest (default); False uses the planner's default plan alone.
    stream_ordered_offloads: CUDA: wait for an offload due before the next operator on the GPU
        (the memory is freed in stream order) instead of on the CPU; host tier only. On by
        default; False restores the CPU wait.
    verify: file tiers checksum every piece written and verify it when read back, so damaged or
        truncated files raise teraio.IoError instead of feeding wrong numbers to the model (default).
    fault_injection: wrap the tiers so that inject_fault() can make transfers fail (tests, and
        rehearsing recovery; docs/pytorch.md "Faults").
    recompute: the plan may free an activation after its last forward use and make it again before
        its next use by rerunning the operator that produced it (same kernel, same inputs: the same
        bytes), where that is faster than moving it (default); False: plans move bytes only
        (docs/pytorch.md "Recompute").
    clean_offloads: a tensor read back from a tier and not written in place since is offloaded
        again to that tier without writing it (its copy there is kept; writes are seen through the
        version counters of every operator's inputs). On by default; False writes every offload
        (for tensors written behind PyTorch's dispatcher; docs/pytorch.md "Clean offloads").
    discard_dead: a tensor that the profiled steps never use again before freeing it (a gradient
        after the optimizer read it, until zero_grad) is freed without writing it out where the
        plan takes it away. A later step that uses it after all raises teraio's error naming it.
        On by default; False writes such tensors out (docs/pytorch.md "Dead tensors").
    """

    def __init__(self, budget: Size, tiers: Iterable[Union[HostTier, FileTier]],
                 profiling_iterations: int = 2, min_tensor_bytes: Size = 4096,
                 planning: bool = True, trace_path: Optional[str] = None,
                 plan_path: Optional[str] = None, plan_search: bool = True,
                 stream_ordered_offloads: bool = True, verify: bool = True,
                 fault_injection: bool = False, recompute: bool = True,
                 clean_offloads: bool = True, discard_dead: bool = True):
        self._impl = None
        budget_bytes = parse_size(budget, "budget")
        if isinstance(tiers, (str, bytes, HostTier, FileTier)):
            raise Error(f"Session: tiers must be a list such as [teraio.HostTier('64GiB')], "
                        f"got {tiers!r}")
        try:
            tiers = list(tiers)
        except TypeError:
            raise Error(f"Session: tiers must be a list such as [teraio.HostTier('64GiB')], "
                        f"got {tiers!r}") from None
        if not tiers:
            raise Error("Session: at least one tier (teraio.HostTier or teraio.FileTier) is needed")
        for t in tiers:
            if not isinstance(t, (HostTier, FileTier)):
                raise Error(f"Session: unknown tier {t!r}; use teraio.HostTier or teraio.FileTier")
        if (isinstance(profiling_iterations, bool) or not isinstance(profiling_iterations, int)
                or profiling_iterations < 1):
            raise Error(f"Session: profiling_iterations must be an int >= 1, got {profiling_iterations!r}")
        if isinstance(min_tensor_bytes, int) and not isinstance(min_tensor_bytes, bool) \
                and min_tensor_bytes == 0:
            min_bytes = 0
        else:
            min_bytes = parse_size(min_tensor_bytes, "Session: min_tensor_bytes")
        for name, flag in (("planning", planning), ("plan_search", plan_search),
                           ("stream_ordered_offloads", stream_ordered_offloads),
                           ("verify", verify), ("fault_injection", fault_injection),
                           ("recompute", recompute), ("clean_offloads", clean_offloads),
                           ("discard_dead", discard_dead)):
            if not isinstance(flag, bool):
                raise Error(f"Session: {name} must be True or False, got {flag!r}")
        for p in (trace_path, plan_path):
            if p:
                d = os.path.dirname(os.path.abspath(p))
                if not os.access(d, os.W_OK):
                    raise Error(f"Session: cannot write '{p}' (directory not writable)")
        # Keyword arguments named as SessionOptions' fields (SESSION_OPTIONS).
        self._impl = _C.Session(budget_bytes=budget_bytes, tiers=[t._spec() for t in tiers],
                                profiling_iterations=profiling_iterations,
                                min_tensor_bytes=min_bytes, planning=planning,
                                trace_path=trace_path or "", plan_path=plan_path or "",
                                plan_search=plan_search,
                                stream_ordered_offloads=stream_ordered_offloads, verify=verify,
                                fault_injection=fault_injection, recompute=recompute,
                                clean_offloads=clean_offloads, discard_dead=discard_dead)
        self._budget_bytes = budget_bytes
        self._watched = []
        self._adopted = set()  # (id(model), id(optimizer)) of the watched pairs adopted (_adopt)
        self._split = []  # optimizers whose steps teraio wraps (watch)
        self._names = None  # id(parameter) -> name in a watched model (_param_name)
        self._named_generation = None  # names_generation() when the watched tensors were named
        self._predict_in_backward = False  # plans predict steps in backward (watch)
        self._hinted = False  # the PerformanceHint about steps in backward was given (or decided)
        self._auto: Optional[_AutoInBackward] = None  # watch(..., step_in_backward="auto")
        self._steps_in_backward = False
        _session_opened()
        global _active
        _active = weakref.ref(self)

    @contextlib.contextmanager
    def step(self):
        """One training step: forward, backward and optimizer.step() inside the block.

        Raises teraio.IoError when a transfer failed during the step (also when that made the body
        fail: PyTorch's error is chained as the cause), teraio.Error for other problems of the step
        (a budget that could not be met). The Session stays usable: the next step runs.
        """
        impl = self._require()
        impl.begin_step()
        try:
            self._adopt(impl)
            yield self
        except BaseException as body_error:
            # Steps in backward: the updates this step made before it failed stay made, and the
            # next step starts afresh (Note [Steps in backward] in optim.py).
            updated = self._abort_steps_in_backward()
            fault = None
            try:
                impl.end_step()
            except IoError as e:
                fault = e
            except Error:
                pass  # the user's exception wins
            note = (f"teraio: with steps in backward, this step had already updated {updated} "
                    f"parameter(s) when it failed; those updates stay made (the others were not "
                    f"made), and the next step runs normally" if updated else None)
            # The body failed on a tensor whose transfer failed: the fault is the cause. An
            # interrupt (KeyboardInterrupt, SystemExit) still wins.
            if fault is not None and isinstance(body_error, Exception):
                if note:
                    _add_note(fault, note)
                try:
                    raise fault from body_error
                finally:
                    # No cycle (this frame -> the fault -> its traceback -> this frame) may keep the
                    # failed step's tensors alive until a garbage collection.
                    fault = None
            if note:
                _add_note(body_error, note)
            raise
        self._name_watched()
        try:
            impl.end_step()
        except IoError:
            raise
        except Error as e:
            refined = self._refine_error(str(e))
            if refined is None:
                raise
            raise Error(refined) from e
        if self._auto is not None:
            self._auto.after_step(self, impl.stats(), _clock())
        elif self._predict_in_backward and not self._hinted:
            self._hint_steps_in_backward(impl.stats())  # once, after the first plan

    @staticmethod
    def _replays(st: dict) -> Tuple[float, float]:
        """The step as it runs and with steps in backward, both replayed without the Session's own
        measured host time (plan_predicted_us: the in-backward loop's is not measured)."""
        return (st.get("plan_predicted_us") or st["predicted_iteration_us"],
                st["predicted_step_in_backward_us"])

    def _predicted_gain(self, st: dict) -> Optional[float]:
        """The fraction of the step that steps in backward are predicted to save, once a plan
        exists (None before; 0 or less when not faster or not predicted)."""
        now, moved = self._replays(st)
        if st["mode"] != "planned" or now <= 0:
            return None
        return 1 - moved / now if moved > 0 else 0.0

    def _hint_steps_in_backward(self, st: dict) -> None:
        """Once a plan exists: a PerformanceHint when the same loop with its optimizer updates in
        the backward is predicted at least HINT_GAIN faster (docs/pytorch.md, "Optimizer steps in
        backward")."""
        gain = self._predicted_gain(st)
        if self._hinted or gain is None:
            return
        self._hinted = True
        # Decided: later plans (new profiles) need not plan the rewritten profile again; the stats
        # keep this prediction.
        self._require().set_predict_step_in_backward(False)
        now, moved = self._replays(st)
        if gain >= HINT_GAIN:
            import warnings
            warnings.warn(PerformanceHint(
                f"teraio: the simulator predicts {moved / 1e3:.1f} ms per step for this loop with "
                f"each optimizer update run in the backward, against {now / 1e3:.1f} ms as it runs "
                f"({100 * gain:.0f}% less): session.watch(model, optimizer, "
                f"step_in_backward=True) does that when the loop neither clips nor accumulates "
                f"gradients (under the Hugging Face Trainer: TeraioCallback(..., "
                f"step_in_backward=True) with max_grad_norm=0; docs/pytorch.md, \"Optimizer steps "
                f"in backward\"); "
                f"stats()['predicted_step_in_backward_us'] keeps the number"), stacklevel=4)

    def watch(self, model: Optional[torch.nn.Module] = None,
              optimizer: Optional[torch.optim.Optimizer] = None, *,
              split_steps: bool = True,
              step_in_backward: Union[bool, str] = False) -> "Session":
        """Names parameters and optimizer states in the trace (parameter name, state key), and runs
        each optimizer.step() of a foreach or fused torch.optim optimizer in parts that fit the
        budget (split_steps; bitwise the same result; docs/pytorch.md, "Optimizers").

        step_in_backward: each parameter's update runs during backward, as soon as its gradient is
        complete, so that the optimizer states move while backward computes (docs/pytorch.md,
        "Optimizer steps in backward"). Bitwise the same result for a loop that calls
        optimizer.step() once after each backward and changes neither the gradients nor the
        optimizer's group values in between (no gradient clipping or accumulation); anything else
        raises teraio.Error. "auto": the same conditions accepted, the Session tries it after its
        first plan when it predicts the step at least HINT_GAIN faster that way, and keeps it if
        the steps it times agree (Note [Auto steps in backward]; session.steps_in_backward,
        session.step_in_backward_decision). The optimizer gets its step() back when the Session
        closes."""
        if not isinstance(split_steps, bool):
            raise Error(f"Session.watch: split_steps must be True or False, got {split_steps!r}")
        if not isinstance(step_in_backward, bool) and step_in_backward != "auto":
            raise Error(f"Session.watch: step_in_backward must be True, False or 'auto', got "
                        f"{step_in_backward!r}")
        auto = step_in_backward == "auto"
        self._require()
        if step_in_backward:
            if optimizer is None:
                raise Error(f"Session.watch: step_in_backward={step_in_backward!r} needs the "
                            f"optimizer (session.watch(model, optimizer, "
                            f"step_in_backward={step_in_backward!r}))")
            from . import optim
            if not optim.splits_steps(optimizer):
                optim._install(optimizer, self, split_steps, True)  # raises, naming the class
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                raise Error("Session.watch: step_in_backward=True updates each parameter from its "
                            "local gradient during backward, before data-parallel training "
                            "averages the gradients across ranks; use step_in_backward=False "
                            "with DDP or FSDP")
        self._watched.append((model, optimizer))
        self._named_generation = None  # its tensors may be tracked already, unnamed
        self._names = None
        if optimizer is not None and (split_steps or step_in_backward):
            self._split_steps(optimizer, split_steps, step_in_backward is True)
        if optimizer is not None:
            # Note [Predicting steps in backward] (src/offload/controller.cpp): only for an
            # optimizer whose updates could run in backward and do not yet.
            from . import optim
            self._predict_in_backward = (optim.splits_steps(optimizer)
                                         and step_in_backward is not True)
            self._require().set_predict_step_in_backward(self._predict_in_backward)
            self._steps_in_backward = step_in_backward is True
            if auto:
                if self._auto is None:
                    self._auto = _AutoInBackward()
                self._auto.optimizers.append((optimizer, split_steps))
        return self

    def _set_steps_in_backward(self, on: bool) -> None:
        """Turns the "auto" optimizers' steps in backward on or off (between steps)."""
        from . import optim
        for optimizer, split in self._auto.optimizers:
            optim._install(optimizer, self, split, on)
        self._require().set_predict_step_in_backward(False)
        self._steps_in_backward = on

    @property
    def step_in_backward_decision(self) -> Optional[dict]:
        """watch(..., step_in_backward="auto"): what the Session predicted and measured and whether
        it kept steps in backward (None without "auto"; docs/pytorch.md, "Optimizer steps in
        backward")."""
        return None if self._auto is None else dict(self._auto.decision)

    @property
    def steps_in_backward(self) -> bool:
        """Whether the watched optimizer's updates run in backward (step_in_backward=True, or
        "auto" once the Session turned it on)."""
        return self._steps_in_backward

    def _abort_steps_in_backward(self) -> int:
        """A step failed: each watched optimizer forgets the parameters it updated in this step's
        backward (so that the next backward is not taken for a second one before step()). Returns
        how many there were."""
        from . import optim
        return sum(optim._abort_step(o) for o in self._split)

    def _split_steps(self, optimizer, split: bool = True, in_backward: bool = False) -> None:
        from . import optim
        optim._install(optimizer, self, split, in_backward)
        if optimizer not in self._split:
            self._split.append(optimizer)

    def _param_name(self, p: torch.Tensor) -> Optional[str]:
        """The name of a watched model's parameter (None if no watched model has it)."""
        if getattr(self, "_names", None) is None:
            self._names = {id(q): name for model, _ in self._watched if model is not None
                           for name, q in model.named_parameters()}
        return self._names.get(id(p))

    def _part_bytes(self) -> int:
        from .optim import PART_OF_BUDGET
        return max(1, int(self._budget_bytes * PART_OF_BUDGET))

    def _refine_error(self, message: str) -> Optional[str]:
        """The Session's advice for an operator over a whole group of tensors (its sentences start
        as in _HINTS) assumes that nothing splits it; where the optimizer is watched or the gradient
        norm is teraio's, say what is left to do instead. None: the message stands."""
        starts = sorted(i for i in (message.find(h) for h in _HINTS) if i >= 0)
        if not starts:
            return None
        ends = starts[1:] + [len(message)]
        sentences = [message[a:b] for a, b in zip(starts, ends)]
        refined = [self._refine_hint(s) for s in sentences]
        if all(r is None for r in refined):
            return None
        return message[:starts[0]] + "".join(s if r is None else r
                                             for s, r in zip(sentences, refined))

    def _refine_hint(self, sentence: str) -> Optional[str]:
        from . import optim
        if sentence.startswith(_HINTS[0]) and self._split:
            unsplit = sorted({type(optim._unwrap(o)).__name__ for o in self._split
                              if not optim.splits_steps(o)})
            if unsplit:
                return (f". teraio does not run {', '.join(unsplit)} steps in parts (only "
                        f"torch.optim's per-parameter optimizers: docs/pytorch.md, "
                        f"\"Optimizers\"): create it with foreach=False (and fused=False), or "
                        f"raise the budget")
            return (f". The optimizer is watched, so its steps run in parts of at most "
                    f"{self._part_bytes()} bytes, but a part holds one parameter at least: a "
                    f"parameter with its gradient and states did not fit: raise the budget")
        if sentence.startswith(_HINTS[1]) and torch.nn.utils.get_total_norm is optim.get_total_norm:
            return (f". The gradient norm is teraio's (teraio.clip_grad_norm_), taken in parts of "
                    f"at most {self._part_bytes()} bytes, but a part holds one gradient at least: "
                    f"a gradient did not fit: raise the budget")
        return None

    def _adopt(self, impl) -> None:
        """Tracks what each watched model and optimizer hold from the next step's start (the
        parameters, their gradients, and optimizer states that exist already, as after loading a
        checkpoint), so that a budget below their bytes can move them before their first use
        (Note [Adopted tensors] in src/torch/session.cpp)."""
        for model, optimizer in self._watched:
            key = (id(model), id(optimizer))
            if key in self._adopted:
                continue
            tensors = []
            if model is not None:
                for p in model.parameters():
                    tensors.append(p)
                    if p.grad is not None:
                        tensors.append(p.grad)
            if optimizer is not None:
                for state in optimizer.state.values():
                    tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
            impl.adopt(tensors)
            self._adopted.add(key)

    def _name_watched(self):
        impl = self._require()
        # Names stick to the tensors the Session tracks: only new ones need them (the loop below
        # costs a few ms a step for a model of a few hundred parameters).
        generation = impl.names_generation()
        if generation == self._named_generation:
            return
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
        self._named_generation = generation

    def stats(self) -> dict:
        """mode, iteration, budget_bytes, peak_resident_bytes, bytes_offloaded, bytes_prefetched,
        stall_us, plan_moves, drift_events, tiers (per tier: the bandwidth the planner uses and
        whether it was measured or given), and more (see docs/pytorch.md)."""
        return self._require().stats()

    def fetch_all(self) -> None:
        """Brings every offloaded tensor back (before torch.save, .numpy(), raw data_ptr use).

        Raises teraio.IoError naming the tensors that could not come back (the others did)."""
        self._require().fetch_all()

    @contextlib.contextmanager
    def resident(self):
        """All tracked tensors are resident inside the block (e.g. to save a checkpoint)."""
        self.fetch_all()
        yield self

    def inject_fault(self, error: str = "EIO", direction: str = "any", count: int = 1,
                     after: int = 0, tier: int = 0, delay_ms: float = 0) -> None:
        """Makes transfers of tiers[tier] fail or lag (needs Session(..., fault_injection=True)).

        error: an errno name ("EIO", "ENOSPC", "EPERM", "EBADMSG" as a checksum mismatch reports it,
            "ENODATA" as a truncated file does), "short" (half the bytes move, then it fails) or
            "slow" (the transfer succeeds, reported delay_ms late: a degraded disk).
        direction: "read", "write" or "any". count: how many transfers fail, after skipping `after`.
        clear_faults() removes every injected fault.
        """
        impl = self._require()
        for name, v, low in (("count", count, 1), ("after", after, 0), ("tier", tier, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise Error(f"inject_fault: {name} must be an int >= {low}, got {v!r}")
        if direction not in ("read", "write", "any"):
            raise Error(f"inject_fault: direction must be 'read', 'write' or 'any', got {direction!r}")
        if error == "slow":
            if isinstance(delay_ms, bool) or not isinstance(delay_ms, (int, float)) \
                    or not 0 < delay_ms <= 3_600_000:
                raise Error(f"inject_fault: error='slow' needs delay_ms > 0 (at most an hour), "
                            f"got {delay_ms!r}")
            impl.inject_fault(tier, "slow", direction, after, count, 0, int(delay_ms * 1000))
            return
        if delay_ms:
            raise Error("inject_fault: delay_ms is for error='slow'")
        if error == "short":
            if direction == "any":
                raise Error("inject_fault: error='short' needs direction 'read' or 'write'")
            impl.inject_fault(tier, "short", direction, after, count, 0)
            return
        code = getattr(_errno, str(error), None)
        if not isinstance(code, int) or error not in _errno.errorcode.values():
            raise Error(f"inject_fault: error must be an errno name such as 'EIO' or 'short', "
                        f"got {error!r}")
        impl.inject_fault(tier, "error", direction, after, count, code)

    def clear_faults(self) -> None:
        """Removes every fault inject_fault() added: transfers succeed again."""
        self._require().clear_faults()

    def close(self) -> None:
        """Brings everything back, removes the hooks and the tier files; another Session may then be
        created. Always completes; raises teraio.IoError afterwards if some tensor could not be
        brought back (it is lost: every access to it raises that message)."""
        if self._impl is not None:
            from . import optim
            for optimizer in self._split:
                optim._uninstall(optimizer, self)
            self._split = []
            impl, self._impl = self._impl, None
            # Tensors only a reference cycle keeps (a failed step's graph, held by its exception's
            # traceback) go first: close() would bring them back, and report as lost those that
            # can no longer be made again (a recompute whose inputs have changed since).
            gc.collect()
            try:
                impl.close()
            finally:
                del impl
                _session_closed()

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


_clock = time.perf_counter  # step ends, for step_in_backward="auto" (tests replace it)

# Planned steps without drift timed on each side of an "auto" switch.
AUTO_STEPS = 3


class _AutoInBackward:
    """Note [Auto steps in backward]: watch(..., step_in_backward="auto") means the user accepts the
    loop's conditions for steps in backward and lets the Session choose. The choice is measured,
    not only predicted: once the first plan predicts steps in backward at least HINT_GAIN faster,
    AUTO_STEPS planned steps are timed (the time between consecutive step ends: the pace of a long
    run, whatever the CPU runs ahead), steps in backward are turned on (the next step drifts from
    the plan, the one after is profiled and planned again), and once planned steps without drift
    run again, AUTO_STEPS more are timed. Steps in backward stay only if those are faster; otherwise
    they are turned off, and the first plan (cached for that loop's signature) comes back after one
    step that drifts. Either way the decision is final and `decision` says what was seen."""

    def __init__(self):
        self.optimizers = []  # (optimizer, split_steps)
        self.phase = "predict"  # -> "before" -> "settle" -> "after" -> "done"
        self.times = []  # step periods (s) of the phase being timed
        self.last_end = None  # the last step's end (clock)
        self.last_drift = None  # drift_events after the last step
        self.decision = {"predicted_gain": None, "before_s": None, "after_s": None, "kept": False}

    def after_step(self, session: "Session", st: dict, now: float) -> None:
        period = None if self.last_end is None else now - self.last_end
        steady = (st["mode"] == "planned" and self.last_drift is not None
                  and st["drift_events"] == self.last_drift)
        self.last_end, self.last_drift = now, st["drift_events"]
        if self.phase == "predict":
            gain = session._predicted_gain(st)
            if gain is None:
                return
            self.decision["predicted_gain"] = gain
            self.phase = "before" if gain >= HINT_GAIN else "done"
            if self.phase == "done":
                session._require().set_predict_step_in_backward(False)
        elif self.phase in ("before", "after") and steady and period is not None:
            self.times.append(period)
            if len(self.times) < AUTO_STEPS:
                return
            mean = sum(self.times) / len(self.times)
            self.times = []
            if self.phase == "before":
                self.decision["before_s"] = mean
                session._set_steps_in_backward(True)
                self.phase = "settle"
            else:
                self.decision["after_s"] = mean
                keep = mean < self.decision["before_s"]
                self.decision["kept"] = keep
                if not keep:
                    session._set_steps_in_backward(False)
                self.phase = "done"
        elif self.phase == "settle" and steady:
            self.phase = "after"  # planned for the new loop: time the steps from here on


from .optim import clip_grad_norm_, clip_grads_with_norm_, get_total_norm  # noqa: E402
