"""Every single-point mutation of a module, each run against the tests that reach its line.

Usage (issue 31 §4, issue 39 §6; ``benchmarks/results/mutation-testing.md``)::

    nice -n 19 python benchmarks/mutation_sample.py featpipe/store/ledger.py \
        tests/stages/test_store.py ... [--log store.jsonl] [--timeout 120] [--only 3,17]
        [--part 1/2] [--list] [--confirm]
        [--cover featpipe/store/pack.py,...] [--coverage-cache coverage.json]
        [--kinds branch,boundary,equality,constant,call] [--budget 12] [--resume]

The mutants are enumerated, not drawn: every point of the module where one of these changes
applies is a mutant (a plausible bug each):

- a comparison flipped: ``==``/``!=``, ``<``/``<=``, ``>``/``>=`` (a boundary),
  ``in``/``not in``, ``is``/``is not``; ``and``/``or`` swapped; a ``not`` dropped;
- an arithmetic operator swapped; an integer constant + 1, a float constant + 1,
  ``True``/``False`` swapped;
- a failure branch: an ``if`` whose condition becomes ``False`` (the branch never taken), an
  ``except`` whose body becomes ``raise`` (the failure not handled);
- a statement deleted: a call (``os.fsync``, ``flush``, ``join``, ``os.replace``, a checksum
  ``check``...), ``continue``, ``break``, ``raise``;
- a returned value replaced by ``None``; a dict entry, a keyword argument or the last of two
  or more positional arguments dropped (``zlib.crc32(block, crc)`` -> ``zlib.crc32(block)``).

Points inside annotations are listed but not run: under ``from __future__ import annotations``
they are never evaluated (equivalent by construction).

How it runs: the repository is copied to a temporary folder.  The unmutated tests run once
under coverage (``coverage.process_startup`` reaches the ``featpipe`` subprocesses the tests
start, each test's id being its coverage context), which gives, for each line of the module,
the tests that execute it, and each test's duration.  Each mutant replaces the module there
(``ast.unparse``, no byte-code written or read) and runs ``pytest -x`` on the tests that reach
its lines, fastest first, in a child forked from a process that has imported pytest, numpy,
scipy and h5py (not featpipe), with a timeout: 2 x the unmutated time of every test of the
files those tests are in (their module fixtures included) + 60 s; a mutant that times out is
run once more with three times as long, and only then counts as killed by its timeout.  A
mutant no test reaches survives without a run.  With ``--confirm`` a survivor is run again
against every test of the given files, so a test the coverage missed (a worker process
reused across tests keeps its first test's id) still counts; without it a survivor may be
killed by a test the coverage did not attribute to its line, which can only lower the
score.  ``--kinds`` runs the classes of :func:`mutation_kind` only (issue 39 §6 names
failure branches, boundaries, constants and dropped fsync/flush/join/rename/checksum calls);
``--budget`` caps a mutant's tests (the fastest of each file that reaches it first), so a
survivor of a capped run may still be killed by a slower test (``survived (budget)``: judge
or confirm it); ``--resume`` skips what ``--log`` already holds.  One JSON line per mutant
goes to ``--log``; the score is printed last.  A survivor is then judged by reading it:
equivalent, or a gap in the tests.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_CMP_SWAP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
             ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In,
             ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
             ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
             ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr, ast.LShift: ast.RShift,
             ast.RShift: ast.LShift}
#: Imported once by the parent of every mutant's run (never featpipe: the mutant is).
_PRELOAD = ("pytest", "numpy", "scipy", "scipy.linalg", "h5py", "click", "click.testing")

# The pytest plugin of the coverage run: each test's id is the coverage context of this
# process (switched) and of the processes it starts (read from the environment).
_PLUGIN = '''
import json, os, time
import coverage

_durations = {}

def pytest_runtest_setup(item):
    os.environ["MUTATION_TEST_ID"] = item.nodeid
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)

def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration

def pytest_sessionfinish(session):
    with open(os.environ["MUTATION_DURATIONS"], "w") as handle:
        json.dump(_durations, handle)
'''


def _is_docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return isinstance(parent, ast.Module | ast.ClassDef | ast.FunctionDef |
                      ast.AsyncFunctionDef) and parent.body and parent.body[0] is node


def annotation_nodes(tree: ast.Module) -> set[int]:
    """``id`` of every node inside an annotation: never evaluated under ``from __future__
    import annotations``, so a mutation there is equivalent and is not run."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            roots.append(node.returns)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def _node_points(node: ast.AST, index: int, parent: ast.AST | None
                 ) -> list[tuple[str, tuple, ast.AST]]:
    """The mutations of one node: ``(description, path, the node whose lines it changes)``."""
    points = []
    if isinstance(node, ast.Compare):
        for k, op in enumerate(node.ops):
            if type(op) in _CMP_SWAP:
                points.append((f"compare {type(op).__name__}->{_CMP_SWAP[type(op)].__name__}",
                               (index, "cmp", k), node))
    elif isinstance(node, ast.BoolOp):
        points.append((f"boolop {type(node.op).__name__} swapped", (index, "bool", 0), node))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        points.append(("not dropped", (index, "not", 0), node))
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BIN_SWAP:
        points.append((f"binop {type(node.op).__name__}->{_BIN_SWAP[type(node.op)].__name__}",
                       (index, "bin", 0), node))
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            points.append((f"constant {node.value}->{not node.value}", (index, "const", 0), node))
        elif isinstance(node.value, int | float):
            points.append((f"constant {node.value}->{node.value + 1}", (index, "const", 0), node))
    elif isinstance(node, ast.Dict):
        for k, key in enumerate(node.keys):
            if isinstance(key, ast.Constant):
                points.append((f"dict entry {key.value!r} dropped", (index, "dict", k), node))
    elif isinstance(node, ast.Call):
        for k, kw in enumerate(node.keywords):
            if kw.arg is not None:
                points.append((f"keyword {kw.arg}= dropped", (index, "kw", k), node))
        if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
            points.append(("last positional argument dropped", (index, "arg", 0), node))
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        points.append(("return value -> None", (index, "ret", 0), node))
    elif isinstance(node, ast.If):
        points.append(("if condition -> False", (index, "if", 0), node.test))
    elif isinstance(node, ast.ExceptHandler) and not (
            len(node.body) == 1 and isinstance(node.body[0], ast.Raise)
            and node.body[0].exc is None):
        points.append(("except body -> raise", (index, "except", 0), node))
    if isinstance(node, ast.Expr | ast.Continue | ast.Break | ast.Raise) and not \
            _is_docstring(node, parent) and not (isinstance(node, ast.Expr) and
                                                 isinstance(node.value, ast.Constant)):
        points.append((f"statement {type(node).__name__} deleted", (index, "stmt", 0), node))
    return points


