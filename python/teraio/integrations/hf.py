"""teraio under the Hugging Face Trainer: TeraioCallback opens a Session when training begins, makes
every optimizer step of the Trainer one Session step, fetches the offloaded tensors back before a
checkpoint is written, and closes the Session when training ends (docs/pytorch.md, "Hugging Face
Trainer"). Importing this module imports transformers; `import teraio` does not.

Why these hooks (read in transformers 5.24: Trainer._run_epoch, _maybe_log_save_evaluate):
- on_step_begin comes before the first micro-batch of an optimizer step, on_step_end after the
  optimizer.step(), lr_scheduler.step() and model.zero_grad() that follow its last one. Between them
  run all the gradient-accumulation micro-steps (forward and backward in training_step), gradient
  clipping, the optimizer and zero_grad, and nothing else: the same operators every optimizer step,
  which is what the planner needs. Wrapping training_step instead would cut one optimizer step into
  Session steps of two shapes (with and without the optimizer) and leave clipping and zero_grad out;
  on_pre_optimizer_step/on_optimizer_step see the optimizer alone.
- Logging, evaluation and checkpoints run between steps (_maybe_log_save_evaluate, right after
  on_step_end). Operators there bring back the tensors they read (the Session does so outside
  steps), but a checkpoint reads memory directly (safetensors, torch.save of the optimizer), so
  on_step_end and on_epoch_end call session.fetch_all() when the Trainer is about to save: after
  DefaultFlowCallback, which runs first, has set control.should_save.
- on_train_begin runs after the Trainer has built the optimizer and loaded the checkpoint it resumes
  from; the Session opens there. Loading the best model at the end (load_best_model_at_end) happens
  while it is open: load_state_dict copies through operators, which bring each parameter back first.
  on_train_end closes it: every tensor comes back and the tier files are removed.
- The Trainer's default optimizer is fused AdamW (transformers 5.24 with torch >= 2.8), and it takes
  the gradient norm every step through accelerate's clip_grad_norm_, which calls
  torch.nn.utils.get_total_norm and clip_grads_with_norm_ (or clip_grad_norm_): one operator over
  every gradient. While the Session is open the optimizer's steps run in parts that fit the budget
  (Session.watch) and those three torch.nn.utils functions are teraio's, which take the norm in
  parts (teraio.optim): bitwise the same losses, norms and parameters.
"""
from __future__ import annotations

import inspect
from typing import Iterable, Optional, Union

from transformers import TrainerCallback

import teraio
from teraio import optim as _optim

__all__ = ["TeraioCallback"]

_SESSION_OPTIONS = [n for n in inspect.signature(teraio.Session.__init__).parameters
                    if n not in ("self", "budget", "tiers")]


