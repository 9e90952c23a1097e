"""Graphs as a second modality: the paper's Table 2 (TU datasets, a GIN encoder, an SVM).

The data flows as for images: a TU folder becomes a `GraphSet` (`tu`), its nodes get features
(`features`), a GIN encodes nodes and graphs (`encoder`), the local-global objective of the
method table trains it (`objective`, `training`), and an SVM cross-validates the frozen graph
embeddings (`svm`). `catalog` is the table of the five datasets; `protocol` runs the paper's
experiment and the leak-free one. See docs/graphs.md.
"""
