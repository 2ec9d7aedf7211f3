"""Foreach and fused optimizer steps, and the gradient norm, in parts that fit a Session's budget.

One `aten::_foreach_*` or `aten::_fused_adamw_` operator takes the parameters, gradients and states
of a whole parameter group, so the budget would have to hold the group at once. Their math is per
tensor (element-wise on each list entry: nothing reads another entry), so running the optimizer's
own step over sub-groups, or `torch._foreach_norm` over parts of the gradient list, gives bitwise
the same tensors (Note [Steps in parts] below; tests/python/test_optimizers.py). docs/pytorch.md,
"Optimizers".
"""
from __future__ import annotations

import functools
import types
import weakref
from typing import Callable, Iterable, List, Optional, Union

import torch

__all__ = ["clip_grad_norm_", "get_total_norm", "clip_grads_with_norm_", "splits_steps"]

# A part holds at most this fraction of the budget: the rest is room for what the operators of the
# step create (the `_foreach_sqrt` of Adam's second moment, a weight-decayed gradient) and for the
# tensors the planner keeps or prefetches around them.
PART_OF_BUDGET = 0.5

# Note [Steps in parts]: torch.optim optimizers whose update of a parameter reads only that
# parameter, its gradient and its own state (read in torch 2.11: the _multi_tensor_* and _fused_*
# functions of adam.py, sgd.py, adagrad.py, adamax.py, nadam.py, radam.py, rmsprop.py, adadelta.py,
# rprop.py, asgd.py). Group-level values (lr, betas, a scheduler's changes) are the same for every
# part. Not here, so never split: LBFGS (one line search over all parameters), SparseAdam (no
# foreach), Adafactor and Muon (not checked), and any subclass or third-party optimizer, whose step
# may couple parameters.
_SPLITTABLE = tuple(getattr(torch.optim, n) for n in (
    "Adam", "AdamW", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta", "Rprop",
    "ASGD") if hasattr(torch.optim, n))

# Before its first step a parameter has no state yet: count this many tensors of its size (AdamW
# with amsgrad has three), and one more for what the step creates meanwhile.
_NEW_STATE_TENSORS = 3
_TEMPORARY_TENSORS = 1


def splits_steps(optimizer) -> bool:
    """Whether `Session.watch(optimizer=...)` can run this optimizer's steps in parts."""
    return type(_unwrap(optimizer)) in _SPLITTABLE


def _unwrap(optimizer):
    # accelerate's AcceleratedOptimizer (the Hugging Face Trainer's) subclasses Optimizer and
    # forwards step() and param_groups to the torch optimizer it holds.
    seen = 0
    while type(optimizer) not in _SPLITTABLE and seen < 8:
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            break
        optimizer, seen = inner, seen + 1
    return optimizer


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()  # works on an offloaded tensor too (no data access)


def _multi_tensor(group: dict) -> bool:
    """Whether this group's step runs foreach or fused operators (as the optimizer decides)."""
    if group.get("fused") or group.get("foreach"):
        return True
    if "foreach" not in group or group["foreach"] is not None or group.get("differentiable"):
        return False
    try:  # foreach=None: torch's default, foreach when every parameter is on a foreach device
        from torch.optim.optimizer import _default_to_fused_or_foreach
        params = [p for p in group["params"] if p.grad is not None]
        return bool(_default_to_fused_or_foreach(params, False, use_fused=False)[1])
    except Exception:
        return True  # cannot tell: splitting a per-parameter step changes nothing