def mutation_points(tree: ast.Module) -> list[dict]:
    """Every mutation of the module: ``line``, ``lines`` (first, last), ``what``, ``path``
    (finds the node again in a copy of the tree) and ``annotation``."""
    points = []
    annotations = annotation_nodes(tree)
    parents: dict[int, ast.AST] = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[id(child)] = parent
    for index, node in enumerate(ast.walk(tree)):
        for what, path, where in _node_points(node, index, parents.get(id(node))):
            first = getattr(where, "lineno", 0)
            points.append({"line": first, "what": what, "path": path,
                           "lines": (first, getattr(where, "end_lineno", first) or first),
                           "annotation": id(node) in annotations,
                           "kind": mutation_kind(node, path)})
    return points


#: Calls whose deletion is a "dropped call" of issue 39 §6 (data written, synced, renamed,
#: removed, checked): a called name containing one of these.
_DATA_CALLS = ("fsync", "flush", "join", "replace", "rename", "unlink", "rmtree", "rmdir",
               "check", "verify", "seal", "crc", "sum", "hash")


def mutation_kind(node: ast.AST, path: tuple) -> str:
    """The class of a mutation, for ``--kinds``: ``branch`` (an ``if`` never taken, an
    ``except`` that re-raises, a ``raise`` deleted), ``boundary`` (``<``/``<=``,
    ``>``/``>=``), ``equality`` (``==``/``!=``), ``constant``, ``call`` (a statement calling
    fsync, flush, join, replace, unlink, a checksum... deleted): the classes issue 39 §6 names;
    ``other`` for the rest (operators, arguments, returned values, ``not``, ``and``/``or``)."""
    code = path[1]
    if code in ("if", "except") or isinstance(node, ast.Raise):
        return "branch"
    if code == "cmp":
        op = type(node.ops[path[2]])
        return ("boundary" if op in (ast.Lt, ast.LtE, ast.Gt, ast.GtE) else
                "equality" if op in (ast.Eq, ast.NotEq) else "other")
    if code == "const":
        return "constant"
    if code == "stmt" and isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        name = getattr(func, "attr", getattr(func, "id", "")).lower()
        return "call" if any(word in name for word in _DATA_CALLS) else "other"
    return "other"


