"""featpipe: classical recognition pipelines on video and images.

Extract per-frame features to a store, encode each video or image into one vector,
train kernel SVMs on precomputed kernels and report accuracy.  See README.md.
"""

__version__ = "0.1.0"

#: Version of the on-disk artifact format; part of every stage key.
FORMAT_VERSION = 2
