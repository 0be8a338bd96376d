"""A run is one plan, checked and priced whole before any work starts.

The plan of a run (``featpipe run PIPELINE.toml``, or one command) is a graph: its nodes are
the stages the run computes (:class:`Node`: the step that makes it, the stage's kind, key and
store name, its item kind (:mod:`featpipe.item_kinds`), items, bytes at rest and CPU), its
edges the stages each reads and the passes that compute several of them at once (a node run
inside another step's pass is not written unless kept).  Each step is planned as its command
plans itself (the stage functions' dry run, :mod:`featpipe.stages.dryrun`), on the stages
planned for the steps before it, so a pipeline and the single commands build the same nodes.

Every problem of any node is found before the first node runs (:attr:`Plan.problems`): a
missing weights file or model, an input of the wrong item kind, a bad name, the disk (the
bytes at rest of everything the plan writes against the free space of the store's disk), a
store that cannot be written; a run with a problem computes nothing and writes nothing, and
says every problem once.  Steps that no problem blocks can still run
(:meth:`Plan.blocked_steps`: ``featpipe run --skip-blocked``).  A dry run prints the plan
(:func:`print_plan`), a real run prints one line of it and executes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from featpipe.extract.estimate import free_bytes, human_bytes

#: the ``items`` of a node that holds fitted models
MODEL = "model"


@dataclass
class Node:
    """One stage of a plan (see the module docstring); ``written`` is False for a stage
    computed inside a pass without being stored, ``pass_step`` names the step whose pass
    computes it (None: its own step), ``todo`` the items it computes (None: not counted)."""

    step: str
    stage: str
    kind: str
    name: str | None = None
    item_kind: str | None = None
    items: int | str | None = None
    bytes: int | None = None
    cpu: float | None = None
    inputs: tuple[str, ...] = ()
    written: bool = True
    pass_step: str | None = None
    todo: int | None = None


@dataclass
class Problem:
    """What stops a step: the step and the cause, in one line."""

    step: str
    text: str

    def __str__(self) -> str:
        return f"step {self.step!r}: {self.text}" if self.step else self.text


@dataclass
class Plan:
    """The nodes of a run in order, the problems found, and which steps read which (for the
    steps a problem blocks); ``unplanned`` lists steps that cannot be planned before an
    earlier one runs (they are checked when it has)."""

    nodes: list[Node] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    reads: dict[str, set[str]] = field(default_factory=dict)
    unplanned: dict[str, str] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)

    def add(self, node: Node) -> None:
        """Add ``node``; a stage planned by an earlier step (the same key) is one node."""
        for known in self.nodes:
            if known.stage == node.stage and node.stage != "classify":
                if node.written and not known.written:
                    known.written, known.name = True, node.name or known.name
                return
        self.nodes.append(node)

    def problem(self, step: str, text: str) -> None:
        if not any(p.step == step and p.text == text for p in self.problems):
            self.problems.append(Problem(step, text))

    @property
    def written(self) -> list[Node]:
        return [node for node in self.nodes if node.written]

    def at_rest(self) -> tuple[int, int]:
        """(bytes at rest of what the plan writes, stages of it not sized)."""
        sized = [n.bytes for n in self.written if n.bytes is not None]
        return sum(sized), len(self.written) - len(sized)

    def cpu(self) -> float:
        return sum(node.cpu or 0.0 for node in self.nodes)

    def check_disk(self, store) -> None:
        """A problem when what the plan writes does not fit on the store's disk."""
        need, _ = self.at_rest()
        free = free_bytes(store.root)
        if need > free:
            self.problem("", f"the plan needs about {human_bytes(need)} at rest but the "
                         f"store's disk has {human_bytes(free)} free: sample fewer frames "
                         "(--fps/--every/--frames), encode while extracting, keep fewer "
                         "stages, or free space")

    def check_writable(self, store) -> None:
        from featpipe.errors import FeatpipeError

        try:
            store.check_writable()
        except FeatpipeError as err:
            self.problem("", str(err))

    def blocked_steps(self) -> dict[str, str]:
        """Each step a problem blocks, with the step whose problem it is: the steps with a
        problem and every step that reads one of them (directly or through others)."""
        blocked = {p.step: p.step for p in self.problems if p.step}
        changed = True
        while changed:
            changed = False
            for step in self.steps:
                if step in blocked:
                    continue
                cause = next((blocked[r] for r in self.reads.get(step, ()) if r in blocked),
                             None)
                if cause is not None:
                    blocked[step] = cause
                    changed = True
        return blocked

    def summary(self) -> str:
        """The plan in one line: stages, passes, bytes at rest, CPU, problems."""
        passes = len({n.pass_step for n in self.nodes if n.pass_step})
        size, unsized = self.at_rest()
        cpu = self.cpu()
        return (f"{len(self.nodes)} stages ({len(self.written)} written"
                + (f", {passes} fused pass(es)" if passes else "") + f"), "
                f"{human_bytes(size)} at rest" + (f" ({unsized} not sized)" if unsized else "")
                + (f", about {cpu_text(cpu)} of CPU for the extractions" if cpu else "")
                + f"; {len(self.problems)} problem(s)")


def cpu_text(seconds: float, hours: str = "h", minutes: str = "min") -> str:
    """'3.2 h' / '14.7 min' / '41 s' for a plan's CPU estimate."""
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} {hours}"
    if seconds >= 60:
        return f"{seconds / 60:.1f} {minutes}"
    return f"{seconds:.0f} s"


def print_plan(plan: Plan, reporter, heading: str = "dry run: the plan") -> None:
    """The plan as a table (a line per node; the nodes of a pass under it, those it does not
    write marked), its totals, the steps it cannot plan yet and every problem, once."""
    reporter.info(f"{heading} (bytes at rest; CPU of the extractions, calibrated on their "
                  "first item)")
    width = max((len(_label(n)) + (2 if n.pass_step else 0) for n in plan.nodes), default=4)
    reporter.info(f"  {'step':<{width}}  {'stage':<26}  {'items':>7}  {'item kind':<11}  "
                  f"{'at rest':>11}  CPU")
    shown_pass = None
    for node in plan.nodes:
        if node.pass_step and node.pass_step != shown_pass:
            reporter.info(f"  pass of step {node.pass_step!r} (one decode of each item; "
                          "stages marked 'not written' are computed in memory):")
            shown_pass = node.pass_step
        elif not node.pass_step:
            shown_pass = None
        size = "not written" if not node.written else (
            "?" if node.bytes is None else human_bytes(node.bytes))
        indent = "  " if node.pass_step else ""
        label = _label(node)
        reporter.info(f"  {indent}{label:<{width - len(indent)}}  {node.stage:<26}  "
                      f"{'-' if node.items is None else node.items!s:>7}  "
                      f"{node.item_kind or '-':<11}  {size:>11}  "
                      f"{'' if node.cpu is None else cpu_text(node.cpu)}".rstrip())
    for step, why in plan.unplanned.items():
        reporter.info(f"  {step}: planned when it runs ({why})")
    planned = {node.step for node in plan.nodes}
    for step, cause in plan.blocked_steps().items():
        if step != cause and step not in planned:
            reporter.info(f"  {step}: not planned, blocked by the problem of step {cause!r}")
    reporter.info(f"dry run: total {plan.summary()}")
    for problem in plan.problems:
        reporter.warn(f"problem: {problem}")


def _label(node: Node) -> str:
    step = node.step or node.kind  # a single command's own stage
    return step if not node.name or node.name == step else f"{step} -> {node.name}"
