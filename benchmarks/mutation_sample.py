"""A sample of single-point mutations of a module, each run against that module's tests.

Usage (issue 31 §4; ``benchmarks/RESULTS.md``)::

    python benchmarks/mutation_sample.py featpipe/store.py tests/stages/test_store.py ... \
        --sample 30 --seed 31 [--timeout 60] [--only 3,17] [--list]

Each mutation is one change a plausible bug makes: a comparison flipped (``==``/``!=``,
``<``/``<=``, ``in``/``not in``, ``is``/``is not``), ``and``/``or`` swapped, a ``not``
dropped, an arithmetic operator swapped, an integer constant off by one, ``True``/``False``
swapped, a statement deleted (a call, ``continue``, ``break``, ``raise``), a returned value
replaced by ``None``, a dict entry, a keyword argument or a call's argument dropped.  Every
point of the module is listed; ``--sample`` draws that many with ``random.Random(seed)`` (the
same points before and after new tests).  The repository (``featpipe``, ``tests``, the
configuration) is copied to a temporary folder; each mutant replaces the module there (written
back with :func:`ast.unparse`, no byte-code written or read) and runs ``pytest -x`` on the
given tests with a timeout (a timeout counts as killed).  Prints one line per mutant and the
score; a survivor is judged by reading it (equivalent, or a gap in the tests).
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_CMP_SWAP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
             ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In,
             ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
             ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
             ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr, ast.LShift: ast.RShift,
             ast.RShift: ast.LShift}


def _is_docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return isinstance(parent, ast.Module | ast.ClassDef | ast.FunctionDef |
                      ast.AsyncFunctionDef) and parent.body and parent.body[0] is node


def annotation_nodes(tree: ast.Module) -> set[int]:
    """``id`` of every node inside an annotation: never evaluated under ``from __future__
    import annotations``, so a mutation there is equivalent and is not drawn."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            roots.append(node.returns)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def mutation_points(tree: ast.Module) -> list[tuple[int, str, tuple]]:
    """Every ``(line, description, path)`` of one mutation; ``path`` finds the node again.
    Points inside annotations are numbered too (numbers stay those of earlier runs) and
    marked ``annotation`` in their description."""
    points = []
    annotations = annotation_nodes(tree)
    parents: dict[int, ast.AST] = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[id(child)] = parent
    for index, node in enumerate(ast.walk(tree)):
        line = getattr(node, "lineno", 0)
        parent = parents.get(id(node))
        if id(node) in annotations:
            if isinstance(node, ast.BinOp):
                points.append((line, "annotation", (index, "bin", 0)))
            continue
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _CMP_SWAP:
                    points.append((line, f"compare {type(op).__name__}->"
                                   f"{_CMP_SWAP[type(op)].__name__}", (index, "cmp", k)))
        elif isinstance(node, ast.BoolOp):
            points.append((line, f"boolop {type(node.op).__name__} swapped", (index, "bool", 0)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            points.append((line, "not dropped", (index, "not", 0)))
        elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BIN_SWAP:
            points.append((line, f"binop {type(node.op).__name__}->"
                           f"{_BIN_SWAP[type(node.op)].__name__}", (index, "bin", 0)))
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                points.append((line, f"constant {node.value}->{not node.value}",
                               (index, "const", 0)))
            elif isinstance(node.value, int):
                points.append((line, f"constant {node.value}->{node.value + 1}",
                               (index, "const", 0)))
        elif isinstance(node, ast.Dict):
            for k, key in enumerate(node.keys):
                if isinstance(key, ast.Constant):
                    points.append((line, f"dict entry {key.value!r} dropped", (index, "dict", k)))
        elif isinstance(node, ast.Call):
            for k, kw in enumerate(node.keywords):
                if kw.arg is not None:
                    points.append((line, f"keyword {kw.arg}= dropped", (index, "kw", k)))
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            points.append((line, "return value -> None", (index, "ret", 0)))
        if isinstance(node, ast.Expr | ast.Continue | ast.Break | ast.Raise) and not \
                _is_docstring(node, parent) and not (isinstance(node, ast.Expr) and
                                                     isinstance(node.value, ast.Constant)):
            points.append((line, f"statement {type(node).__name__} deleted",
                           (index, "stmt", 0)))
    return points


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
    elif kind == "ret":
        node.value = ast.Constant(None)
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


def run_tests(root: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """``killed``/``survived``/``timeout`` and the seconds the tests took."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(root))
    start = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=root, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start
    status = "survived" if result.returncode == 0 else "killed"
    if result.returncode not in (0, 1):  # collection error, internal error: still killed
        status = "killed"
    return status, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="the module to mutate, e.g. featpipe/store.py")
    parser.add_argument("tests", nargs="+", help="its test files")
    parser.add_argument("--sample", type=int, default=0, help="mutants drawn (0: all)")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds per mutant (default: 3x the unmutated run + 10)")
    parser.add_argument("--only", default="", help="comma-separated mutant numbers to run")
    parser.add_argument("--list", action="store_true", help="list the drawn mutants only")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="do not run the unmutated tests first (needs --timeout)")
    args = parser.parse_args()

    source = (REPO / args.module).read_text(encoding="utf-8")
    tree = ast.parse(source)
    points = mutation_points(tree)
    numbered = [(n, p) for n, p in enumerate(points) if p[1] != "annotation"]
    if args.sample and args.sample < len(points):
        numbered = sorted(random.Random(args.seed).sample(numbered, args.sample))
    if args.only:
        wanted = {int(n) for n in args.only.split(",")}
        numbered = [(n, p) for n, p in enumerate(points) if n in wanted]
    lines = source.splitlines()
    drawable = sum(p[1] != "annotation" for p in points)
    print(f"{args.module}: {len(points)} mutation points ({len(points) - drawable} in "
          f"annotations, not drawn), running {len(numbered)}", flush=True)
    if args.list:
        for n, (line, what, _) in numbered:
            print(f"#{n} line {line}: {what}: {lines[line - 1].strip()[:90]}")
        return
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        root = Path(tmp)
        _copy_repo(root)
        target = root / args.module
        if args.skip_baseline and args.timeout:
            timeout = args.timeout
        else:
            status, seconds = run_tests(root, args.tests, 600)
            if status != "survived":
                sys.exit(f"the unmutated tests do not pass ({status}); nothing measured")
            timeout = args.timeout or 3 * seconds + 10
            print(f"unmutated tests pass in {seconds:.1f} s; timeout {timeout:.0f} s", flush=True)
        counts = {"killed": 0, "survived": 0, "timeout": 0}
        for n, (line, what, path) in numbered:
            target.write_text(ast.unparse(mutate(tree, path)) + "\n", encoding="utf-8")
            status, seconds = run_tests(root, args.tests, timeout)
            counts[status] += 1
            print(f"#{n} {status:8s} {seconds:5.1f}s line {line}: {what}: "
                  f"{lines[line - 1].strip()[:90]}", flush=True)
        target.write_text(source, encoding="utf-8")
    killed = counts["killed"] + counts["timeout"]
    print(f"{args.module}: {len(numbered)} mutants, {killed} killed ({counts['timeout']} by "
          f"timeout), {counts['survived']} survived; score {killed / max(1, len(numbered)):.0%} "
          "before judging equivalents")


if __name__ == "__main__":
    main()
