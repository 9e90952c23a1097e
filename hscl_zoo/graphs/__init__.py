"""Graphs as a second modality: the paper's Table 2 (TU datasets, a GIN encoder, an SVM).

The data flows as for images: a TU folder becomes a `GraphSet` (`tu`), its nodes get features
(`features`), a GIN encodes nodes and graphs (`encoder`), the local-global objective of the
method table trains it (`objective`, `training`), and an SVM cross-validates the frozen graph
embeddings (`svm`). `catalog` is the table of the five datasets; `protocol` runs the paper's
experiment and the leak-free one. See docs/graphs.md.

The rest of the modality lives here too, so that adding a TU dataset (one `GraphDatasetSpec` in
`catalog`) touches this folder only: `recipe` runs ``hscl-zoo train``, ``eval`` and ``embed`` on
``tu:`` datasets, `release` turns a graph run into a release, `cards` renders a graph encoder's
model card, `summary` and `figures` report the graph table. Those five sit in higher layers than
the rest (docs/architecture.md, "Layers"): they read the registry, the evaluation or the
reproduction's statistics, which the modality's basics never import.
"""