def _param_bytes(optimizer, p: torch.Tensor) -> int:
    if p.grad is None:
        return 0  # the optimizer skips it
    size = _nbytes(p)
    state = optimizer.state.get(p)
    if state:
        states = sum(_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    else:
        states = _NEW_STATE_TENSORS * size
    return size + _nbytes(p.grad) + states + _TEMPORARY_TENSORS * size


def _split(items: List, sizes: List[int], limit: int) -> List[List]:
    """Consecutive parts of `items` of at most `limit` bytes (an item larger is a part alone)."""
    parts, part, used = [], [], 0
    for item, size in zip(items, sizes):
        if part and used + size > limit:
            parts.append(part)
            part, used = [], 0
        part.append(item)
        used += size
    if part:
        parts.append(part)
    return parts


def _sub_groups(optimizer, limit: Optional[int], views=None):
    """[(group, [sub-group, ...])] or None when every group runs as it is. views: [(group, the
    group's dict or a copy listing only some of its parameters)], by default every group whole.
    limit None: no group is split (each view is one part)."""
    if views is None:
        views = [(group, group) for group in optimizer.param_groups]
    out, changed = [], False
    for group, view in views:
        params = list(view["params"])
        if limit is None or len(params) < 2 or not _multi_tensor(view):
            out.append((group, [view]))
            changed = changed or view is not group
            continue
        sizes = [_param_bytes(optimizer, p) for p in params]
        if sum(sizes) <= limit:
            out.append((group, [view]))
            changed = changed or view is not group
            continue
        subs = []
        for part in _split(params, sizes, limit):
            sub = dict(view)  # the group's values, shared; its own list of parameters
            sub["params"] = part
            subs.append(sub)
        out.append((group, subs))
        changed = True
    return out if changed else None


def _copy_back(group: dict, sub: dict) -> None:
    """Keeps on the group any value a step set on one of its sub-groups."""
    if sub is group:
        return
    for key, value in sub.items():
        if key != "params" and (key not in group or group[key] is not value):
            group[key] = value


def _same_value(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and bool(torch.equal(a, b.to(a.device))))
    try:
        return bool(a == b)
    except Exception:
        return False


# Note [Steps in backward]: with watch(..., step_in_backward=True) each parameter's update runs as
# soon as backward has accumulated its gradient (a post-accumulate-grad hook on the parameter, as
# PyTorch's "optimizer step in backward" recipe does), through the optimizer's own step over a
# sub-group holding that parameter alone (Note [Steps in parts]: the same bytes as the whole step).
# Without it the optimizer's state traffic of an offloaded step happens between backward and the
# next forward, where no compute hides it; in backward it overlaps the backward's kernels, and each
# gradient is dead once read. The optimizer.step() the loop calls then steps only the parameters no
# hook stepped (none, usually: its hooks and an LR scheduler's counter still run once). The update
# is the one optimizer.step() would make only if nothing changes the gradients or the group's values
# between backward and optimizer.step(), and if each backward is followed by one optimizer.step():
# gradient clipping, GradScaler's unscale_, DDP's averaging, a scheduler stepped in between, or
# gradient accumulation over several backward passes would be silently lost. So optimizer.step()
# checks that every gradient a hook used is the same tensor at the same version and every group
# value the same, and a second gradient before optimizer.step() raises from the hook: each raises
# teraio.Error naming the parameter and saying to use step_in_backward=False.


class _Splitter:
    """The state of one optimizer whose step() teraio wraps: the Session that gives the budget, and
    the parameters stepped in backward (Note [Steps in backward])."""

    def __init__(self, inner: Callable, own_attr: bool, opt):
        self.session_ref: Callable = lambda: None
        self.inner = inner  # the step() that was there (bound method or a scheduler's wrapper)
        self.own_attr = own_attr  # the optimizer had its own `step` attribute before
        self.bound = None
        self.parts = 0  # parts of the last split step (0: it ran whole)
        self.split = True  # split steps that do not fit the budget (watch's split_steps)
        self.opt_ref = weakref.ref(opt)
        self.in_backward = False
        self.hooks = {}  # id(parameter) -> its post-accumulate-grad hook's handle
        self.group_of = {}  # id(parameter) -> its group (rebuilt at each step())
        self.stepped = {}  # id(parameter) -> (parameter, gradient, its version) since step()
        self.values = {}  # id(group) -> (group, its values after the first update in backward)
        self.backward_updates = 0  # parameters stepped in backward at the last step()

    def _param_name(self, p) -> str:
        session = self.session_ref()
        name_of = getattr(session, "_param_name", None)
        name = name_of(p) if name_of is not None else None
        return name or f"parameter of shape {tuple(p.shape)}"

    def forget_stepped(self) -> int:
        """Forgets the parameters stepped in backward since the last step() (their updates stay
        made) and the group values seen then; returns how many parameters there were."""
        n = len(self.stepped)
        self.stepped, self.values = {}, {}
        return n

    def _index_groups(self, opt) -> None:
        self.group_of = {id(p): g for g in opt.param_groups for p in g["params"]}

    def sync_hooks(self, opt) -> None:
        """A hook on every parameter of the optimizer while stepping in backward, none otherwise."""
        if not self.in_backward:
            for handle in self.hooks.values():
                handle.remove()
            self.hooks = {}
            self.forget_stepped()
            self.backward_updates = 0
            return
        self._index_groups(opt)
        splitter_ref = weakref.ref(self)

        def hook(p):
            splitter = splitter_ref()
            if splitter is not None:
                splitter.step_one(p)

        for g in opt.param_groups:
            for p in g["params"]:
                if id(p) not in self.hooks and p.requires_grad:
                    self.hooks[id(p)] = p.register_post_accumulate_grad_hook(hook)

    def step_one(self, p) -> None:
        """One parameter's update, from backward (Note [Steps in backward])."""
        opt = self.opt_ref()
        if opt is None or not self.in_backward or self.session_ref() is None or p.grad is None:
            return
        from . import Error
        if id(p) in self.stepped:
            # The loop is not one this mode fits: start over at its next optimizer.step().
            self.forget_stepped()
            raise Error(
                f"teraio: '{self._param_name(p)}' got a second gradient before "
                f"optimizer.step(): with Session.watch(..., step_in_backward=True) each backward "
                f"pass updates the parameters as it goes, so every backward must be followed by "
                f"one optimizer.step() (no gradient accumulation over several backward passes, no "
                f"skipped steps); the parameters already took the earlier gradient. Watch the "
                f"optimizer with step_in_backward=False for such a loop")
        group = self.group_of.get(id(p))
        if group is None or not any(g is group for g in opt.param_groups):
            self._index_groups(opt)
            group = self.group_of.get(id(p))
            if group is None:
                return  # no longer the optimizer's
        sub = dict(group)
        sub["params"] = [p]
        original = opt.param_groups
        opt.param_groups = [sub]
        try:
            _raw_step(opt)
        finally:
            opt.param_groups = original
            _copy_back(group, sub)
        self.stepped[id(p)] = (p, p.grad, p.grad._version)
        if id(group) not in self.values:
            self.values[id(group)] = (group, {k: v for k, v in group.items() if k != "params"})

    def take_stepped(self) -> set:
        """The parameters stepped in backward since the last step(), after checking that the update
        they took is the one this step() would make; raises teraio.Error otherwise."""
        stepped, self.stepped = self.stepped, {}
        values, self.values = self.values, {}
        self.backward_updates = len(stepped)
        from . import Error
        for p, grad, version in stepped.values():
            if p.grad is not grad or grad._version != version:
                raise Error(
                    f"teraio: the gradient of '{self._param_name(p)}' changed between backward and "
                    f"optimizer.step() (gradient clipping, GradScaler.unscale_, zero_grad, a "
                    f"data-parallel all-reduce, ...), but with Session.watch(..., "
                    f"step_in_backward=True) the optimizer already applied it during backward. "
                    f"Watch the optimizer with step_in_backward=False when the loop changes "
                    f"gradients after backward")
        for group, before in values.values():
            for key, value in before.items():
                if key not in group or not _same_value(group[key], value):
                    raise Error(
                        f"teraio: the optimizer's parameter group value '{key}' changed between "
                        f"backward and optimizer.step() (an LR scheduler stepped before "
                        f"optimizer.step()?), but with Session.watch(..., step_in_backward=True) "
                        f"the parameters were already updated during backward with the value "
                        f"before. Change group values after optimizer.step(), or watch the "
                        f"optimizer with step_in_backward=False")
        return set(stepped)


def _raw_step(opt) -> None:
    """The optimizer class's step() without torch's step hooks and profiler wrapper (they run once,
    in the step() the loop calls)."""
    step = type(opt).step
    if getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):
        step = step.__wrapped__
    step(opt)


