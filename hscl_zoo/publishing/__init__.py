"""Publishing: what a finished run becomes for others, apart from the loop that trains it.

    hub_folder      the run's Hub-ready folder: weights, config.json with the training summary,
                    model card and metrics.json; rebuilt and pushed by ``hscl-zoo push``
    release         ``hscl-zoo release``: a trained run into a pinned zoo release (cast, sharded,
                    re-evaluated) and its record in the registry's table of releases
    cards           the registry's model cards under model_cards/, written or checked
                    (``python -m hscl_zoo.publishing.cards``; ``hscl-zoo cards``)

A graph run's release is `hscl_zoo.graphs.release`, with the rest of the graph modality. The
training loop calls `hub_folder` at a run's end; nothing here imports the loop.
"""