class TeraioCallback(TrainerCallback):
    """Trains under a teraio.Session inside `transformers.Trainer`:

        cb = TeraioCallback(budget="24GiB", tiers=[teraio.HostTier("64GiB")])
        Trainer(model, args, train_dataset=ds, callbacks=[cb]).train()
        print(cb.stats())

    budget, tiers and the keyword arguments (profiling_iterations, min_tensor_bytes, planning,
    trace_path, plan_path, plan_search, stream_ordered_offloads, verify, fault_injection) are the
    Session's own, with its defaults; there is no default for the tiers (where offloaded bytes go,
    and how much of them, is the user's choice). watch: name parameters and optimizer states in the
    trace (Session.watch). Whatever `watch` says, the optimizer's steps run in parts that fit the
    budget and the gradient norm is taken in parts (teraio.clip_grad_norm_), bitwise as without.
    step_in_backward: each parameter's update runs during backward (Session.watch(...,
    step_in_backward=True), or "auto": when the Session predicts it faster); needs
    TrainingArguments with max_grad_norm=0 (no clipping) and gradient_accumulation_steps=1, checked
    when training begins.
    A new Session is opened by every train() and closed when it ends; errors of the Session
    (teraio.IoError, a budget that cannot be met) propagate out of train() after the Session has
    been closed. When train() raises from the model's own code the Trainer calls no callback: use
    `with TeraioCallback(...) as cb:` or call cb.close() (the next train() with this callback also
    closes it first).
    """

    def __init__(self, budget: teraio.Size,
                 tiers: Iterable[Union[teraio.HostTier, teraio.FileTier]], *, watch: bool = True,
                 step_in_backward: Union[bool, str] = False, **session_options):
        teraio.parse_size(budget, "TeraioCallback budget")  # fail here, not at train()
        given, kinds = tiers, (teraio.HostTier, teraio.FileTier)
        try:
            tiers = None if isinstance(tiers, (str,) + kinds) else list(tiers)
        except TypeError:
            tiers = None
        if tiers is None or not all(isinstance(t, kinds) for t in tiers):
            raise teraio.Error(f"TeraioCallback: tiers must be a list of teraio.HostTier and "
                               f"teraio.FileTier such as [teraio.HostTier('64GiB')], got {given!r}")
        if not tiers:
            raise teraio.Error("TeraioCallback: at least one tier (teraio.HostTier or "
                               "teraio.FileTier) is needed")
        unknown = sorted(set(session_options) - set(_SESSION_OPTIONS))
        if unknown:
            raise teraio.Error(f"TeraioCallback: unknown Session argument(s) {', '.join(unknown)}; "
                               f"teraio.Session takes budget, tiers, {', '.join(_SESSION_OPTIONS)}")
        self._budget = budget
        self._tiers = tiers
        if not isinstance(step_in_backward, bool) and step_in_backward != "auto":
            raise teraio.Error(f"TeraioCallback: step_in_backward must be True, False or 'auto', "
                               f"got {step_in_backward!r}")
        if step_in_backward == "auto" and not watch:
            raise teraio.Error("TeraioCallback: step_in_backward='auto' needs watch=True (the "
                               "Session predicts from the optimizer states watch names)")
        self._watch = watch
        self._in_backward = step_in_backward
        self._options = session_options
        self._session: Optional[teraio.Session] = None
        self._step = None  # the open Session.step() context of the running optimizer step
        self._stats: Optional[dict] = None
        self._clip_patch: Optional[dict] = None  # the torch.nn.utils functions replaced

    @property
    def session(self) -> Optional[teraio.Session]:
        """The Session of the running train() (None before and after)."""
        return self._session

    def stats(self) -> dict:
        """Session.stats() of the running train(), or of the last one (taken before it closed)."""
        if self._session is not None:
            return self._session.stats()
        if self._stats is None:
            raise teraio.Error("TeraioCallback.stats(): no train() has run with this callback yet")
        return self._stats

    # --- Trainer events -------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None):
            raise teraio.Error("TeraioCallback: DeepSpeed places and offloads the model's memory "
                               "itself and cannot run under teraio; remove `deepspeed` from the "
                               "TrainingArguments or the callback")
        if self._in_backward:
            wrong = []
            if getattr(args, "max_grad_norm", 0) and args.max_grad_norm > 0:
                wrong.append(f"max_grad_norm={args.max_grad_norm} (clipping)")
            if getattr(args, "gradient_accumulation_steps", 1) != 1:
                wrong.append(f"gradient_accumulation_steps={args.gradient_accumulation_steps}")
            if wrong:
                raise teraio.Error(
                    f"TeraioCallback(step_in_backward={self._in_backward!r}): the optimizer updates "
                    f"each parameter during backward, which the Trainer's {' and '.join(wrong)} "
                    f"would change; set "
                    f"max_grad_norm=0 and gradient_accumulation_steps=1 in the TrainingArguments, "
                    f"or use step_in_backward=False")
        self.close()  # a Session a train() that raised left open
        self._session = teraio.Session(self._budget, self._tiers, **self._options)
        if self._watch:
            self._session.watch(model, optimizer, step_in_backward=self._in_backward)
        elif optimizer is not None:
            self._session._split_steps(optimizer, True, self._in_backward is True)
        self._clip_patch = _optim._patch_torch_clip()

    def on_step_begin(self, args, state, control, **kwargs):
        if self._session is None:
            raise teraio.Error("TeraioCallback: on_step_begin without a Session (on_train_begin "
                               "did not run; add the callback before trainer.train())")
        if self._step is not None:  # defensive: a step the Trainer left unfinished
            self._end_step()
        step = self._session.step()
        step.__enter__()
        self._step = step

    def on_step_end(self, args, state, control, **kwargs):
        self._end_step()
        self._before_save(args, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        # Training stopped inside gradient accumulation (control.should_epoch_stop or
        # should_training_stop set by a callback): the optimizer step stays unfinished; end it here.
        self._end_step()
        self._before_save(args, control)

    def on_train_end(self, args, state, control, **kwargs):
        self._end_step()
        self.close()

    # --- helpers --------------------------------------------------------------------------------

    def close(self) -> None:
        """Ends a step left open, closes the Session (every tensor comes back, the tier files are
        removed) and keeps its last stats. Raises teraio.IoError when a tensor could not be brought
        back (Session.close)."""
        step, self._step = self._step, None
        session, self._session = self._session, None
        patch, self._clip_patch = self._clip_patch, None
        if patch:
            _optim._unpatch_torch_clip(patch)
        if session is None:
            return
        if step is not None:
            try:
                step.__exit__(None, None, None)
            except teraio.Error:
                pass  # the step was cut short by another error, the one that propagates
        try:
            self._stats = session.stats()
        finally:
            session.close()

    def __enter__(self) -> "TeraioCallback":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._close_after_error()  # the exception in flight is the one to see

    def _end_step(self) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        try:
            step.__exit__(None, None, None)
        except teraio.IoError:
            self._close_after_error()
            raise
        except teraio.Error as e:
            self._close_after_error()
            hint = _trainer_hint(str(e))
            if hint:
                raise teraio.Error(f"{e}. {hint}") from e
            raise
        except BaseException:
            self._close_after_error()
            raise

    def _before_save(self, args, control) -> None:
        # A checkpoint reads memory directly: bring everything back before the Trainer writes one.
        # With save_strategy="best" the save is decided after the evaluation, so evaluating counts.
        saving = control.should_save or (control.should_evaluate and
                                         getattr(args, "save_strategy", None) == "best")
        if saving and self._session is not None:
            try:
                self._session.fetch_all()
            except BaseException:
                self._close_after_error()
                raise

    def _close_after_error(self) -> None:
        # train() is about to stop with the error being raised: close the Session so that the model
        # is whole in memory again. A failure to close is secondary to that error and not raised.
        try:
            self.close()
        except teraio.Error:
            pass


def _trainer_hint(message: str) -> str:
    """What to do under the Trainer when the Session could not run the optimizer in parts (its
    message says so; docs/pytorch.md, "Hugging Face Trainer")."""
    if "teraio does not run" in message:
        return ("Under the Trainer: pass Trainer(..., optimizer_cls_and_kwargs=(torch.optim.AdamW, "
                "{'lr': args.learning_rate, 'foreach': False}))")
    return ""