def _install(optimizer, session, split: bool = True, in_backward: bool = False) -> None:
    """Makes optimizer.step() run in parts while `session` is open (Note [Steps in parts]), and
    with in_backward each parameter's update run from backward (Note [Steps in backward])."""
    opt = _unwrap(optimizer)
    if type(opt) not in _SPLITTABLE:
        if in_backward:
            from . import Error
            raise Error(f"Session.watch: step_in_backward=True steps one parameter at a time, which "
                        f"teraio does only for torch.optim's per-parameter optimizers (Adam, AdamW, "
                        f"SGD, Adagrad, Adamax, NAdam, RAdam, RMSprop, Adadelta, Rprop, ASGD; "
                        f"docs/pytorch.md, \"Optimizers\"), not {type(opt).__name__}")
        return
    splitter = opt.__dict__.get("_teraio_splitter")
    if splitter is None:
        splitter = _Splitter(opt.step, "step" in opt.__dict__, opt)

        # The wrapper reads splitter.inner at each call and holds nothing else of the optimizer:
        # _uninstall drops splitter.inner, so that no reference cycle keeps the optimizer (and its
        # states on the device) alive after the Session closes until a garbage collection.
        @functools.wraps(splitter.inner, updated=())
        def step(self, *args, **kwargs):
            inner = splitter.inner
            session = splitter.session_ref()
            views = None
            if session is not None and splitter.in_backward:
                splitter.sync_hooks(self)  # parameters added since (add_param_group)
                done = splitter.take_stepped()
                if done:
                    views = []
                    for group in self.param_groups:
                        rest = [p for p in group["params"] if id(p) not in done]
                        if len(rest) == len(group["params"]):
                            views.append((group, group))
                        else:
                            view = dict(group)
                            view["params"] = rest
                            views.append((group, view))
            limit = session._part_bytes() if session is not None and splitter.split else None
            groups = _sub_groups(self, limit, views) if session is not None else None
            if groups is None:
                splitter.parts = 0
                return inner(*args, **kwargs)
            original = self.param_groups
            self.param_groups = [sub for _, subs in groups for sub in subs]
            splitter.parts = (len(self.param_groups)
                              if any(len(subs) > 1 for _, subs in groups) else 0)
            try:
                return inner(*args, **kwargs)
            finally:
                self.param_groups = original
                for group, subs in groups:
                    for sub in subs:
                        _copy_back(group, sub)

        # An LR scheduler made before wrapped step() to see that it is called (and warns when
        # step() is replaced): the mark stays visible. A method, not a function: a scheduler made
        # later wraps `optimizer.step.__func__`.
        if getattr(splitter.inner, "_wrapped_by_lr_sched", False):
            step._wrapped_by_lr_sched = True
        splitter.bound = types.MethodType(step, opt)
        opt.step = splitter.bound
        opt._teraio_splitter = splitter
    splitter.session_ref = weakref.ref(session)
    splitter.split = split
    splitter.in_backward = in_backward
    splitter.sync_hooks(opt)