def mutate(tree: ast.Module, path: tuple) -> ast.Module:
    """A copy of ``tree`` with the mutation at ``path`` applied."""
    tree = copy.deepcopy(tree)
    index, kind, k = path
    node = next(n for i, n in enumerate(ast.walk(tree)) if i == index)
    if kind == "cmp":
        node.ops[k] = _CMP_SWAP[type(node.ops[k])]()
    elif kind == "bool":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "not":
        _replace(tree, node, node.operand)
    elif kind == "bin":
        node.op = _BIN_SWAP[type(node.op)]()
    elif kind == "const":
        node.value = (not node.value) if isinstance(node.value, bool) else node.value + 1
    elif kind == "dict":
        del node.keys[k], node.values[k]
    elif kind == "kw":
        del node.keywords[k]
    elif kind == "arg":
        del node.args[-1]
    elif kind == "ret":
        node.value = ast.Constant(None)
    elif kind == "if":
        node.test = ast.Constant(False)
    elif kind == "except":
        node.body = [ast.Raise()]
    elif kind == "stmt":
        _replace(tree, node, ast.Pass())
    return ast.fix_missing_locations(tree)


def _replace(tree: ast.Module, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list) and any(v is old for v in value):
                value[[id(v) for v in value].index(id(old))] = new
                return
    raise ValueError("node not found")


def _copy_repo(target: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("featpipe", "tests", "examples", "manifests", "docs", "benchmarks", "bin"):
        if (REPO / name).exists():
            shutil.copytree(REPO / name, target / name, ignore=ignore, symlinks=True)
    for name in ("setup.cfg", "pyproject.toml", "README.md", "CONTRIBUTING.md"):
        shutil.copy2(REPO / name, target / name)


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(root))
    for name in ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG"):
        env.pop(name, None)
    return env


def line_tests(root: Path, modules: list[str], tests: list[str]) -> tuple[dict, dict]:
    """Run the unmutated tests under coverage: ``{module: {line: set of test ids}}`` (the id
    ``""``: executed outside any test, at import) and ``{test id: seconds}``."""
    config = root / ".mutation-coverage"
    parser = configparser.ConfigParser(interpolation=None)
    parser["run"] = {"data_file": str(root / ".mutation-data"), "parallel": "True",
                     "include": ",".join(str(root / m) for m in modules),
                     "context": "${MUTATION_TEST_ID}", "branch": "False"}
    with open(config, "w") as handle:
        parser.write(handle)
    (root / "_mutation_plugin.py").write_text(_PLUGIN)
    durations = root / ".mutation-durations.json"
    env = dict(_env(root), COVERAGE_PROCESS_START=str(config), MUTATION_TEST_ID="",
               MUTATION_DURATIONS=str(durations))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "_mutation_plugin", *tests], cwd=root, env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"the unmutated tests do not pass:\n{result.stdout[-3000:]}")
    import coverage

    combined = coverage.Coverage(data_file=str(root / ".mutation-data"), config_file=False)
    combined.combine(keep=False)
    combined.load()
    data = combined.get_data()
    by_line: dict[str, dict[int, set[str]]] = {m: defaultdict(set) for m in modules}
    for filename in data.measured_files():
        module = Path(filename).resolve().relative_to(root.resolve()).as_posix()
        lines = by_line.setdefault(module, defaultdict(set))
        for line, contexts in data.contexts_by_lineno(filename).items():
            for context in contexts:
                lines[line].add(next((p for p in context.split("|") if p), ""))
    return by_line, json.loads(durations.read_text())


