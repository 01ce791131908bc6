"""Where an unmodified training loop's mini-batch boundaries are: watching optimizer steps, outermost module
calls and backward passes through torch's own hooks, and calling `mark(source)` at each boundary.

A boundary is a point between iterations where suspending is exact and cheap: no autograd graph of the
iteration is waiting for its backward (its activations would stay on the device, and the parameters it saved
must not be re-pointed under it), no gradient is waiting to be applied, and no optimizer step is running.

- **Optimizer steps** (`source` "optimizer hook"): after an optimizer step, outside any other step (LBFGS calls
  its closure inside `step`; a wrapper optimizer steps its inner one), once no graph built since the previous
  step is still waiting for its backward. With one optimizer that is every step (gradient accumulation: every
  real step, never between micro-batches). With several (a GAN's generator and discriminator, a critic stepped
  n times per generator step) the order of steps is learned until the optimizer that stepped first after the
  last new one steps again: that is one round, and a boundary is marked once a round's worth of steps has
  happened since the previous boundary, so one per iteration of the loop, not one per model. An optimizer
  that stops stepping ends its round after twice its usual count of steps by the others. Optimizers stepped
  inside a backward (from gradient hooks, one per parameter) mark no boundary there: the backward is still
  running, so the boundary is the loop's next outermost module call.
- **Outermost module calls** (`source` "module hook"), in loops that never call an optimizer's `step` (updates
  written by hand: `p.data.add_(-lr * p.grad)`): at the start of a call of a module that no other module call
  encloses, once a backward has finished since the previous boundary, the gradients it left were used since
  (set to None, replaced, or changed in place, as `zero_grad()` and `p.grad.zero_()` do) or the parameters were
  updated between module calls since (the gradients cleared only after the next forward, as PyTorch's tutorial
  does; a change inside a call, an Embedding's max_norm, is not an update), and no graph built since the
  previous boundary still waits for its backward. Several models per iteration (a hand-written GAN) get at most
  one boundary per model updated: where the second model's call comes while the first model's graph still
  waits, one per iteration.
  A backward that leaves no gradient on a model that trains (`torch.autograd.grad`, a gradient penalty's) is
  not the iteration's.
  Once any optimizer steps, only its steps are boundaries (one per iteration, not two).

Loops that get no boundary (the job is then time-sliced without its cooperation): no optimizer `step` and no
`nn.Module` call (pure tensor code); a functional loop whose parameters live outside the model and are replaced,
not updated in place (`torch.func.grad` over `functional_call`, `params = {k: p - lr * g ...}`); gradients
cleared only through `p.grad.data.zero_()` and parameters updated only through `p.data` (`.data` hides the
change from the version counter gmux reads); a graph with grad enabled that is kept alive and never
backpropagated; a single call that never returns (one endless mini-batch).

Cost: outermost module calls are found with global module hooks, which make every module call take torch's
slow path; they stay only for the first few boundaries (or calls), after which only the outermost modules
found keep a hook of their own. A call of one with nothing pending costs a few attribute reads; a call with
grad enabled adds one token and one autograd pre-hook on its output's graph.
"""
from __future__ import annotations

import warnings
import weakref
from collections import Counter
from typing import Callable, Optional

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

OPTIMIZER, MODULE = "optimizer hook", "module hook"
SCOUT_BOUNDARIES = 3        # global module hooks stay until this many boundaries...
SCOUT_CALLS = 1000          # ...or this many outermost calls without them
LEARN_STEPS = 256           # steps a learnt round's starter may stay away before another starts it
MAX_WATCHED = 64            # graphs watched at once (a loop that never backpropagates must not grow a list)
_TENSORS_PER_OUTPUT = 8     # tensors of one call's output that may carry its graph


class _Graph:
    """Lives exactly as long as the autograd graph of one outermost call (its pre-hooks hold it)."""
    __slots__ = ("ran", "__weakref__")

    def __init__(self):
        self.ran = False