def _abort_step(optimizer) -> int:
    """A step failed (Session.step()'s body raised): the parameters this optimizer updated in its
    backward are forgotten, their updates staying made; returns how many there were."""
    splitter = _unwrap(optimizer).__dict__.get("_teraio_splitter")
    return 0 if splitter is None else splitter.forget_stepped()


def _uninstall(optimizer, session) -> None:
    """Puts step() back when nothing wrapped it since; otherwise the wrapper stays, passing
    through (its Session is gone), until the next Session watches the optimizer. Removes the hooks
    of step_in_backward."""
    opt = _unwrap(optimizer)
    splitter = opt.__dict__.get("_teraio_splitter")
    if splitter is None or splitter.session_ref() is not session:
        return
    splitter.session_ref = lambda: None
    splitter.in_backward = False
    splitter.sync_hooks(opt)
    if opt.__dict__.get("step") is splitter.bound:
        if splitter.own_attr:
            opt.step = splitter.inner
        else:
            del opt.step
        del opt._teraio_splitter
        splitter.inner = splitter.bound = None  # the wrapper's hold on the optimizer


# --- the gradient norm ------------------------------------------------------------------------
# torch.nn.utils.clip_grad_norm_ (torch 2.11, torch/nn/utils/clip_grad.py) groups the tensors by
# device and dtype, takes `torch._foreach_norm` of each group (one operator over every gradient),
# then the norm of the stacked per-tensor norms. The same steps follow, with `_foreach_norm` and
# `_foreach_mul_` taken over consecutive parts: the per-tensor norms come out in the same order, so
# the total is bitwise torch's.

_Tensors = Union[torch.Tensor, Iterable[torch.Tensor]]