def cached_line_tests(root: Path, modules: list[str], tests: list[str], cache: str
                      ) -> tuple[dict, dict]:
    """:func:`line_tests`, read from ``cache`` (JSON) when it was written for the same
    modules and tests, else run and written there: one coverage run serves several modules
    and the parts of a module run side by side."""
    wanted = {"modules": sorted(modules), "tests": list(tests)}
    if cache and Path(cache).exists():
        saved = json.loads(Path(cache).read_text())
        if {k: saved[k] for k in wanted} == wanted:
            return ({m: {int(k): set(v) for k, v in lines.items()}
                     for m, lines in saved["by_line"].items()}, saved["durations"])
    by_line, durations = line_tests(root, modules, tests)
    if cache:
        Path(cache).write_text(json.dumps(dict(wanted, durations=durations, by_line={
            m: {k: sorted(v) for k, v in lines.items()} for m, lines in by_line.items()})))
    return by_line, durations


def within_budget(chosen: list[str], durations: dict, budget: float
                  ) -> tuple[list[str], bool]:
    """The tests of ``chosen`` (fastest first) a mutant runs within ``budget`` seconds of
    their unmutated time: the fastest of each test file first (every file that reaches the
    line is tried), then the fastest others while they fit; and whether any was left out."""
    picked = set({t.split("::")[0]: t for t in reversed(chosen)}.values())
    total = sum(durations[t] for t in picked)
    for test in chosen:
        if test not in picked and total + durations[test] <= budget:
            picked.add(test)
            total += durations[test]
    return sorted(picked, key=durations.get), len(picked) < len(chosen)


def _preload() -> None:
    for name in _PRELOAD:
        __import__(name)