class LoopWatch:
    def __init__(self, mark: Callable[[str], None], on_optimizer: Callable[[torch.optim.Optimizer], None],
                 on_root: Callable[[torch.nn.Module], None]):
        self.mark, self.on_optimizer, self.on_root = mark, on_optimizer, on_root
        self.boundaries = 0
        self.roots: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()
        self._scripted = False          # a root is a TorchScript module: the global hooks stay
        self.roots_added = 0            # models ever called as the loop's outermost (a dead one's id comes again)
        self._depth = 0                 # module calls in progress (all while scouting, then outermost ones)
        self._in_step = 0               # optimizer steps in progress
        self._graphs: list = []         # weakrefs to _Graph of calls since the previous boundary / step
        self._backward_done = False     # a backward finished since the previous boundary
        self._callback_queued = False
        self._grads: list = []          # (param, id(grad), grad._version) as the last backward left them
        self._sentinels: dict = {}      # root id -> (the root, weakly; a parameter whose gradient tells whether
                                        # grads were used)
        self._optimizers: set = set()   # ids of the optimizers that stepped ...
        self._alive: "weakref.WeakValueDictionary[int, torch.optim.Optimizer]" = weakref.WeakValueDictionary()
        self._round: Optional[Counter] = None   # steps per optimizer in one iteration; None while learning
        self._starter: Optional[int] = None
        self._since: Counter = Counter()      # steps since the previous boundary, per optimizer
        self._learning: Counter = Counter()   # steps since the starter's first, while the round is learned
        self._outer_calls = 0
        self._after_backward = False    # an optimizer stepped inside a backward since the previous boundary
        self._versions_at_start: list = []   # (parameter, version) when the current backward began
        self._unapplied: list = []      # the same, for a backward that left no gradient, until they move
        self._versions_at_end: list = []     # the same, when the last backward that left gradients ended
        self._versions_at_enter: list = []   # their versions when the outermost call in progress began
        self._handles = [register_optimizer_step_pre_hook(_eager(self._step_pre)),
                         register_optimizer_step_post_hook(_eager(self._step_post))]
        # (always_call: a call that raises still leaves, or the depth would stay up and no boundary come again)
        self._scouts = [register_module_forward_pre_hook(self._scout_pre),
                        register_module_forward_hook(self._scout_post, always_call=True)]
        # While they are there, each call of a torch.compile()d model warns that global hooks fire once more for
        # its wrapper: these are gmux's, and the wrapper's call is the outermost one they count.
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                                category=UserWarning)

    def close(self) -> None:
        for h in self._handles + self._scouts:
            h.remove()
        self._handles, self._scouts = [], []

    # -- optimizer steps --------------------------------------------------------------------------------
    def _step_pre(self, optimizer, args, kwargs) -> None:
        self._in_step += 1
        if self._alive.get(id(optimizer)) is not optimizer:
            self._forget_dropped()
            self._alive[id(optimizer)] = optimizer
            self.on_optimizer(optimizer)

    def _forget_dropped(self) -> None:
        """... while alive: one the script dropped (made again each epoch) leaves the round, and its id, which a
        new one may get, is free again."""
        for key in self._optimizers - set(self._alive.keys()):
            self._optimizers.discard(key)
            self._since.pop(key, None)
            self._learning.pop(key, None)
            if self._round is not None:
                self._round.pop(key, None)
            if self._starter == key:
                self._starter = None
        if not self._round:
            self._round = None

    def _step_post(self, optimizer, args, kwargs) -> None:
        self._in_step -= 1
        if self._in_step:
            return                       # an optimizer stepped by another one's step
        complete = self._count_step(id(optimizer))
        if _in_backward():
            # Stepped inside a backward (optimizers run from gradient hooks, one per parameter): the rest of the
            # backward still runs, so the boundary is the loop's next outermost module call.
            self._after_backward = True
            return
        waiting = self._graph_waiting()
        self._graphs.clear()             # a graph older than this step is not this iteration's
        if complete and not waiting:
            self._boundary(OPTIMIZER)

    def _count_step(self, key: int) -> bool:
        """Counts a step towards the current round; True when the round is complete."""
        new = key not in self._optimizers
        self._optimizers.add(key)
        self._since[key] += 1
        if len(self._optimizers) == 1:
            return True
        if new or (self._round is None and sum(self._learning.values()) > LEARN_STEPS):
            # Learn the round again, from this step on. A newcomer's first step ends a round when each optimizer
            # known before has stepped since the previous boundary: a GAN's first iteration, whose critic steps
            # came while the generator's graph waited, has its boundary there. A starter that never steps again
            # (an optimizer of a warm-up phase) gives way to the step that finds it gone that long.
            self._round, self._starter, self._learning = None, key, Counter({key: 1})
            return new and all(self._since[k] for k in self._optimizers)
        if self._round is None:
            self._learning[key] += 1
            if key != self._starter or self._learning[key] < 2:
                return False
            # The steps from the starter's first to its second are one round, just ended: its boundary is now,
            # or the iteration that taught it would go uncounted (STEP one short of the loop's iterations).
            self._learning[key] -= 1
            self._round = self._learning
            return True
        if all(self._since[k] >= n for k, n in self._round.items()):
            return True
        if any(n > 2 * self._round.get(k, 0) + 2 for k, n in self._since.items()):
            self._round = Counter({key: 1})   # a member of the round stopped stepping
            return True
        return False

    # -- outermost module calls ---------------------------------------------------------------------------
    def _scout_pre(self, module, args) -> None:
        if _in_backward():
            return              # a forward recomputed inside a backward (activation checkpointing): not the loop's
        self._depth += 1
        if self._depth == 1:
            if id(module) not in self.roots:
                self.roots[id(module)] = module
                if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
                    self.roots_added += 1       # (one that holds nothing, a loss made each call, is not news)
                self.on_root(module)
            self._outer_calls += 1
            self._enter()

    def _scout_post(self, module, args, output) -> None:
        if _in_backward():
            return
        self._depth -= 1
        if self._depth == 0:
            self._leave(output)
            if (self.boundaries >= SCOUT_BOUNDARIES or self._outer_calls >= SCOUT_CALLS) and not self._scripted:
                self._end_scouting()

    def _end_scouting(self) -> None:
        """Nothing is in progress: swaps the global module hooks for hooks on the outermost modules only. A
        TorchScript module (torch.jit.script or trace) takes no hooks of its own: the global ones stay."""
        if any(issubclass(type(m), torch.jit.ScriptModule) for m in self.roots.values()):
            self._scripted = True
            return
        for h in self._scouts:
            h.remove()
        self._scouts = []
        for module in list(self.roots.values()):
            self._handles += [module.register_forward_pre_hook(self._root_pre),
                              module.register_forward_hook(self._root_post, always_call=True)]

    def _root_pre(self, module, args) -> None:
        if _in_backward():
            return
        self._depth += 1
        if self._depth == 1:
            self._enter()

    def _root_post(self, module, args, output) -> None:
        if _in_backward():
            return
        self._depth -= 1
        if self._depth == 0:
            self._leave(output)

    def _enter(self) -> None:
        if self._after_backward and not self._in_step and not self._graph_waiting():
            self._after_backward = False
            self._boundary(OPTIMIZER)
            return
        if self._unapplied and any(p._version != v for p, v in self._unapplied):
            self._unapplied, self._backward_done = [], True
        if self._in_step or self._optimizers or not self._backward_done:
            return
        if self._grads_used() and not self._graph_waiting():
            self._boundary(MODULE)
        elif self._versions_at_end:
            self._versions_at_enter = [p._version for p, _ in self._versions_at_end]

    def _leave(self, output) -> None:
        if self._versions_at_enter:
            # A parameter changed in place inside the call (an Embedding with max_norm renormalises its weight in
            # its forward) was not updated: only changes between calls are.
            self._versions_at_end = [(p, p._version if at == v else v)
                                     for (p, v), at in zip(self._versions_at_end, self._versions_at_enter)]
            self._versions_at_enter = []
        if torch.is_grad_enabled():
            self._watch(output)

    # -- graphs and gradients -----------------------------------------------------------------------------
    def _watch(self, output) -> None:
        nodes = {id(n): n for n in _grad_fns(output)}
        if not nodes:
            return
        graph = _Graph()
        for node in nodes.values():
            node.register_prehook(self._ran(graph))
        if len(self._graphs) >= MAX_WATCHED:
            self._graphs = [g for g in self._graphs if g() is not None][-MAX_WATCHED // 2:]
        self._graphs.append(weakref.ref(graph))

    def _ran(self, graph: _Graph):
        def prehook(grad_outputs):
            graph.ran = True
            # Once per backward, and only where updates are written by hand: its end is where the gradients are final.
            if not self._optimizers and not self._callback_queued:
                self._callback_queued = True
                self._versions_at_start = self._versions()
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
        return prehook

    def _versions(self) -> list:
        """(parameter, version) of a trained parameter of each outermost module: an update by hand moves it."""
        out = []
        for module in list(self.roots.values()):
            p = next((q for q in module.parameters() if q.requires_grad and not q.is_inference()), None)
            if p is not None:
                out.append((p, p._version))
        return out

    def _backward_end(self) -> None:
        self._callback_queued = False
        grads, trains = [], False
        for key in self._sentinels.keys() - self.roots.keys():
            del self._sentinels[key]            # (a model the script has dropped: its parameter must not live on)
        for key, module in list(self.roots.items()):
            owner, p = self._sentinels.get(key, (None, None))
            if owner is None or owner() is not module or p.grad is None:   # (another model may get a dead one's id)
                p = next((q for q in module.parameters() if q.grad is not None), None)
                if p is None:
                    trains = trains or any(q.requires_grad for q in module.parameters())
                    continue
                self._sentinels[key] = (weakref.ref(module), p)
            grads.append((p, id(p.grad), p.grad._version))
        if trains and not grads:
            # No gradient left on a model that trains: torch.autograd.grad. The iteration's backward only if the
            # parameters are updated by hand with what it returned (in its hooks or after it), which moves their
            # versions; a gradient penalty's, mid-iteration, does not.
            self._unapplied = self._versions_at_start
            return
        self._unapplied = []
        self._backward_done = True
        self._grads = grads
        self._versions_at_end = self._versions()

    def _grads_used(self) -> bool:
        """Whether the gradients the last backward left were set to None, replaced or changed in place since
        (an update that then clears them), or the parameters were updated since (by hand, the gradients cleared
        only after the next forward: PyTorch's own tutorial loop). With none to look at (no parameters), the
        backward is enough."""
        if not self._grads:
            return True
        return (any(p.grad is None or id(p.grad) != g or p.grad._version != v for p, g, v in self._grads)
                or any(p._version != v for p, v in self._versions_at_end))

    def _graph_waiting(self) -> bool:
        return any(g is not None and not g.ran for g in (r() for r in self._graphs))

    def _boundary(self, source: str) -> None:
        self.boundaries += 1
        self._after_backward = False
        self._graphs.clear()
        self._grads, self._versions_at_end, self._versions_at_enter = [], [], []
        self._backward_done = False
        self._since = Counter()
        self.mark(source)


def _eager(hook):
    """`hook` as torch.compile sees it: a call it leaves to run as plain Python (a graph break). An optimizer
    step compiled whole (`torch.compile(opt.step)`, PyTorch's recipe) runs these hooks inside its frame; traced,
    a boundary's suspend would become part of the compiled step. Uncompiled, the test costs a function call."""
    outside = torch.compiler.disable(hook, recursive=True)

    def seen(*args):
        return outside(*args) if torch.compiler.is_compiling() else hook(*args)
    return seen


def _in_backward() -> bool:
    """Whether this thread is running a backward (hooks, a checkpointed block's recomputed forward). Code that
    torch.compile traces is a forward; asking there would break its graph (and change the compiled numbers)."""
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1


def _grad_fns(output) -> list:
    """The graph nodes of the tensors in a module's output (a tensor, a sequence, a mapping, one level deep)."""
    if isinstance(output, torch.Tensor):
        return [output.grad_fn] if output.grad_fn is not None else []
    if isinstance(output, dict):
        items = list(output.values())[:_TENSORS_PER_OUTPUT]
    elif isinstance(output, (tuple, list)):
        items = list(output[:_TENSORS_PER_OUTPUT])
    else:
        return []
    nodes = []
    for item in items:
        for t in (item if isinstance(item, (tuple, list)) else (item,))[:_TENSORS_PER_OUTPUT]:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                nodes.append(t.grad_fn)
    return nodes
