"""How a library parameter is spelled on the command line.

Every option is ``--`` plus the parameter's own (scikit-learn) name with ``-`` for ``_``
(``emit_layer`` -> ``--emit-layer``); a boolean is ``--x/--no-x`` unless :data:`OFF_FLAGS`
names a better "off" flag; :data:`FLAG_ALIASES` lists short spellings also accepted.  The
command line (:mod:`featpipe.cli.options`) builds its options with these rules, and the
library uses them where it words a message or a logged command for a command-line user.
"""

from __future__ import annotations

#: Short spellings the command line also accepts for a parameter, beside its own flag
#: (``--random-state``); a command may add its own (``fit pca --dim`` for ``n_components``).
FLAG_ALIASES = {"random_state": ("--seed",)}


#: ``--x/--no-x`` is the rule for a boolean; these have a better name for "off".
OFF_FLAGS = {"per_frame": "--per-item"}


def flag_of(name: str) -> str:
    """The command-line flag of parameter ``name``: ``emit_layer`` -> ``--emit-layer``
    (scikit-learn's name; :data:`FLAG_ALIASES` lists the short spellings also accepted)."""
    return "--" + name.replace("_", "-")


def off_flag_of(name: str, flag: str | None = None) -> str:
    """The "off" flag of boolean parameter ``name`` (whose "on" flag is ``flag``, default
    :func:`flag_of`): ``l2`` -> ``--no-l2``, ``per_frame`` -> ``--per-item``."""
    return OFF_FLAGS.get(name, "--no-" + (flag or flag_of(name))[2:])
