"""The comparator networks of featpipe/extract/_flow_median.py: derived, pruned, checked, printed.

A 5×5 median (rank 12 of 25, 0-based) of five sorted columns c0..c4 is built from these networks
(Adams, "Fast median filters using separable sorting networks", ACM TOG 40(4), SIGGRAPH 2021):

* ``SORT5``: each column of 5 sorted (the optimal 9-comparator network); two output rows
  share 4 source rows, so the kernel sorts those 4 once (``SORT4``, 5 comparators) and merges
  each row's fifth value into them (``INSERT``, 4 comparators): 13 comparators per two
  columns where SORT5 twice takes 18 (Adams shares rows this way); SORT5 serves the borders;
* ``PAIR``: two sorted columns merged into a sorted 10-list (Batcher's odd-even merge, 13
  comparators); a pair of neighbouring columns serves two outputs;
* ``QUAD``: two pairs merged and pruned to ranks 7..12 of their 20 values, the only ones that
  can be rank 12 once five more values join (rank i of 20 is rank i..i + 5 of 25);
* ``FINAL``: rank 12 of 25 = rank 5 of those six and the fifth column (5 sorted values).

Batcher's odd-even merge (Knuth, TAOCP vol. 3, §5.3.4) for any lengths, then pruned backwards from
the outputs used: a comparator whose outputs are both unused is dropped, one with a single used
output becomes a min or a max.  Each network is checked by the 0-1 principle (Knuth §5.3.4,
Theorem Z): its inputs are sorted lists, so a 0-1 input is a count of ones per list.

Usage: python benchmarks/gen_flow_median.py  (checks and sizes each network, then prints the
module's network functions; tests/unit/test_flow_median.py checks the module holds them)
"""

from __future__ import annotations

import itertools

#: a sorting network of 5 with the fewest comparators, 9 (Knuth §5.3.4)
SORT5_COMPARATORS = ((0, 1), (3, 4), (2, 4), (2, 3), (0, 3), (0, 2), (1, 4), (1, 3), (1, 2))


def batcher_merge(a: list[int], b: list[int], net: list) -> list[int]:
    """Odd-even merge of the sorted wires ``a`` and ``b``: appends its comparators (min on
    the first wire) to ``net`` and returns the wires in sorted order."""
    if not a or not b:
        return list(a or b)
    if len(a) == 1 and len(b) == 1:
        net.append((a[0], b[0]))
        return [a[0], b[0]]
    v = batcher_merge(a[0::2], b[0::2], net)
    w = batcher_merge(a[1::2], b[1::2], net)
    out = [v[0]]
    for i, wire in enumerate(w):
        if i + 1 < len(v):
            net.append((v[i + 1], wire))
            out += [v[i + 1], wire]
        else:
            out.append(wire)
    return out + v[len(w) + 1:]


def prune(net: list, used: list[int]) -> list[tuple[int, int, str]]:
    """The comparators that reach ``used``: (min wire, max wire, "both" | "min" | "max")."""
    need, kept = set(used), []
    for lo, hi in reversed(net):
        if lo in need or hi in need:
            kind = "both" if lo in need and hi in need else ("min" if lo in need else "max")
            kept.append((lo, hi, kind))
            need |= {lo, hi}
    return kept[::-1]


def network(sizes: tuple[int, ...], merges: list[tuple[int, int]], outputs: slice):
    """Sorted inputs of ``sizes`` merged by ``merges`` (index pairs into the list of sorted
    lists, each merge appending its result), pruned to ``outputs`` of the last merge:
    (comparators, wires of the inputs, output wires)."""
    lists, start = [], 0
    for size in sizes:
        lists.append(list(range(start, start + size)))
        start += size
    inputs, net = [list(wires) for wires in lists], []
    for i, j in merges:
        lists.append(batcher_merge(lists[i], lists[j], net))
    used = lists[-1][outputs]
    return prune(net, used), inputs, used


def apply(comparators, values: list) -> list:
    values = list(values)
    for lo, hi, kind in comparators:
        a, b = values[lo], values[hi]
        if kind != "max":
            values[lo] = min(a, b)
        if kind != "min":
            values[hi] = max(a, b)
    return values


