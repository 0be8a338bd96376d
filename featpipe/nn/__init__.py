"""torch modules of featpipe's differentiable encoders (import torch: load them lazily).

- :mod:`featpipe.nn.rank_pool`: :class:`~featpipe.nn.rank_pool.RankPoolArgmin` (the rank-pooling
  SVR as an autograd function, backward by implicit differentiation), ``RankPool`` and
  ``HierarchicalRankPool`` modules.
- :mod:`featpipe.nn.dhrp`: ``DiscriminativeRankPoolingNet`` (learned ψ(W x), rank pooling,
  soft-max classifier), trained by :class:`featpipe.learn.dhrp.DiscriminativeRankPooling`.
- :mod:`featpipe.nn.fisher`: ``FisherVectorLayer`` (the improved Fisher vector as a function of
  the GMM parameters, the deep Fisher kernel's layer).
- :mod:`featpipe.nn.gmsop`: ``GatedMixtureSOPNet`` (gated mixture of parametric second-order
  pooling and its classifier head), trained by :class:`featpipe.learn.gmsop.GatedMixtureSOP`.

Each module imports torch at the top; nothing else in featpipe imports them at import time
(the encode registry and the estimators load them when a method runs).  Every one is checked
with ``torch.autograd.gradcheck`` in the tests.
"""
