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


def _sub_groups(optimizer, limit: int):
    """[(group, [sub-group, ...])] or None when every group fits as it is."""
    out, split = [], False
    for group in optimizer.param_groups:
        params = list(group["params"])
        sizes = [_param_bytes(optimizer, p) for p in params]
        if sum(sizes) <= limit or len(params) < 2 or not _multi_tensor(group):
            out.append((group, [group]))
            continue
        subs = []
        for part in _split(params, sizes, limit):
            sub = dict(group)  # the group's values, shared; its own list of parameters
            sub["params"] = part
            subs.append(sub)
        out.append((group, subs))
        split = split or len(subs) > 1
    return out if split else None


class _Splitter:
    """The state of one optimizer whose step() is split: the Session that gives the budget."""

    def __init__(self, inner: Callable, own_attr: bool):
        self.session_ref: Callable = lambda: None
        self.inner = inner  # the step() that was there (bound method or a scheduler's wrapper)
        self.own_attr = own_attr  # the optimizer had its own `step` attribute before
        self.bound = None
        self.parts = 0  # parts of the last split step (0: it ran whole)


def _install(optimizer, session) -> None:
    """Makes optimizer.step() run in parts while `session` is open (Note [Steps in parts])."""
    opt = _unwrap(optimizer)
    if type(opt) not in _SPLITTABLE:
        return
    splitter = opt.__dict__.get("_teraio_splitter")
    if splitter is None:
        splitter = _Splitter(opt.step, "step" in opt.__dict__)

        # The wrapper reads splitter.inner at each call and holds nothing else of the optimizer:
        # _uninstall drops splitter.inner, so that no reference cycle keeps the optimizer (and its
        # states on the device) alive after the Session closes until a garbage collection.
        @functools.wraps(splitter.inner, updated=())
        def step(self, *args, **kwargs):
            inner = splitter.inner
            session = splitter.session_ref()
            limit = session._part_bytes() if session is not None else None
            groups = _sub_groups(self, limit) if limit else None
            if groups is None:
                splitter.parts = 0
                return inner(*args, **kwargs)
            original = self.param_groups
            self.param_groups = [sub for _, subs in groups for sub in subs]
            splitter.parts = len(self.param_groups)
            try:
                return inner(*args, **kwargs)
            finally:
                self.param_groups = original
                for group, subs in groups:
                    for sub in subs:
                        if sub is group:
                            continue
                        for key, value in sub.items():  # what the step set on the group
                            if key != "params" and (key not in group or group[key] is not value):
                                group[key] = value

        # An LR scheduler made before wrapped step() to see that it is called (and warns when
        # step() is replaced): the mark stays visible. A method, not a function: a scheduler made
        # later wraps `optimizer.step.__func__`.
        if getattr(splitter.inner, "_wrapped_by_lr_sched", False):
            step._wrapped_by_lr_sched = True
        splitter.bound = types.MethodType(step, opt)
        opt.step = splitter.bound
        opt._teraio_splitter = splitter
    splitter.session_ref = weakref.ref(session)


def _uninstall(optimizer, session) -> None:
    """Puts step() back when nothing wrapped it since; otherwise the wrapper stays, passing
    through (its Session is gone), until the next Session watches the optimizer."""
    opt = _unwrap(optimizer)
    splitter = opt.__dict__.get("_teraio_splitter")
    if splitter is None or splitter.session_ref() is not session:
        return
    splitter.session_ref = lambda: None
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