def _limit(part_bytes: Optional[int]) -> Optional[int]:
    if part_bytes is not None:
        if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes <= 0:
            from . import Error
            raise Error(f"part_bytes must be a positive int, got {part_bytes!r}")
        return part_bytes
    from . import _active_session
    session = _active_session()
    return session._part_bytes() if session is not None else None


def _parts(tensors: List[torch.Tensor], limit: Optional[int]) -> List[List[torch.Tensor]]:
    if limit is None:
        return [tensors]
    return _split(tensors, [_nbytes(t) for t in tensors], limit)


def _uses_foreach(foreach: Optional[bool], tensors, device) -> bool:
    from torch.utils._foreach_utils import _device_has_foreach_support, _has_foreach_support
    if (foreach is None and _has_foreach_support(tensors, device)) or (
            foreach and _device_has_foreach_support(device)):
        return True
    if foreach:
        raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on "
                           f"{device.type} tensors")
    return False


@torch.no_grad()
def get_total_norm(tensors: _Tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: Optional[bool] = None, *,
                   part_bytes: Optional[int] = None) -> torch.Tensor:
    """torch.nn.utils.get_total_norm, with `torch._foreach_norm` over parts of at most `part_bytes`
    (default: half the open Session's budget; no Session: one part). Bitwise the same result."""
    from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return torch.tensor(0.0)
    limit = _limit(part_bytes)
    first_device = tensors[0].device
    norms: List[torch.Tensor] = []
    for (device, _), ([group], _) in _group_tensors_by_device_and_dtype([tensors]).items():
        if _uses_foreach(foreach, group, device):
            for part in _parts(group, limit):
                norms.extend(torch._foreach_norm(part, norm_type))
        else:
            norms.extend(torch.linalg.vector_norm(t, norm_type) for t in group)
    total = torch.linalg.vector_norm(torch.stack([n.to(first_device) for n in norms]), norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           f"`parameters` is non-finite, so it cannot be clipped. To disable this "
                           f"error and scale the gradients by the non-finite norm anyway, set "
                           f"`error_if_nonfinite=False`")
    return total


@torch.no_grad()
def clip_grads_with_norm_(parameters: _Tensors, max_norm: float, total_norm: torch.Tensor,
                          foreach: Optional[bool] = None, *,
                          part_bytes: Optional[int] = None) -> None:
    """torch.nn.utils.clip_grads_with_norm_, with `torch._foreach_mul_` over parts (as
    get_total_norm). Bitwise the same gradients."""
    from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm = float(max_norm)
    if not grads:
        return
    limit = _limit(part_bytes)
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for (device, _), ([group], _) in _group_tensors_by_device_and_dtype([grads]).items():
        coef_here = coef.to(device)
        if _uses_foreach(foreach, group, device):
            for part in _parts(group, limit):
                torch._foreach_mul_(part, coef_here)
        else:
            for g in group:
                g.mul_(coef_here)


def clip_grad_norm_(parameters: _Tensors, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: Optional[bool] = None, *,
                    part_bytes: Optional[int] = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ in parts that fit the open Session's budget (bitwise the same
    norm and gradients): get_total_norm, then clip_grads_with_norm_. Returns the total norm."""
    parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach, part_bytes=part_bytes)
    clip_grads_with_norm_(parameters, max_norm, total, foreach, part_bytes=part_bytes)
    return total


# The torch.nn.utils functions TeraioCallback replaces while its Session is open (transformers'
# Trainer and accelerate look them up there at each call).
_CLIP_NAMES = {"clip_grad_norm_": clip_grad_norm_, "get_total_norm": get_total_norm,
               "clip_grads_with_norm_": clip_grads_with_norm_}


def _patch_torch_clip() -> dict:
    """Puts these functions in torch.nn.utils; returns what to give _unpatch_torch_clip."""
    import torch.nn.utils as nn_utils
    replaced = {}
    for name, ours in _CLIP_NAMES.items():
        theirs = getattr(nn_utils, name, None)
        if theirs is not None and theirs is not ours:
            replaced[name] = theirs
            setattr(nn_utils, name, ours)
    return replaced


def _unpatch_torch_clip(replaced: dict) -> None:
    import torch.nn.utils as nn_utils
    for name, theirs in replaced.items():
        if getattr(nn_utils, name, None) is _CLIP_NAMES[name]:
            setattr(nn_utils, name, theirs)
