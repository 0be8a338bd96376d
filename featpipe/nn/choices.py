"""Choices the differentiable functions of :mod:`featpipe.nn.functional` accept.

Torch-free, so that the estimators (:mod:`featpipe.learn`) declare their parameters without
loading torch.
"""

#: ψ of discriminative HRP: ψ(W x) with a smoothed square root (ssr, ser) or tanh.
PSI_CHOICES = ("ssr", "ser", "tanh")
#: The Hessian of the rank-pooling SVR in the argmin's backward pass.
HESSIAN_CHOICES = ("exact", "diagonal")
#: What GM-SOP's gate reads: an SR-SOP of the input (the paper's) or its global average.
GATES = ("sr-sop", "average")