def check(comparators, inputs: list[list[int]], outputs: list[int], ranks: range) -> int:
    """Every 0-1 input of sorted lists (a count of ones per list) gives ``ranks`` of the
    sorted inputs at ``outputs``; returns the number of cases."""
    cases = 0
    for ones in itertools.product(*(range(len(wires) + 1) for wires in inputs)):
        values = [0] * (1 + max(max(wires) for wires in inputs))
        for wires, count in zip(inputs, ones, strict=True):
            for wire in wires[len(wires) - count:]:
                values[wire] = 1
        result = apply(comparators, values)
        expect = sorted(values)
        assert [result[w] for w in outputs] == [expect[r] for r in ranks], ones
        cases += 1
    return cases


def networks() -> dict:
    """name: (comparators, input wires, output wires, ranks of the outputs)."""
    sort5 = [(lo, hi, "both") for lo, hi in SORT5_COMPARATORS]
    return {
        "SORT5": (sort5, [[w] for w in range(5)], list(range(5)), range(5)),
        "SORT4": (*network((1, 1, 1, 1), [(0, 1), (2, 3), (4, 5)], slice(None)), range(4)),
        "INSERT": (*network((4, 1), [(0, 1)], slice(None)), range(5)),
        "PAIR": (*network((5, 5), [(0, 1)], slice(None)), range(10)),
        "QUAD": (*network((10, 10), [(0, 1)], slice(7, 13)), range(7, 13)),
        "FINAL": (*network((6, 5), [(0, 1)], slice(5, 6)), range(5, 6)),
    }


def statements(comparators, names: list[str], prefix: str) -> tuple[list[str], list[str]]:
    """Straight-line numba statements of a pruned network on the variables ``names`` (one
    per wire): min/max as conditional expressions (vminps/vmaxps once vectorised); returns
    (lines, the variable holding each wire at the end)."""
    names, lines = list(names), []
    for k, (lo, hi, kind) in enumerate(comparators):
        a, b = names[lo], names[hi]
        if kind != "max":
            names[lo] = f"{prefix}{k}l"
            lines.append(f"{names[lo]} = {a} if {a} < {b} else {b}")
        if kind != "min":
            names[hi] = f"{prefix}{k}h"
            lines.append(f"{names[hi]} = {b} if {a} < {b} else {a}")
    return lines, names


#: the module's network functions: (name, network, argument names, what they return)
FUNCTIONS = (
    ("sort5", "SORT5", ("v0", "v1", "v2", "v3", "v4"), "the 5 values sorted"),
    ("sort4", "SORT4", ("v0", "v1", "v2", "v3"), "the 4 values sorted"),
    ("insert", "INSERT", ("a", "x"), "``x`` merged into the sorted 4-tuple ``a``"),
    ("merge_pair", "PAIR", ("a", "b"), "two sorted 5-tuples merged"),
    ("middle_ranks", "QUAD", ("a", "b"), "ranks 7..12 of two sorted 10-tuples"),
    ("median_of", "FINAL", ("q", "c"),
     "rank 5 of ``q`` (ranks 7..12 of 20) and ``c`` (5 sorted): rank 12 of the 25"),
)


def function_source(name: str, net: str, args: tuple[str, ...], doc: str) -> str:
    """One network as a numba function (the test checks that the module holds this text)."""
    comparators, inputs, outputs, _ = networks()[net]
    ops = sum(2 if kind == "both" else 1 for _, _, kind in comparators)
    lines = ["@numba.njit(nogil=True)",
             f"def {name}({', '.join(args)}):",
             f'    """{doc[0].upper() + doc[1:]} ({ops} min/max)."""']
    names = list(args)
    if any(len(wires) > 1 for wires in inputs):
        names = [f"{arg}{k}" if len(wires) > 1 else arg
                 for arg, wires in zip(args, inputs, strict=True) for k in range(len(wires))]
        for arg, wires in zip(args, inputs, strict=True):
            if len(wires) > 1:
                lines.append("    " + ", ".join(f"{arg}{k}" for k in range(len(wires)))
                             + f" = {arg}")
    body, names = statements(comparators, names, "m")
    lines += ["    " + line for line in body]
    result = [names[w] for w in outputs]
    lines.append(f"    return {result[0]}" if len(result) == 1
                 else f"    return ({', '.join(result)})")
    return "\n".join(lines) + "\n"


def module_functions() -> str:
    return "\n\n".join(function_source(*spec) for spec in FUNCTIONS)


def main():
    for name, (comparators, inputs, outputs, ranks) in networks().items():
        ops = sum(2 if kind == "both" else 1 for _, _, kind in comparators)
        cases = check(comparators, inputs, outputs, ranks)
        print(f"{name}: {len(comparators)} comparators, {ops} min/max, "
              f"checked on {cases} 0-1 inputs")
    print()
    print(module_functions())


if __name__ == "__main__":
    main()
