"""torch modules of featpipe's differentiable encoders.

``from featpipe.nn import RankPool`` works; ``import featpipe.nn`` alone does not load torch
(each name below is imported from its module on first use, PEP 562), so the estimators can
read :mod:`featpipe.nn.choices` without it.

- :mod:`featpipe.nn.functional`: the differentiable functions (kornia's pattern: the modules
  here and the trainers of :mod:`featpipe.learn` import them): ``RankPoolArgmin`` (the
  rank-pooling SVR as an autograd function, backward by implicit differentiation) and its
  functional form ``featpipe.nn.functional.rank_pool`` (``featpipe.nn.rank_pool`` is the
  module), DHRP's ``psi_map`` and ``mapped_sequences``, GM-SOP's ``top_k_softmax`` and
  ``balance_loss``.
- :mod:`featpipe.nn.rank_pool`: ``RankPool`` and ``HierarchicalRankPool`` modules.
- :mod:`featpipe.nn.dhrp`: ``DiscriminativeRankPoolingNet`` (learned ψ(W x), rank pooling,
  soft-max classifier), trained by :class:`featpipe.learn.dhrp.DiscriminativeRankPooling`.
- :mod:`featpipe.nn.fisher`: ``FisherVectorLayer`` (the improved Fisher vector as a function of
  the GMM parameters, the deep Fisher kernel's layer).
- :mod:`featpipe.nn.gmsop`: ``GatedMixtureSOPNet`` (gated mixture of parametric second-order
  pooling and its classifier head), trained by :class:`featpipe.learn.gmsop.GatedMixtureSOP`.

Every module and function is checked with ``torch.autograd.gradcheck`` in the tests
(``tests/unit/test_nn.py``), at inputs with exact zeros, repeated frames and a single frame.
"""

from __future__ import annotations

import importlib

#: Each exported name and the module that defines it.
EXPORTS = {
    "RankPoolArgmin": "functional", "psi_map": "functional",
    "mapped_sequences": "functional", "pad_sequences": "functional",
    "solve_rank_svr": "functional", "argmin_input_gradient": "functional",
    "top_k_softmax": "functional", "balance_loss": "functional",
    "RankPool": "rank_pool", "HierarchicalRankPool": "rank_pool",
    "DiscriminativeRankPoolingNet": "dhrp",
    "FisherVectorFunction": "fisher", "FisherVectorLayer": "fisher",
    "GatedMixtureSOPNet": "gmsop",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'featpipe.nn' has no attribute {name!r}")
    return getattr(importlib.import_module(f"featpipe.nn.{EXPORTS[name]}"), name)


def __dir__():
    return sorted(set(globals()) | set(EXPORTS))