def run_forked(root: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """``pytest -x`` on ``tests`` in a forked child (its own process group, killed whole at
    the timeout): ``killed``, ``survived`` or ``timeout``, and the seconds it took."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: a fresh featpipe (the mutant) is imported by the tests
        code = 3
        try:
            os.setpgid(0, 0)
            os.chdir(root)
            sys.path.insert(0, str(root))
            os.environ.update(_env(root))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
        finally:
            os._exit(code)
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            with _suppress():
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            _kill_group(pid)
            return "timeout", time.perf_counter() - start
        time.sleep(0.05)
    _kill_group(pid)
    code = os.waitstatus_to_exitcode(status)
    return ("survived" if code == 0 else "killed"), time.perf_counter() - start


def _kill_group(pid: int) -> None:
    """Processes the tests left behind in the child's group (a server a test started)."""
    with _suppress():
        os.killpg(pid, signal.SIGKILL)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, OSError)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="the module to mutate, e.g. featpipe/store/ledger.py")
    parser.add_argument("tests", nargs="+", help="its test files")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds per mutant (default: 3x its tests' unmutated time + 20)")
    parser.add_argument("--only", default="", help="comma-separated mutant numbers to run")
    parser.add_argument("--part", default="1/1", metavar="K/N",
                        help="run every N-th mutant from the K-th (N runs side by side)")
    parser.add_argument("--list", action="store_true", help="list the mutants only")
    parser.add_argument("--log", default="", help="append one JSON line per mutant here")
    parser.add_argument("--cover", default="",
                        help="comma-separated modules whose lines the coverage run also maps")
    parser.add_argument("--coverage-cache", default="",
                        help="JSON file of the coverage run, reused when it matches")
    parser.add_argument("--confirm", action="store_true",
                        help="rerun a survivor against every test of the files")
    parser.add_argument("--kinds", default="",
                        help="comma-separated classes to run (branch, boundary, equality, "
                             "constant, call, other; default: all)")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds of unmutated test time a mutant may run: the fastest "
                             "test of each file that reaches it, then the fastest others; a "
                             "survivor of a capped run is logged 'survived (budget)'")
    parser.add_argument("--resume", action="store_true",
                        help="skip the mutants already in --log")
    args = parser.parse_args()

    source = (REPO / args.module).read_text(encoding="utf-8")
    tree = ast.parse(source)
    points = mutation_points(tree)
    lines = source.splitlines()
    numbered = [(n, p) for n, p in enumerate(points) if not p["annotation"]]
    if args.kinds:
        kinds = set(args.kinds.split(","))
        numbered = [(n, p) for n, p in numbered if p["kind"] in kinds]
    if args.only:
        wanted = {int(n) for n in args.only.split(",")}
        numbered = [(n, p) for n, p in numbered if n in wanted]
    part, parts = (int(k) for k in args.part.split("/"))
    numbered = numbered[part - 1::parts]
    if args.resume and args.log and Path(args.log).exists():
        done = {json.loads(line)["n"] for line in Path(args.log).read_text().splitlines()}
        numbered = [(n, p) for n, p in numbered if n not in done]
    print(f"{args.module}: {len(points)} mutants ({len(points) - len(numbered)} in annotations "
          f"or not asked for), running {len(numbered)}", flush=True)
    if args.list:
        for n, p in numbered:
            print(f"#{n} line {p['line']} [{p['kind']}]: {p['what']}: "
                  f"{lines[p['line'] - 1].strip()[:90]}")
        return
    log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        root = Path(tmp)
        _copy_repo(root)
        start = time.perf_counter()
        modules = sorted({args.module, *filter(None, args.cover.split(","))})
        by_module, durations = cached_line_tests(root, modules, args.tests, args.coverage_cache)
        by_line = by_module[args.module]
        every = sorted(durations, key=durations.get)
        print(f"unmutated tests pass under coverage in {time.perf_counter() - start:.0f} s "
              f"({len(every)} tests, {sum(durations.values()):.0f} s in tests)", flush=True)
        _preload()
        target = root / args.module
        counts = defaultdict(int)
        for n, p in numbered:
            reached = set().union(*(by_line.get(k, set())
                                    for k in range(p["lines"][0], p["lines"][1] + 1)))
            chosen = every if "" in reached else sorted(reached & set(durations),
                                                        key=durations.get)
            target.write_text(ast.unparse(mutate(tree, p["path"])) + "\n", encoding="utf-8")
            capped = False
            if args.budget and chosen:
                chosen, capped = within_budget(chosen, durations, args.budget)
            status, seconds, ran = "not reached", 0.0, len(chosen)
            if chosen:
                files = {t.split("::")[0] for t in chosen}
                limit = args.timeout or 2 * sum(d for t, d in durations.items()
                                                if t.split("::")[0] in files) + 60
                status, seconds = run_forked(root, chosen, limit)
                if status == "timeout":  # the load, or a mutant that hangs: once more
                    status, more = run_forked(root, chosen, 3 * limit)
                    seconds += more
            if status in ("survived", "not reached") and args.confirm:
                limit = args.timeout or 3 * sum(durations.values()) + 20
                status, more = run_forked(root, args.tests, limit)
                seconds += more
                ran, capped = len(every), False
                status = {"survived": "survived", "killed": "killed (all tests)",
                          "timeout": "timeout (all tests)"}[status]
            if capped and status == "survived":
                status = "survived (budget)"
            counts[status.split()[0]] += 1
            text = lines[p["line"] - 1].strip()[:90]
            print(f"#{n} {status:8s} {seconds:6.1f}s {ran:3d} tests line {p['line']} "
                  f"[{p['kind']}]: "
                  f"{p['what']}: {text}", flush=True)
            if log is not None:
                log.write(json.dumps({"module": args.module, "n": n, "line": p["line"],
                                      "what": p["what"], "kind": p["kind"], "code": text,
                                      "status": status,
                                      "seconds": round(seconds, 1), "tests": ran}) + "\n")
                log.flush()
        target.write_text(source, encoding="utf-8")
    killed = counts["killed"] + counts["timeout"]
    print(f"{args.module}: {len(numbered)} mutants, {killed} killed ({counts['timeout']} by "
          f"timeout), {counts['survived']} survived; score "
          f"{killed / max(1, len(numbered)):.0%} before judging equivalents", flush=True)


if __name__ == "__main__":
    main()
